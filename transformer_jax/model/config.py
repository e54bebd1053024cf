"""``TransformerConfig``: one frozen dataclass passed to every module (defaults: paper base).

It is the ``model`` section of a run's config: each field is declared once here with its
default, check and help (:func:`transformer_jax.fields.setting`). Importing it imports no JAX
or Flax (a command's ``--help`` and a config's field checks read it): a dtype is declared by
name and made JAX's when a config is made, the pieces' names are the registry's
(:mod:`transformer_jax.model.registry`).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable
from typing import Any

from transformer_jax.fields import (
    FLAG,
    Check,
    check_values,
    integer,
    number,
    one_of,
    optional,
    predicate,
    setting,
)
from transformer_jax.model import registry
from transformer_jax.options import (
    ATTENTION_IMPLS,
    CUDA_PLATFORMS,
    KERNELS,
    MATMUL_PRECISIONS,
    PLATFORMS,
    resolve,
)

NORMS = ("post", "pre")
REMATS = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")
DTYPES = ("float32", "bfloat16", "float16")  # the names of jax.numpy's dtypes


def dtype_name(value: Any) -> str | None:
    """'float32' for ``'float32'`` or ``jnp.float32``; None for what is not a dtype."""
    if isinstance(value, str):
        return value
    numpy = sys.modules.get("numpy")  # a dtype that is not a name came from NumPy (or JAX)
    try:
        return None if numpy is None else numpy.dtype(value).name
    except TypeError:
        return None


def jax_dtype(name: str) -> Any:
    """``jnp.float32`` for ``'float32'`` (JAX imported now, where a config is made)."""
    return getattr(importlib.import_module("jax.numpy"), name)


class Registered(Check):
    """The check of a field that names a piece: one of the names registered for its kind
    when the check runs (pieces registered after the field was declared count)."""

    def __init__(self, kind: str) -> None:
        object.__setattr__(self, "kind", kind)

    @property
    def rule(self) -> str:
        return f"one of {registry.names(self.kind)}"

    @property
    def test(self) -> Callable[[Any], bool]:
        return lambda value: isinstance(value, str) and value in registry.names(self.kind)


DTYPE = predicate(f"one of {tuple(DTYPES)}", lambda value: dtype_name(value) in DTYPES)


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

    ``positional``, ``ffn``, ``norm_type`` and ``attention`` name registered pieces
    (:mod:`transformer_jax.model.registry`; the library's in
    :mod:`transformer_jax.model.variants`, e.g. ``positional='rope'``, ``ffn='swiglu'``,
    ``norm_type='rms'``, ``attention='grouped_query'`` with ``num_kv_heads``) for
    ``Transformer``, ``Encoder`` and ``Decoder`` (the layers take theirs as given); a piece
    given to the module wins, checked by the same rules.

    ``platform`` is the platform the program is for ('auto': JAX's default backend; a
    program lowered or exported for another platform names it); ``kernels`` picks the kernel set
    (:mod:`transformer_jax.kernels`): 'auto' is 'cpu' on the CPU platform and 'xla'
    elsewhere, the same values either way.
    Variants are made with ``config.replace(decode=True)``.
    """

    vocab_size: int = setting(
        37000, "shared BPE vocabulary: pieces of both languages (§5.1)", integer(1)
    )
    src_vocab_size: int | None = setting(
        None, "source vocabulary; None: vocab_size (the paper's shared one)", optional(integer(1))
    )
    tgt_vocab_size: int | None = setting(
        None,
        "target vocabulary; None: vocab_size; shared: the first this many pieces",
        optional(integer(1)),
    )
    d_model: int = setting(512, "width of every sub-layer's output (§3.1)", integer(1))
    num_heads: int = setting(8, "h: attention heads (§3.2.2)", integer(1))
    qk_dim: int | None = setting(
        None, "d_k per head; None: d_model // num_heads", optional(integer(1))
    )
    v_dim: int | None = setting(
        None, "d_v per head; None: d_model // num_heads", optional(integer(1))
    )
    d_ff: int = setting(2048, "inner width of the position-wise FFN (§3.3)", integer(1))
    num_encoder_layers: int = setting(6, "N: encoder layers (§3.1)", integer(0))
    num_decoder_layers: int = setting(6, "N: decoder layers (§3.1)", integer(0))
    dropout_rate: float = setting(
        0.1, "P_drop: sub-layer outputs and embeddings + positions (§5.4)", number(0, 1)
    )
    attention_dropout_rate: float = setting(
        0.0, "dropout of the attention weights (not in the paper; tensor2tensor: 0.1)", number(0, 1)
    )
    word_dropout_rate: float = setting(
        0.0, "whole input tokens' embeddings zeroed (not in the paper)", number(0, 1)
    )
    max_len: int = setting(512, "positions the model encodes: the longest sequence", integer(1))
    positional: str = setting(
        "sinusoidal",
        "added: 'sinusoidal' (paper), 'learned', 'none'; in the scores: 'rope', 'alibi'",
        Registered("positional"),
    )
    norm: str = setting("post", "'post': LayerNorm(x + sublayer(x)) (paper); 'pre'", one_of(*NORMS))
    ffn: str = setting(
        "relu",
        "Eq. 2 with 'relu' (paper) or 'gelu'; gated: 'glu', 'geglu', 'swiglu'",
        Registered("ffn"),
    )
    norm_type: str = setting(
        "layer", "'layer': LayerNorm (paper); 'rms': RMSNorm", Registered("norm")
    )
    attention: str = setting(
        "multi_head",
        "'multi_head' (paper); K/V heads shared: 'grouped_query' (num_kv_heads), 'multi_query'",
        Registered("attention"),
    )
    num_kv_heads: int | None = setting(
        None,
        "K/V heads of attention='grouped_query', dividing num_heads; None: num_heads",
        optional(integer(1)),
    )
    final_norm: bool | None = setting(
        None, "a LayerNorm ending each stack; None: with norm='pre' only", optional(FLAG)
    )
    layer_norm_eps: float = setting(
        1e-6, "LayerNorm's epsilon (torch.nn.Transformer: 1e-5)", number(0, low_open=True)
    )
    attention_bias: bool = setting(
        False, "biases on Q, K, V and W^O: not in the paper (torch: True)", FLAG
    )
    ffn_bias: bool = setting(True, "b1 and b2 of Eq. 2", FLAG)
    share_embeddings: bool = setting(True, "one source/target embedding matrix (§3.4)", FLAG)
    tie_output: bool = setting(True, "pre-softmax linear = target embedding^T (§3.4)", FLAG)
    pad_id: int = setting(0, "the padding token's id", integer(0))
    dtype: Any = setting(
        "float32", "compute dtype; softmax, LayerNorm stats and loss stay float32", DTYPE
    )
    param_dtype: Any = setting("float32", "dtype of the parameters and Adam's state", DTYPE)
    matmul_precision: str = setting(
        "float32",
        "products' operands: 'float32' (paper), 'tf32', 'bfloat16'; 'auto': the target's "
        "fastest, chosen at run start",
        one_of("auto", *MATMUL_PRECISIONS),
    )
    attention_impl: str = setting(
        "reference", "'reference' (Eq. 1), 'fused' or 'cudnn' (GPU)", one_of(*ATTENTION_IMPLS)
    )
    decode: bool = setting(False, "incremental decoding over the KV cache", FLAG)
    sow_attention_weights: bool = setting(
        False, "store attention weights in the 'intermediates' collection", FLAG
    )
    scan_layers: bool = setting(
        False, "nn.scan over each stack: compile one layer, parameters stacked", FLAG
    )
    remat: str = setting(
        "none",
        "recompute each layer in the backward pass: 'full' or a checkpoint policy",
        one_of(*REMATS),
    )
    kernels: str = setting(
        "auto",
        "kernel set: 'auto' ('cpu' on the CPU target, else 'xla'), 'xla', 'cpu'",
        one_of(*KERNELS),
    )
    platform: str = setting(
        "auto",
        "the target: 'auto' (JAX's backend), 'cpu', 'gpu', 'cuda', 'rocm', 'tpu'",
        one_of(*PLATFORMS),
    )

    def __post_init__(self) -> None:
        check_values(TransformerConfig, vars(self))
        for name in ("dtype", "param_dtype"):  # a dtype's name, as in a config file
            object.__setattr__(self, name, jax_dtype(dtype_name(getattr(self, name))))
        if (self.qk_dim is None or self.v_dim is None) and self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} must be divisible by num_heads={self.num_heads} "
                "unless qk_dim and v_dim are both set"
            )
        if self.attention_impl == "cudnn":
            if self.platform not in (*CUDA_PLATFORMS, "auto"):
                raise ValueError(
                    f"attention_impl='cudnn' needs platform 'gpu' or 'cuda', got "
                    f"{self.platform!r} (use attention_impl='fused' elsewhere)"
                )
            dtype = dtype_name(self.dtype)
            if not (dtype in ("bfloat16", "float16") or self.matmul_precision == "bfloat16"):
                raise ValueError(
                    "attention_impl='cudnn' needs dtype bfloat16 or float16 (or "
                    f"matmul_precision='bfloat16'), got dtype {dtype}"
                )
        if self.attention_impl != "reference" and (
            self.attention_dropout_rate > 0 or self.sow_attention_weights
        ):
            raise ValueError(
                f"attention_impl={self.attention_impl!r} computes no explicit weights: it needs "
                "attention_dropout_rate=0 and sow_attention_weights=False"
            )
        if self.num_heads % self.kv_heads:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads} "
                "(each K/V head serves a group of query heads)"
            )
        registry.check(self, registry.named(self))
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
        if self.platform != "auto":
            return self.platform
        return importlib.import_module("jax").default_backend()

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

    @property
    def kv_heads(self) -> int:
        """The key/value heads of grouped-query attention: ``num_kv_heads`` or num_heads."""
        return self.num_kv_heads or self.num_heads

    def replace(self, **changes: Any) -> TransformerConfig:
        return dataclasses.replace(self, **changes)
