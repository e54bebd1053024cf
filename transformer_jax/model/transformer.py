"""The encoder-decoder Transformer (paper §3, Figure 1).

``Transformer(config).apply(params, src, tgt_in)`` gives next-token logits
``[batch, tgt_len, tgt_vocab]``; ``encode`` and ``decode`` are its two halves, the
latter also run one position at a time over the KV cache (``config.decode=True``).
Optional ``*_segments`` / ``*_positions`` describe packed sequences (segment 0 = pad).

The layers' pieces are module attributes (Flax style: pass a module class or a callable):
``Transformer(config, ffn=..., norm=..., score_fn=..., attention=...)``, else the ones
``config`` names (``ffn``, ``norm_type``, ``positional``, ``attention``; the paper's by
default); both go through :mod:`transformer_jax.model.registry`, which checks them against the
config by the same rules and says what a score hook adds to the embeddings (RoPE, ALiBi:
nothing). ``encoder_layer`` / ``decoder_layer`` (``layer`` on :class:`Encoder` /
:class:`Decoder`) give a whole layer class, made as ``layer(config, ffn=, norm=, score_fn=,
attention=)`` (:mod:`transformer_jax.model.layers`, :mod:`transformer_jax.model.variants`).
``inputs_embeds`` (``src_embeds`` / ``tgt_embeds``) feed embeddings in place of the ids'; each
layer sows its output as ``hidden_state`` (and each stack its input as ``embedded``) into the
``'intermediates'`` collection when it is mutable. ``check_ids=True`` checks ids under jit
with :mod:`jax.experimental.checkify`; eager (concrete) ids are always checked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax import kernels
from transformer_jax.model import registry
from transformer_jax.model.attention import ScoreFn, Where
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.embeddings import AddPositions, Embed, check_tokens
from transformer_jax.model.layers import (
    FFN,
    Attention,
    DecoderLayer,
    Dropout,
    EncoderLayer,
    Norm,
    sow_hidden,
)
from transformer_jax.model.masks import padding_mask, segment_mask
from transformer_jax.model.partitioning import LAYERS, constrain, logical

Array = jax.Array

__all__ = ["Decoder", "Encoder", "Transformer", "TransformerConfig"]


def _embed(config: TransformerConfig, vocab_size: int, name: str) -> Embed:
    return Embed(
        vocab_size,
        config.d_model,
        config.dtype,
        config.param_dtype,
        config.matmul_precision,
        config.kernel_set,
        name=name,
    )


def remat(config: TransformerConfig, layer: Any, deterministic_argnum: int) -> Any:
    """``layer`` (a module class) recomputed in the backward pass as ``config.remat`` says;
    ``deterministic_argnum``: the position of its ``deterministic`` argument (self is 0)."""
    if config.remat == "none":
        return layer
    policy = None if config.remat == "full" else getattr(jax.checkpoint_policies, config.remat)
    return nn.remat(
        layer,
        policy=policy,
        static_argnums=(deterministic_argnum,),
        prevent_cse=not config.scan_layers,  # a scan's loop already keeps XLA from merging
    )


def _pieces(module: Encoder | Decoder) -> tuple[dict[str, Any], str]:
    """The layers' pieces (``ffn``, ``norm``, ``score_fn``, ``attention``: the module's, else
    the config's named ones), checked against the config, and the positions to add."""
    given = {name: getattr(module, name) for name in registry.ATTRIBUTES.values()}
    pieces = registry.resolve(module.config, given)
    built = {registry.ATTRIBUTES[kind]: piece.build for kind, piece in pieces.items()}
    return built, pieces["positional"].adds


def _where(positions: Array | None, segments: Array | None, length: int) -> Where:
    """The absolute positions (default 0..length-1) and segments a score hook sees."""
    positions = jnp.arange(length)[None] if positions is None else positions
    return Where(positions, positions, segments, segments)


def word_dropout(cfg: TransformerConfig, embedded: Array, deterministic: bool) -> Array:
    """Zero each token's embedding with probability ``cfg.word_dropout_rate`` and scale the
    kept ones by ``1 / (1 - rate)``, before positions are added: the word dropout of Sennrich &
    Zhang (2019) and Gal & Ghahramani (2016); not in the paper."""
    if cfg.word_dropout_rate == 0.0:
        return embedded
    return Dropout(cfg.word_dropout_rate, cfg.kernel_set, whole_vectors=True, name="word_dropout")(
        embedded, deterministic
    )


class Encoder(nn.Module):
    """Embedding * sqrt(d_model) + positions, dropout, N encoder layers (§3.1).

    ``inputs_embeds`` ``[batch, src_len, d_model]`` replaces ``embed(src)``; ``src`` (or
    ``segments``) then only gives the padding mask and may be ``None`` (no padding).
    """

    config: TransformerConfig
    embed: Embed | None = None  # shared embedding; a fresh one when None
    layer: Callable[..., nn.Module] = EncoderLayer
    ffn: FFN | None = None  # None: the one config names (module doc)
    norm: Norm | None = None
    score_fn: ScoreFn | None = None
    attention: Attention | None = None
    check_ids: bool = False

    @nn.compact
    def __call__(
        self,
        src: Array | None,
        segments: Array | None = None,
        positions: Array | None = None,
        deterministic: bool = True,
        inputs_embeds: Array | None = None,
    ) -> Array:
        cfg = self.config
        if src is not None:
            check_tokens("src", src, cfg.src_vocab, self.check_ids)
        pieces, adds = _pieces(self)
        embed = self.embed or _embed(cfg, cfg.src_vocab, "embed")
        x = embed(src) if inputs_embeds is None else inputs_embeds
        x = AddPositions(cfg.max_len, adds, param_dtype=cfg.param_dtype, name="positions")(
            word_dropout(cfg, x, deterministic), positions
        )
        x = Dropout(cfg.dropout_rate, cfg.kernel_set)(x, deterministic)
        sow_hidden(self, "embedded", x)
        mask = None if src is None and segments is None else encoder_mask(src, cfg.pad_id, segments)
        where = None if pieces["score_fn"] is None else _where(positions, segments, x.shape[1])
        layer = remat(cfg, self.layer, 3)  # (self, x, mask, deterministic, where)
        make = functools.partial(layer, cfg, **pieces)
        x = layer_stack(cfg, make, cfg.num_encoder_layers, x, mask, deterministic, where)
        if cfg.uses_final_norm:
            x = pieces["norm"](cfg, name="final_norm")(x)
        return x


class Decoder(nn.Module):
    """Masked decoder stack and output projection to logits (§3.1, §3.4).

    With ``encoded=None`` it is a decoder-only language model (no cross-attention).
    ``inputs_embeds`` ``[batch, tgt_len, d_model]`` replaces ``embed(tgt_in)``; ``tgt_in``
    then only gives the padding mask and may be ``None``. Pieces: as :class:`Encoder`.
    """

    config: TransformerConfig
    embed: Embed | None = None
    layer: Callable[..., nn.Module] = DecoderLayer
    ffn: FFN | None = None  # None: the one config names (module doc)
    norm: Norm | None = None
    score_fn: ScoreFn | None = None
    attention: Attention | None = None
    check_ids: bool = False

    @nn.compact
    def __call__(
        self,
        tgt_in: Array | None,
        encoded: Array | None = None,
        src: Array | None = None,
        *,
        src_segments: Array | None = None,
        tgt_segments: Array | None = None,
        tgt_positions: Array | None = None,
        deterministic: bool = True,
        inputs_embeds: Array | None = None,
    ) -> Array:
        cfg = self.config
        if tgt_in is not None:
            check_tokens("tgt_in", tgt_in, cfg.tgt_vocab, self.check_ids)
        pieces, adds = _pieces(self)
        embed = self.embed or _embed(cfg, cfg.tgt_vocab, "embed")
        x = embed(tgt_in) if inputs_embeds is None else inputs_embeds
        x = AddPositions(
            cfg.max_len,
            adds,
            decode=cfg.decode,
            param_dtype=cfg.param_dtype,
            name="positions",
        )(word_dropout(cfg, x, deterministic), tgt_positions)
        x = Dropout(cfg.dropout_rate, cfg.kernel_set)(x, deterministic)
        sow_hidden(self, "embedded", x)

        if cfg.decode or (tgt_in is None and tgt_segments is None):
            self_mask = None  # decoding: the cache supplies causality, one position per call
        elif tgt_segments is None:
            self_mask = padding_mask(tgt_in, cfg.pad_id)  # the layers add the causal mask
        else:
            self_mask = segment_mask(tgt_segments, tgt_segments)
        cross_mask = None
        if encoded is not None:
            if src is None:
                raise ValueError("decoding against `encoded` needs `src` token ids for its mask")
            cross_mask = cross_attention_mask(src, cfg.pad_id, src_segments, tgt_segments)
        where = None
        if pieces["score_fn"] is not None:
            where = _where(tgt_positions, tgt_segments, x.shape[1])
        layer = remat(cfg, self.layer, 5)  # (self, x, self_mask, encoded, cross_mask, det., where)
        make = functools.partial(layer, cfg, **pieces)
        x = layer_stack(
            cfg,
            make,
            cfg.num_decoder_layers,
            x,
            self_mask,
            encoded,
            cross_mask,
            deterministic,
            where,
        )
        if cfg.uses_final_norm:
            x = pieces["norm"](cfg, name="final_norm")(x)

        if cfg.tie_output:
            logits = embed.attend(x, cfg.tgt_vocab)
        else:
            logits = nn.Dense(
                cfg.tgt_vocab,
                dtype=cfg.dtype,
                param_dtype=cfg.param_dtype,
                dot_general=kernels.ops(cfg.kernel_set).dot_general(cfg.matmul_precision),
                kernel_init=logical(nn.initializers.lecun_normal(), ("embed", "vocab")),
                bias_init=logical(nn.initializers.zeros_init(), ("vocab",)),
                name="logits",
            )(x)
        logits = constrain(logits, ("activation_batch", "activation_length", "activation_vocab"))
        return logits.astype(jnp.float32)


def layer_stack(
    config: TransformerConfig,
    make_layer: Callable[..., nn.Module],
    count: int,
    x: Array,
    *args: Any,
) -> Array:
    """``count`` identical layers ``make_layer(name=...)`` applied in turn to ``x`` (each also
    given ``args``).

    Unrolled, layer i is the module ``layer_{i}``. With ``config.scan_layers`` they are one
    ``nn.scan`` named ``layers``: parameters (and KV caches, sown weights) are stacked on
    a leading layer axis (logical name ``layers``) and XLA compiles the layer once instead of
    ``count`` times. Each layer's input and output are constrained to the activations'
    logical sharding (:func:`~transformer_jax.model.partitioning.constrain`).
    """
    x = constrain(x)
    if not config.scan_layers:
        for i in range(count):
            x = constrain(make_layer(name=f"layer_{i}")(x, *args))
        return x
    if count == 0:
        return x
    scan = nn.scan(
        _apply_layer,
        variable_axes={"params": 0, "cache": 0, "intermediates": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=nn.broadcast,
        length=count,
        metadata_params={nn.PARTITION_NAME: LAYERS},
    )
    return scan(make_layer(name="layers"), x, *args)[0]


def _apply_layer(layer: nn.Module, x: Array, *args: Any) -> tuple[Array, None]:
    return constrain(layer(x, *args)), None


def encoder_mask(src: Array, pad_id: int, segments: Array | None = None) -> Array:
    """Encoder self-attention mask: non-pad keys (within the same packed segment)."""
    if segments is not None:
        return segment_mask(segments, segments)
    return padding_mask(src, pad_id)


def cross_attention_mask(
    src: Array, pad_id: int, src_segments: Array | None = None, tgt_segments: Array | None = None
) -> Array:
    """Decoder-to-encoder mask: non-pad source keys (of the same packed segment)."""
    if src_segments is not None and tgt_segments is not None:
        return segment_mask(tgt_segments, src_segments)
    return padding_mask(src, pad_id)


class Transformer(nn.Module):
    """The encoder-decoder model of Figure 1.

    ``share_embeddings`` uses one matrix for source and target embeddings, and
    ``tie_output`` reuses the target embedding as the pre-softmax weights (§3.4). The pieces
    (module doc) are given to both stacks.
    """

    config: TransformerConfig
    encoder_layer: Callable[..., nn.Module] = EncoderLayer
    decoder_layer: Callable[..., nn.Module] = DecoderLayer
    ffn: FFN | None = None  # None: the one config names (module doc)
    norm: Norm | None = None
    score_fn: ScoreFn | None = None
    attention: Attention | None = None
    check_ids: bool = False

    def setup(self) -> None:
        cfg = self.config
        if cfg.share_embeddings:
            shared = _embed(cfg, cfg.src_vocab, "shared_embed")
            src_embed, tgt_embed = shared, shared
        else:
            src_embed = _embed(cfg, cfg.src_vocab, "src_embed")
            tgt_embed = _embed(cfg, cfg.tgt_vocab, "tgt_embed")
        pieces = {name: getattr(self, name) for name in registry.ATTRIBUTES.values()}
        pieces["check_ids"] = self.check_ids
        self.encoder = Encoder(cfg, src_embed, self.encoder_layer, **pieces)
        self.decoder = Decoder(cfg, tgt_embed, self.decoder_layer, **pieces)

    def encode(
        self,
        src: Array,
        src_segments: Array | None = None,
        src_positions: Array | None = None,
        deterministic: bool = True,
        inputs_embeds: Array | None = None,
    ) -> Array:
        """Encoder output ``[batch, src_len, d_model]``."""
        return self.encoder(src, src_segments, src_positions, deterministic, inputs_embeds)

    def decode(
        self,
        encoded: Array,
        src: Array,
        tgt_in: Array,
        src_segments: Array | None = None,
        tgt_segments: Array | None = None,
        tgt_positions: Array | None = None,
        deterministic: bool = True,
        inputs_embeds: Array | None = None,
    ) -> Array:
        """Float32 logits ``[batch, tgt_len, tgt_vocab]`` for the next target token."""
        return self.decoder(
            tgt_in,
            encoded,
            src,
            src_segments=src_segments,
            tgt_segments=tgt_segments,
            tgt_positions=tgt_positions,
            deterministic=deterministic,
            inputs_embeds=inputs_embeds,
        )

    def __call__(
        self,
        src: Array,
        tgt_in: Array,
        src_segments: Array | None = None,
        tgt_segments: Array | None = None,
        src_positions: Array | None = None,
        tgt_positions: Array | None = None,
        deterministic: bool = True,
        *,
        src_embeds: Array | None = None,
        tgt_embeds: Array | None = None,
    ) -> Array:
        """Logits for ``tgt_in`` given ``src``; ``src_embeds`` / ``tgt_embeds``
        ``[batch, length, d_model]`` replace the ids' embeddings (the ids then only give
        the padding masks)."""
        if src.ndim == 2 and tgt_in.ndim == 2 and src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"src and tgt_in batch sizes differ: {src.shape} vs {tgt_in.shape}")
        encoded = self.encode(src, src_segments, src_positions, deterministic, src_embeds)
        return self.decode(
            encoded,
            src,
            tgt_in,
            src_segments,
            tgt_segments,
            tgt_positions,
            deterministic,
            tgt_embeds,
        )


def parameter_shapes(config: TransformerConfig) -> Any:
    """The pytree of the parameters of ``Transformer(config)`` as ``jax.ShapeDtypeStruct``s,
    computed without allocating them."""
    tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    init = lambda src, tgt: Transformer(config).init(jax.random.key(0), src, tgt)  # noqa: E731
    return nn.unbox(jax.eval_shape(init, tokens, tokens)["params"])
