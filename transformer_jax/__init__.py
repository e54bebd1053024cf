"""transformer_jax: the Transformer of "Attention Is All You Need" in JAX/Flax."""

from transformer_jax.attention import (
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from transformer_jax.config import TransformerConfig
from transformer_jax.embeddings import sinusoidal_positions
from transformer_jax.model import Decoder, Encoder, Transformer

__all__ = [
    "Decoder",
    "Encoder",
    "MultiHeadAttention",
    "Transformer",
    "TransformerConfig",
    "causal_mask",
    "padding_mask",
    "scaled_dot_product_attention",
    "sinusoidal_positions",
]
__version__ = "0.1.0"
