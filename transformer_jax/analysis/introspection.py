"""Every layer's and head's attention weights, as plain arrays, for research code.

``TransformerConfig(sow_attention_weights=True)`` makes each ``MultiHeadAttention`` sow its
softmax(Q K^T / sqrt(d_k)) weights ``[batch, heads, q_len, kv_len]`` (paper Eq. 1) into
the ``'intermediates'`` collection; :func:`attention_maps` runs the model that way and
arranges them by layer.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.transformer import Transformer


def attention_maps(
    config: TransformerConfig,
    params: Any,
    src: jax.Array,
    tgt_in: jax.Array,
    *,
    src_segments: jax.Array | None = None,
    tgt_segments: jax.Array | None = None,
    src_positions: jax.Array | None = None,
    tgt_positions: jax.Array | None = None,
) -> dict[str, list[np.ndarray]]:
    """Attention weights of every layer and head for one (deterministic) forward pass.

    Args:
      config: the model's configuration; it is run with ``sow_attention_weights=True``,
        ``decode=False`` and the reference attention (``'fused'`` computes the same
        function without materialising the weights).
      params: the model's parameters (``variables['params']``, or ``variables`` itself).
      src: int ``[batch, src_len]``; tgt_in: int ``[batch, tgt_len]`` (BOS + target).

    Returns:
      ``{'encoder': [num_encoder_layers x [B, H, S, S]],
      'decoder_self': [num_decoder_layers x [B, H, T, T]],
      'cross': [num_decoder_layers x [B, H, T, S]]}``, float32 numpy arrays whose rows
      sum to 1 over the keys a query may attend to (padding keys and, in the decoder,
      future positions get weight 0).
    """
    cfg = config.replace(sow_attention_weights=True, decode=False, attention_impl="reference")
    variables = {"params": params.get("params", params) if hasattr(params, "get") else params}
    sown = _sown_weights(
        cfg, variables, src, tgt_in, src_segments, tgt_segments, src_positions, tgt_positions
    )

    def layer(stack: str, i: int, name: str) -> np.ndarray:
        if cfg.scan_layers:  # one array with a leading layer axis
            return np.asarray(sown[stack]["layers"][name]["attention_weights"][0][i])
        return np.asarray(sown[stack][f"layer_{i}"][name]["attention_weights"][0])

    return {
        "encoder": [layer("encoder", i, "self_attention") for i in range(cfg.num_encoder_layers)],
        "decoder_self": [
            layer("decoder", i, "self_attention") for i in range(cfg.num_decoder_layers)
        ],
        "cross": [layer("decoder", i, "cross_attention") for i in range(cfg.num_decoder_layers)],
    }


@functools.partial(jax.jit, static_argnums=0)
def _sown_weights(config: TransformerConfig, variables: Any, *inputs: jax.Array | None) -> Any:
    """The forward pass of ``config`` (jit-compiled), returning its ``'intermediates'``."""
    src, tgt_in, src_segments, tgt_segments, src_positions, tgt_positions = inputs
    _, state = Transformer(config).apply(
        variables,
        src,
        tgt_in,
        src_segments=src_segments,
        tgt_segments=tgt_segments,
        src_positions=src_positions,
        tgt_positions=tgt_positions,
        deterministic=True,
        mutable=["intermediates"],
    )
    return state["intermediates"]
