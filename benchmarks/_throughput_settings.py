"""train_throughput.py's settings: the model sizes and batches timed, the library options
compared (variants), and the random batch a step runs on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Setting:
    """A model size and the batch it is timed on."""

    model: dict[str, Any]
    batch: int
    src_len: int
    tgt_len: int


SETTINGS = {
    "small": Setting(
        dict(
            vocab_size=8000,
            d_model=256,
            num_heads=4,
            d_ff=1024,
            num_encoder_layers=3,
            num_decoder_layers=3,
        ),
        batch=32,
        src_len=64,
        tgt_len=64,
    ),
    "members": Setting(  # configs/multi30k.py:60x2's models, one per core
        dict(
            vocab_size=8000,
            d_model=128,
            num_heads=4,
            d_ff=256,
            num_encoder_layers=4,
            num_decoder_layers=4,
        ),
        batch=64,
        src_len=64,
        tgt_len=64,
    ),
    "base": Setting(dict(vocab_size=32000), batch=16, src_len=64, tgt_len=64),  # paper base
    # the paper's batches (§5.1: ~25,000 source and 25,000 target tokens), for a GPU
    "base-25k": Setting(dict(vocab_size=32000), batch=392, src_len=64, tgt_len=64),
    "tiny": Setting(  # for the smoke test
        dict(
            vocab_size=64,
            d_model=16,
            num_heads=2,
            d_ff=32,
            num_encoder_layers=1,
            num_decoder_layers=1,
            max_len=16,
        ),
        batch=2,
        src_len=8,
        tgt_len=8,
    ),
}
LABEL_SMOOTHING = 0.1
WARMUP_STEPS = 4000
VARIANTS = {  # library options compared in one process, alternating with each other
    "default": {},  # jit, threefry dropout keys, reference attention: what train.py runs
    "fused": {"model": {"attention_impl": "fused"}},
    "scan": {"model": {"scan_layers": True}},  # nn.scan over each stack's layers
    "bf16": {"model": {"dtype": "bfloat16"}},  # bfloat16 compute, float32 parameters
    "bf16-fused": {"model": {"dtype": "bfloat16", "attention_impl": "fused"}},
    "bf16-matmul": {"model": {"matmul_precision": "bfloat16"}},  # bf16 operands, f32 rest
    "bf16-cudnn": {"model": {"dtype": "bfloat16", "attention_impl": "cudnn"}},  # GPU only
    "rbg": {"rng_impl": "rbg"},  # dropout masks from XLA's RngBitGenerator
    "unsafe_rbg": {"rng_impl": "unsafe_rbg"},
    "no-dropout": {"model": {"dropout_rate": 0.0}},  # not a training setting: RNG cost bound
    "target-5120": {"model": {"tgt_vocab_size": 5120}},  # targets: the first 5,120 pieces
    "pmap": {"parallel": "pmap"},  # the training loop's pmap strategy
    "shard_map": {"parallel": "shard_map"},
}


def random_batch(
    setting: Setting, seed: int = 0, tgt_vocab: int | None = None
) -> dict[str, np.ndarray]:
    """Full-length pairs of random non-special tokens (ids 4..vocab-1, targets below
    ``tgt_vocab`` if given; no padding)."""
    rng = np.random.default_rng(seed)
    vocab = setting.model["vocab_size"]
    src = rng.integers(4, vocab, (setting.batch, setting.src_len), dtype=np.int32)
    shape = (setting.batch, setting.tgt_len + 1)
    tgt = rng.integers(4, tgt_vocab or vocab, shape, dtype=np.int32)
    return {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}


def precision_of(variant: str) -> str:
    """The operand type of a variant's matrix products: ``bfloat16`` under
    ``matmul_precision='bfloat16'`` or ``dtype='bfloat16'``, else ``float32``."""
    model = VARIANTS[variant].get("model", {})
    bf16 = "bfloat16" in (model.get("matmul_precision"), model.get("dtype"))
    return "bfloat16" if bf16 else "float32"
