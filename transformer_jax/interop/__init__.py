"""Parameters of other frameworks' Transformers in and out: :mod:`transformer_jax.interop.torch`
(``torch.nn.Transformer`` state dicts; torch itself is optional)."""

from transformer_jax.interop import torch

__all__ = ["torch"]
