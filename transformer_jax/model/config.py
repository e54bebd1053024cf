"""``TransformerConfig``: one frozen dataclass passed to every module (defaults: paper base)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from transformer_jax.options import (
    ATTENTION_IMPLS,
    CUDA_PLATFORMS,
    KERNELS,
    MATMUL_PRECISIONS,
    PLATFORMS,
    resolve,
)

NORMS = ("post", "pre")
POSITIONALS = ("sinusoidal", "learned", "none")
REMATS = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of the encoder-decoder Transformer.

    Defaults are the paper's base model (Table 3, "base"): d_model 512, 8 heads of
    d_k = d_v = 64, d_ff 2048, 6 + 6 layers, residual dropout 0.1, post-LN, sinusoidal
    positions, one shared 37,000-token vocabulary with tied embedding and pre-softmax
    weights (§3.4). Deviations used by later work are switches: ``norm='pre'``,
    ``positional='learned'``, ``attention_bias``, ``final_norm``, ``layer_norm_eps`` (those
    of ``torch.nn.Transformer``: :mod:`transformer_jax.interop.torch`),
    ``attention_impl='fused'`` (``'cudnn'`` on GPU),
    ``dtype=bfloat16`` (or only the matrix products' operands: ``matmul_precision``,
    :mod:`transformer_jax.kernels.precision`); ``scan_layers=True`` compiles each stack's
    layer once (its parameters are then stacked under ``layers`` instead of ``layer_0`` ...
    ``layer_{N-1}``); ``remat`` recomputes each layer's activations in the backward pass
    instead of keeping them (``'full'``, or a :data:`jax.checkpoint_policies` name: what it
    keeps), the same gradients.
    With shared embeddings, ``tgt_vocab_size`` below ``vocab_size`` makes the target side's
    pieces the shared vocabulary's first ``tgt_vocab_size``: the decoder reads and predicts
    only those rows (the tokenizer numbers pieces by target frequency for it).

    ``platform`` is the platform the program is for ('auto': JAX's default backend; a
    program lowered or exported for another platform names it); ``kernels`` picks the kernel set
    (:mod:`transformer_jax.kernels`): 'auto' is 'cpu' on the CPU platform and 'xla'
    elsewhere, the same values either way.
    Variants are made with ``config.replace(decode=True)``.
    """

    vocab_size: int = 37000
    src_vocab_size: int | None = None  # None: the shared vocab_size (paper)
    tgt_vocab_size: int | None = None  # None: vocab_size; shared: the first this many pieces
    d_model: int = 512
    num_heads: int = 8
    qk_dim: int | None = None  # d_k per head; None: d_model // num_heads
    v_dim: int | None = None  # d_v per head; None: d_model // num_heads
    d_ff: int = 2048
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    dropout_rate: float = 0.1  # P_drop: sub-layer outputs and embeddings + positions (§5.4)
    attention_dropout_rate: float = 0.0  # not in the paper; tensor2tensor used 0.1 later
    word_dropout_rate: float = 0.0  # not in the paper: whole input tokens' embeddings zeroed
    max_len: int = 512
    positional: str = "sinusoidal"  # 'none': no added positions (e.g. a RoPE or ALiBi score_fn)
    norm: str = "post"
    final_norm: bool | None = None  # a LayerNorm ending each stack; None: with norm='pre' only
    layer_norm_eps: float = 1e-6  # LayerNorm's epsilon (torch.nn.Transformer: 1e-5)
    attention_bias: bool = False  # biases on Q, K, V and W^O: not in the paper (torch: True)
    ffn_bias: bool = True  # b1 and b2 of Eq. 2
    share_embeddings: bool = True  # one source/target embedding matrix (§3.4)
    tie_output: bool = True  # pre-softmax linear = target embedding^T (§3.4)
    pad_id: int = 0
    dtype: Any = jnp.float32  # compute dtype; softmax, LayerNorm stats and loss stay float32
    param_dtype: Any = jnp.float32
    matmul_precision: str = "float32"  # 'float32' (paper) | 'tf32' | 'bfloat16' operands
    attention_impl: str = "reference"
    decode: bool = False  # incremental decoding over the KV cache
    sow_attention_weights: bool = False  # store weights in the 'intermediates' collection
    scan_layers: bool = False  # nn.scan over each stack: compile one layer, params stacked
    remat: str = "none"  # recompute each layer in the backward pass: 'full' or a checkpoint policy
    kernels: str = "auto"  # 'auto' | 'xla' | 'cpu' (transformer_jax.kernels)
    platform: str = "auto"  # the target: 'cpu' | 'gpu' | 'cuda' | 'rocm' | 'tpu'

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "num_heads", "d_ff", "max_len"):
            _positive(name, getattr(self, name))
        for name in ("num_encoder_layers", "num_decoder_layers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {getattr(self, name)!r}")
        for name in ("src_vocab_size", "tgt_vocab_size", "qk_dim", "v_dim"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if (self.qk_dim is None or self.v_dim is None) and self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} must be divisible by num_heads={self.num_heads} "
                "unless qk_dim and v_dim are both set"
            )
        for name in ("dropout_rate", "attention_dropout_rate", "word_dropout_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {rate!r}")
        _choice("norm", self.norm, NORMS)
        _choice("final_norm", self.final_norm, (None, True, False))
        for name in ("attention_bias", "ffn_bias"):
            _choice(name, getattr(self, name), (True, False))
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps > 0:
            raise ValueError(f"layer_norm_eps must be a positive number, got {eps!r}")
        _choice("remat", self.remat, REMATS)
        _choice("positional", self.positional, POSITIONALS)
        _choice("attention_impl", self.attention_impl, ATTENTION_IMPLS)
        _choice("matmul_precision", self.matmul_precision, MATMUL_PRECISIONS)
        _choice("kernels", self.kernels, KERNELS)
        _choice("platform", self.platform, PLATFORMS)
        if self.attention_impl == "cudnn":
            if self.platform not in (*CUDA_PLATFORMS, "auto"):
                raise ValueError(
                    f"attention_impl='cudnn' needs platform 'gpu' or 'cuda', got "
                    f"{self.platform!r} (use attention_impl='fused' elsewhere)"
                )
            half = jnp.dtype(self.dtype) in (jnp.bfloat16, jnp.float16)
            if not (half or self.matmul_precision == "bfloat16"):
                raise ValueError(
                    "attention_impl='cudnn' needs dtype bfloat16 or float16 (or "
                    f"matmul_precision='bfloat16'), got dtype {jnp.dtype(self.dtype).name}"
                )
        if self.attention_impl != "reference" and (
            self.attention_dropout_rate > 0 or self.sow_attention_weights
        ):
            raise ValueError(
                f"attention_impl={self.attention_impl!r} computes no explicit weights: it needs "
                "attention_dropout_rate=0 and sow_attention_weights=False"
            )
        if self.share_embeddings and self.src_vocab < self.tgt_vocab:
            raise ValueError(
                "share_embeddings=True needs tgt_vocab_size <= src_vocab_size (the target "
                f"side's pieces are the first of the shared ones), got {self.tgt_vocab} and "
                f"{self.src_vocab}"
            )
        if not 0 <= self.pad_id < min(self.src_vocab, self.tgt_vocab):
            raise ValueError(f"pad_id must be a token id in [0, vocab), got {self.pad_id}")

    @property
    def src_vocab(self) -> int:
        return self.src_vocab_size or self.vocab_size

    @property
    def tgt_vocab(self) -> int:
        return self.tgt_vocab_size or self.vocab_size

    @property
    def uses_final_norm(self) -> bool:
        """Whether each stack ends in a LayerNorm: ``final_norm``, else only with pre-LN."""
        return self.norm == "pre" if self.final_norm is None else self.final_norm

    @property
    def target_platform(self) -> str:
        """``platform``, or JAX's default backend where it is 'auto'."""
        return jax.default_backend() if self.platform == "auto" else self.platform

    @property
    def kernel_set(self) -> str:
        """The kernel set the model runs with: 'xla' or 'cpu'."""
        return resolve(self.kernels, self.target_platform)

    @property
    def head_qk_dim(self) -> int:
        """d_k."""
        return self.qk_dim or self.d_model // self.num_heads

    @property
    def head_v_dim(self) -> int:
        """d_v."""
        return self.v_dim or self.d_model // self.num_heads

    def replace(self, **changes: Any) -> TransformerConfig:
        return dataclasses.replace(self, **changes)


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def to_dtype(name: str | Any) -> Any:
    """'float32' | 'bfloat16' | 'float16' (or a dtype) -> a jnp dtype."""
    if not isinstance(name, str):
        return name
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {name!r}")
    return DTYPES[name]


def from_config_dict(model: Any) -> TransformerConfig:
    """Build a ``TransformerConfig`` from the ``model`` part of an ml_collections config.

    Unknown keys raise ``ValueError`` naming them and the allowed fields.
    """
    values = dict(model.to_dict() if hasattr(model, "to_dict") else model)
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"unknown model config fields {unknown}; allowed: {sorted(fields)}")
    for key in ("dtype", "param_dtype"):
        if key in values:
            values[key] = to_dtype(values[key])
    return TransformerConfig(**values)
