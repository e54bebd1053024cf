"""Every layer's and head's attention weights and hidden states, as plain arrays.

``TransformerConfig(sow_attention_weights=True)`` makes each ``MultiHeadAttention`` sow its
softmax(Q K^T / sqrt(d_k)) weights ``[batch, heads, q_len, kv_len]`` (paper Eq. 1) into
the ``'intermediates'`` collection; :func:`attention_maps` runs the model that way and
arranges them by layer. Each layer also sows its output there: :func:`hidden_states`.
Both take the model (a ``Transformer`` module with its pieces, or a config); the compiled
pass is keyed on the module. Any attention piece that is (or subclasses)
``MultiHeadAttention`` sows its weights, grouped-query ones included (one map per query
head); a custom layer or attention module must sow what is read here (:data:`SOWN`), or
the call names what is missing in one line.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.transformer import Transformer

Model = Transformer | TransformerConfig
SOWN = (
    "each layer sows its output as 'hidden_state' (layers.sow_hidden), and its attention "
    "modules, named 'self_attention' and 'cross_attention', sow their weights "
    "[batch, heads, q_len, kv_len] as 'attention_weights' when config.sow_attention_weights"
)


def attention_maps(
    config: Model,
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
      config: the ``Transformer`` module, or its config (the paper's model); it is run with
        ``sow_attention_weights=True``, ``decode=False`` and the reference attention
        (``'fused'`` computes the same function without materialising the weights).
      params: the model's parameters (``variables['params']``, or ``variables`` itself).
      src: int ``[batch, src_len]``; tgt_in: int ``[batch, tgt_len]`` (BOS + target).

    Returns:
      ``{'encoder': [num_encoder_layers x [B, H, S, S]],
      'decoder_self': [num_decoder_layers x [B, H, T, T]],
      'cross': [num_decoder_layers x [B, H, T, S]]}``, float32 numpy arrays whose rows
      sum to 1 over the keys a query may attend to (padding keys and, in the decoder,
      future positions get weight 0).
    """
    model = _model(config, sow_attention_weights=True, attention_impl="reference")
    cfg = model.config
    inputs = (src, tgt_in, src_segments, tgt_segments, src_positions, tgt_positions)
    sown = _intermediates(model, _variables(params), *inputs)

    def layer(stack: str, i: int, name: str) -> np.ndarray:
        return _layer(sown, stack, cfg.scan_layers, i, name, "attention_weights")

    return {
        "encoder": [layer("encoder", i, "self_attention") for i in range(cfg.num_encoder_layers)],
        "decoder_self": [
            layer("decoder", i, "self_attention") for i in range(cfg.num_decoder_layers)
        ],
        "cross": [layer("decoder", i, "cross_attention") for i in range(cfg.num_decoder_layers)],
    }


def hidden_states(
    config: Model,
    params: Any,
    src: jax.Array,
    tgt_in: jax.Array,
    **packing: jax.Array | None,
) -> dict[str, list[np.ndarray]]:
    """Each stack's input (embeddings + positions) and every layer's output, for one
    deterministic forward pass: ``{'encoder': [num_encoder_layers + 1 x [B, S, d_model]],
    'decoder': [num_decoder_layers + 1 x [B, T, d_model]]}`` (before a pre-LN stack's final
    norm). Arguments as :func:`attention_maps` (``packing``: its segment and position ids).
    """
    model = _model(config)
    cfg = model.config
    keys = ("src_segments", "tgt_segments", "src_positions", "tgt_positions")
    sown = _intermediates(model, _variables(params), src, tgt_in, *map(packing.get, keys))

    def stack(name: str, count: int) -> list[np.ndarray]:
        layers = [
            _layer(sown, name, cfg.scan_layers, i, None, "hidden_state") for i in range(count)
        ]
        return [np.asarray(sown[name]["embedded"][0]), *layers]

    return {
        "encoder": stack("encoder", cfg.num_encoder_layers),
        "decoder": stack("decoder", cfg.num_decoder_layers),
    }


def _model(config: Model, **changes: Any) -> Transformer:
    model = Transformer(config) if isinstance(config, TransformerConfig) else config
    return model.clone(config=model.config.replace(decode=False, **changes))


def _variables(params: Any) -> dict[str, Any]:
    return {"params": params.get("params", params) if hasattr(params, "get") else params}


def _layer(
    sown: Any, stack: str, scanned: bool, i: int, module: str | None, name: str
) -> np.ndarray:
    """Layer ``i``'s sown ``name`` (of its sub-module ``module``) in ``stack``; ValueError
    naming what is missing when a custom piece did not sow it."""
    layer = "layers" if scanned else f"layer_{i}"
    tree = sown.get(stack, {}).get(layer, {})
    tree = tree if module is None else tree.get(module, {})
    if name not in tree:
        where = "/".join((stack, layer, *([module] if module else [])))
        raise ValueError(f"{where} sowed no {name!r}: {SOWN}")
    return np.asarray(tree[name][0][i] if scanned else tree[name][0])


@functools.partial(jax.jit, static_argnums=0)
def _intermediates(model: Transformer, variables: Any, *inputs: jax.Array | None) -> Any:
    """The forward pass of ``model`` (jit-compiled, keyed on the module), returning its
    ``'intermediates'``."""
    src, tgt_in, src_segments, tgt_segments, src_positions, tgt_positions = inputs
    _, state = model.apply(
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
