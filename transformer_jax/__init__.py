"""transformer_jax: the Transformer of "Attention Is All You Need" in JAX/Flax."""

from transformer_jax import kernels
from transformer_jax.model.attention import (
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.embeddings import sinusoidal_positions
from transformer_jax.model.transformer import Decoder, Encoder, Transformer

__all__ = [
    "Decoder",
    "Encoder",
    "MultiHeadAttention",
    "Transformer",
    "TransformerConfig",
    "causal_mask",
    "kernels",
    "padding_mask",
    "scaled_dot_product_attention",
    "sinusoidal_positions",
]
__version__ = "0.1.0"
