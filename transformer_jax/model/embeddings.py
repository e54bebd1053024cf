"""Token embeddings, positional encodings (paper §3.4 and §3.5) and the check of the ids
that enter them."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from transformer_jax import kernels as _kernels
from transformer_jax.model.partitioning import constrain, gathered, logical
from transformer_jax.model.registry import ship

Array = jax.Array


def sinusoidal_positions(length: int, d_model: int) -> Array:
    """The paper's positional encoding, float32 ``[length, d_model]`` (§3.5).

    PE(pos, 2i) = sin(pos / 10000^(2i / d_model)), PE(pos, 2i + 1) = cos(same angle):
    sine and cosine interleaved, the fastest-varying pair in columns 0 and 1.
    """
    if length < 0 or d_model <= 0:
        raise ValueError(f"need length >= 0 and d_model > 0, got {length}, {d_model}")
    pos = np.arange(length, dtype=np.float64)[:, None]
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
    angle = pos / np.power(10000.0, two_i / d_model)
    pe = np.zeros((length, d_model), dtype=np.float64)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return jnp.asarray(pe, dtype=jnp.float32)


class Embed(nn.Module):
    """Token embedding multiplied by sqrt(d_model) (§3.4), with ``attend`` for tied logits.

    Initialised N(0, d_model^-0.5) so that the scaled embedding has unit variance. The
    paper shares this matrix between both embedding layers and the pre-softmax linear
    transformation; ``attend(x) = x E^T`` is that transformation (its products at
    ``matmul_precision``, from the kernel set ``kernels``: :mod:`transformer_jax.kernels`).
    """

    vocab_size: int
    d_model: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    matmul_precision: str = "float32"
    kernels: str = "xla"

    def setup(self) -> None:
        self.embedding = self.param(
            "embedding",
            logical(nn.initializers.normal(stddev=self.d_model**-0.5), ("vocab", "embed")),
            (self.vocab_size, self.d_model),
            self.param_dtype,
        )
        # at the compute dtype, converted where it lies, then whole rows on a mesh: the
        # lookups read the table the logits gather (FSDP's all-gather), so no activation
        # moves between devices in the forward pass
        table = constrain(jnp.asarray(self.embedding, self.dtype), ("vocab", "embed"))
        self.table = gathered(table, ("vocab", None))

    def __call__(self, tokens: Array) -> Array:
        return jnp.take(self.table, tokens, axis=0) * jnp.asarray(self.d_model**0.5, self.dtype)

    def attend(self, x: Array, rows: int | None = None) -> Array:
        """Logits ``x E^T`` over the vocabulary, or over its first ``rows`` pieces."""
        table = self.table[:rows]
        return _kernels.ops(self.kernels).tied_logits(x, table, self.matmul_precision)


class AddPositions(nn.Module):
    """Adds sinusoidal (paper) or learned (§3.5, Table 3 row E) position encodings, or none
    (``kind='none'``: positions then come from a score hook such as RoPE or ALiBi).

    ``positions`` gives each token's index explicitly (per-segment positions of packed
    sequences); otherwise positions are 0..length-1. With ``decode=True`` each call is
    one step and the position is read from (and advanced in) the ``cache`` collection.
    """

    max_len: int
    kind: str = "sinusoidal"
    decode: bool = False
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array, positions: Array | None = None) -> Array:
        length, d_model = x.shape[-2], x.shape[-1]
        if self.kind == "none":
            return x
        if self.kind == "sinusoidal":
            table = sinusoidal_positions(self.max_len, d_model)
        else:
            table = self.param(
                "positions",
                logical(nn.initializers.normal(stddev=d_model**-0.5), ("length", "embed")),
                (self.max_len, d_model),
                self.param_dtype,
            )
        if self.decode:
            initialized = self.has_variable("cache", "position")
            index = self.variable("cache", "position", lambda: jnp.array(0, jnp.int32))
            if initialized:
                i = index.value
                index.value = i + 1
                pe = jax.lax.dynamic_slice_in_dim(table, i, 1)[None]
                return x + pe.astype(x.dtype)
        if positions is None:
            if length > self.max_len:
                raise ValueError(f"sequence length {length} exceeds max_len={self.max_len}")
            pe = table[None, :length]
        else:
            pe = jnp.take(table, positions, axis=0)
        return x + pe.astype(x.dtype)


# The config's positional names of the positions AddPositions adds (no score hook).
ship("positional", "sinusoidal", None, adds="sinusoidal")
ship("positional", "learned", None, adds="learned")
ship("positional", "none", None, adds="none")


def check_tokens(name: str, tokens: Array, vocab: int, checked: bool = False) -> None:
    """Integer ``[batch, length]`` ids in ``[0, vocab)``: checked here when concrete, and
    under jit with ``checkify.check`` when ``checked`` (run the function through
    ``checkify.checkify``)."""
    if tokens.ndim != 2:
        raise ValueError(
            f"{name} must be integer token ids [batch, length], got shape {tokens.shape}"
        )
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")
    if not isinstance(tokens, jax.core.Tracer):
        ids = np.asarray(tokens)  # concrete: read on the host, whatever is being traced
        low, high = int(ids.min(initial=0)), int(ids.max(initial=0))
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise ValueError(f"{name} holds id {bad} outside the vocabulary [0, {vocab})")
    elif checked:
        inside = jnp.all((tokens >= 0) & (tokens < vocab))
        checkify.check(inside, f"{name} holds ids outside the vocabulary [0, {vocab})")
