"""transformer_jax: the Transformer of "Attention Is All You Need" in JAX/Flax.

The public API, one import away:

* ``Transformer``, ``TransformerConfig`` (defaults: the paper's base model), ``Encoder``,
  ``Decoder`` (also decoder-only);
* the model's pieces: ``attention`` (Eq. 1, masks, ``MultiHeadAttention``), ``embeddings``
  (scaled embeddings, sinusoidal or learned positions), ``layers`` (``FeedForward``,
  encoder and decoder layers), and ``variants`` beyond the paper for the modules' injection
  points (RoPE, ALiBi, GLU and GELU FFNs, RMSNorm, grouped-query attention), with
  ``variants.register``, which makes a piece of your own a config name;
* ``decoding``: greedy, beam search and sampling over any step function ``(tokens, cache)
  -> (logits, cache)``, and the Transformer's ``greedy_search`` / ``beam_search``;
* ``training``: ``make_batch``, ``create_train_state``, ``train_step`` / ``eval_step``,
  the label-smoothed loss, the paper's optimizer and schedule;
* ``data``: the tokenizer, sources and token-budget batches; ``ids``: PAD, UNK, BOS, EOS;
* ``analysis``: cost estimates, attention maps and hidden states;
* ``kernels``: the backend seam (fast paths chosen by the target platform);
* ``interop``: ``torch.nn.Transformer`` state dicts to and from parameters (``interop.torch``).
"""

# First: the train command's SIGTERM handler, in place before the libraries load.
from transformer_jax import preemption  # noqa: F401

# isort: split
from transformer_jax import analysis, data, ids, interop, kernels, training
from transformer_jax.inference import decoding
from transformer_jax.model import attention, embeddings, layers, variants
from transformer_jax.model.attention import (
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.embeddings import sinusoidal_positions
from transformer_jax.model.layers import FeedForward
from transformer_jax.model.transformer import Decoder, Encoder, Transformer

__all__ = [
    "Decoder",
    "Encoder",
    "FeedForward",
    "MultiHeadAttention",
    "Transformer",
    "TransformerConfig",
    "analysis",
    "attention",
    "causal_mask",
    "data",
    "decoding",
    "embeddings",
    "ids",
    "interop",
    "kernels",
    "layers",
    "padding_mask",
    "scaled_dot_product_attention",
    "sinusoidal_positions",
    "training",
    "variants",
]
__version__ = "0.1.0"
