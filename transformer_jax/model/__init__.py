"""The encoder-decoder of the paper (§3): config, attention, embeddings, layers, the model.

Importing it registers the library's pieces (:mod:`transformer_jax.model.variants`), so that a
``TransformerConfig`` accepts their names wherever it is made.
"""

from transformer_jax.model import embeddings, variants  # noqa: F401
