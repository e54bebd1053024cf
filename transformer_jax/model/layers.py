"""Position-wise feed-forward network and the encoder / decoder layers (paper §3.1, §3.3).

Each sub-layer is wrapped as in §3.1 and §5.4:

- ``norm='post'`` (paper): ``LayerNorm(x + Dropout(Sublayer(x)))``;
- ``norm='pre'`` (Xiong et al. 2020): ``x + Dropout(Sublayer(LayerNorm(x)))``, with a
  final LayerNorm on each stack (``config.final_norm``, applied in
  :mod:`transformer_jax.model.transformer`).

The layers' pieces are module attributes, the paper's by default, each module named by its
role: ``ffn`` (a module class or factory called as ``ffn(config, name='ffn')``), ``norm``
(``norm(config, name='norm')`` in each sub-layer), ``attention``
(``attention(config, causal=..., decode=..., score_fn=..., name=...)``: ``self_attention``,
``cross_attention``) and ``score_fn`` (:data:`transformer_jax.model.attention.ScoreFn`, the
self-attention's scores); :mod:`transformer_jax.model.variants` holds later ones. The paper's
are registered here under the names ``TransformerConfig`` gives them (``ffn='relu'``,
``norm_type='layer'``, ``attention='multi_head'``; :mod:`transformer_jax.model.registry`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax import kernels
from transformer_jax.model.attention import MultiHeadAttention, ScoreFn, Where
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.partitioning import logical
from transformer_jax.model.registry import ship

Array = jax.Array


class LayerNorm(nn.Module):
    """``nn.LayerNorm`` over the last axis (the same parameters, ``scale`` and ``bias``) from
    the kernel set's ``layer_norm`` (:mod:`transformer_jax.kernels.norm`)."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        features = (x.shape[-1],)
        scale = self.param(
            "scale", logical(nn.initializers.ones, ("embed",)), features, cfg.param_dtype
        )
        bias = self.param(
            "bias", logical(nn.initializers.zeros, ("embed",)), features, cfg.param_dtype
        )
        norm = kernels.ops(cfg.kernel_set).layer_norm
        return norm(x, scale, bias, cfg.layer_norm_eps, cfg.dtype)


def layer_norm(config: TransformerConfig, name: str | None = None) -> nn.Module:
    """LayerNorm with float32 statistics whatever the compute dtype: the kernel set's, else
    flax's ``nn.LayerNorm``."""
    if kernels.ops(config.kernel_set).layer_norm is not None:
        return LayerNorm(config, name=name)
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        scale_init=logical(nn.initializers.ones, ("embed",)),
        bias_init=logical(nn.initializers.zeros, ("embed",)),
        name=name,
    )


def sow_hidden(module: nn.Module, name: str, x: Array) -> None:
    """Keep ``x`` in the ``'intermediates'`` collection when it is mutable (not at init: the
    variables ``init`` returns are the parameters)."""
    if not module.is_initializing():
        module.sow("intermediates", name, x)


class Dropout(nn.Module):
    """Dropout (§5.4) with a key from the ``'dropout'`` RNG stream, like ``nn.Dropout``;
    ``kernels``: the kernel set that draws the bits (:mod:`transformer_jax.kernels`).
    ``whole_vectors``: one draw per vector of the last axis, which is zeroed or scaled whole
    (word dropout on embeddings)."""

    rate: float
    kernels: str = "xla"
    whole_vectors: bool = False

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        if deterministic or self.rate == 0.0:
            return x
        dropout = kernels.ops(self.kernels).dropout
        rng = self.make_rng("dropout")
        if self.whole_vectors:
            return x * dropout(jnp.ones((*x.shape[:-1], 1), x.dtype), self.rate, rng)
        return dropout(x, self.rate, rng)


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, d_model -> d_ff -> d_model (Eq. 2);
    ``activation`` replaces max(0, .) (e.g. ``jax.nn.gelu``); ``config.ffn_bias=False``
    drops b1 and b2."""

    config: TransformerConfig
    activation: Callable[[Array], Array] = nn.relu

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        w1 = dense(cfg, cfg.d_ff, "w1", use_bias=cfg.ffn_bias, axes=("embed", "mlp"))
        w2 = dense(cfg, x.shape[-1], "w2", use_bias=cfg.ffn_bias, axes=("mlp", "embed"))
        return w2(self.activation(w1(x)))


def dense(
    config: TransformerConfig,
    features: int,
    name: str,
    use_bias: bool = True,
    *,
    axes: tuple[str, str],
) -> nn.Dense:
    """A Dense layer with the model's dtypes, Xavier initialisation and matrix products;
    ``axes``: the logical names of its kernel's (input, output) axes."""
    return nn.Dense(
        features,
        use_bias=use_bias,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        kernel_init=logical(nn.initializers.xavier_uniform(), axes),
        bias_init=logical(nn.initializers.zeros_init(), axes[1:]),
        dot_general=kernels.ops(config.kernel_set).dot_general(config.matmul_precision),
        name=name,
    )


def multi_head_attention(
    config: TransformerConfig,
    *,
    causal: bool = False,
    decode: bool = False,
    score_fn: ScoreFn | None = None,
    name: str,
    module: type[MultiHeadAttention] = MultiHeadAttention,
    **options: Any,
) -> MultiHeadAttention:
    """The paper's multi-head attention, sized by ``config`` (the attention piece
    ``'multi_head'``); ``module``: a subclass made the same way, given ``options``."""
    return module(
        num_heads=config.num_heads,
        qk_dim=config.head_qk_dim,
        v_dim=config.head_v_dim,
        dropout_rate=config.attention_dropout_rate,
        impl=config.attention_impl,
        decode=decode,
        sow_weights=config.sow_attention_weights,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        matmul_precision=config.matmul_precision,
        causal=causal,
        kernels=config.kernel_set,
        score_fn=score_fn,
        use_bias=config.attention_bias,
        name=name,
        **options,
    )


def _paper_heads(config: TransformerConfig) -> str | None:
    if config.num_kv_heads not in (None, config.num_heads):
        return (
            f"has num_heads K/V heads: num_kv_heads={config.num_kv_heads} needs "
            "attention='grouped_query'"
        )
    return None


Norm = Callable[..., nn.Module]  # norm(config, name=...) -> a module normalising the last axis
FFN = Callable[..., nn.Module]  # ffn(config, name='ffn') -> a module d_model -> d_model
Attention = Callable[..., nn.Module]  # attention(config, *, causal, decode, score_fn, name)
ship("ffn", "relu", FeedForward)
ship("norm", "layer", layer_norm)
ship("attention", "multi_head", multi_head_attention, needs=_paper_heads)


class SubLayer(nn.Module):
    """Residual connection, dropout and ``norm`` (LayerNorm by default; the module ``norm``)
    around one sub-layer (§3.1, §5.4)."""

    config: TransformerConfig
    norm: Norm = layer_norm

    @nn.compact
    def __call__(self, x: Array, sublayer: Callable[[Array], Array], deterministic: bool) -> Array:
        dropout = Dropout(self.config.dropout_rate, self.config.kernel_set)
        norm = self.norm(self.config, name="norm")
        if self.config.norm == "pre":
            return x + dropout(sublayer(norm(x)), deterministic)
        return norm(x + dropout(sublayer(x), deterministic))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped by :class:`SubLayer` (§3.1).

    ``where``: the tokens' positions and segments, for ``score_fn``."""

    config: TransformerConfig
    ffn: FFN = FeedForward
    norm: Norm = layer_norm
    score_fn: ScoreFn | None = None
    attention: Attention = multi_head_attention

    @nn.compact
    def __call__(
        self,
        x: Array,
        mask: Array | None,
        deterministic: bool = True,
        where: Where | None = None,
    ) -> Array:
        cfg = self.config
        self_attention = self.attention(cfg, score_fn=self.score_fn, name="self_attention")
        x = SubLayer(cfg, self.norm, name="attention_block")(
            x,
            lambda h: self_attention(h, mask=mask, deterministic=deterministic, where=where),
            deterministic,
        )
        x = SubLayer(cfg, self.norm, name="ffn_block")(x, self.ffn(cfg, name="ffn"), deterministic)
        sow_hidden(self, "hidden_state", x)
        return x


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward (§3.1).

    ``self_mask`` is the target's padding (or segment) mask; the self-attention adds the
    causal mask itself. With ``encoded=None`` the cross-attention sub-layer is absent (a
    decoder-only stack). With ``config.decode`` the self-attention runs over its KV cache,
    one position a call. ``attention`` makes both attentions; ``score_fn`` is the
    self-attention's (the cross-attention keeps the paper's scores); ``where``: the target
    tokens' positions and segments, for it.
    """

    config: TransformerConfig
    ffn: FFN = FeedForward
    norm: Norm = layer_norm
    score_fn: ScoreFn | None = None
    attention: Attention = multi_head_attention

    @nn.compact
    def __call__(
        self,
        x: Array,
        self_mask: Array | None,
        encoded: Array | None = None,
        cross_mask: Array | None = None,
        deterministic: bool = True,
        where: Where | None = None,
    ) -> Array:
        cfg = self.config
        self_attention = self.attention(
            cfg, causal=True, decode=cfg.decode, score_fn=self.score_fn, name="self_attention"
        )
        x = SubLayer(cfg, self.norm, name="self_attention_block")(
            x,
            lambda h: self_attention(h, mask=self_mask, deterministic=deterministic, where=where),
            deterministic,
        )
        if encoded is not None:
            cross_attention = self.attention(cfg, name="cross_attention")
            x = SubLayer(cfg, self.norm, name="cross_attention_block")(
                x,
                lambda h: cross_attention(h, encoded, mask=cross_mask, deterministic=deterministic),
                deterministic,
            )
        x = SubLayer(cfg, self.norm, name="ffn_block")(x, self.ffn(cfg, name="ffn"), deterministic)
        sow_hidden(self, "hidden_state", x)
        return x
