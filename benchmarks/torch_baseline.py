"""The PyTorch baseline of ``train_throughput.py --vs-torch``: ``torch.nn.Transformer``.

The same architecture and step as the library's: post-LN layers (no final stack norms),
ReLU, dropout 0.1 on sub-layer outputs and on embeddings + positions, one embedding matrix
shared by source, target and the pre-softmax projection, embeddings scaled by
sqrt(d_model), interleaved sinusoidal positions, the tensor2tensor label-smoothed loss
(``1 - eps`` on the reference, ``eps / (V - 1)`` elsewhere) summed over tokens and
divided by their count, Adam(0.9, 0.98, 1e-9) with the warmup schedule. Padding masks are
passed as in a real batch (the batch has no padding, as on the JAX side).

Run by ``train_throughput.py`` as a child process: argv[1] is a JSON spec
(``model``, ``batch``, ``src_len``, ``tgt_len``, ``threads``, ``label_smoothing``,
``warmup_steps``, ``matmul_precision``: ``'bfloat16'`` sets oneDNN's
``fp32_precision = "bf16"``, the library's ``matmul_precision='bfloat16'``); each line
``n`` on stdin runs n steps and answers one JSON line
``{"times": [seconds, ...], "cpu": [process CPU seconds, ...]}``. PyTorch is the optional
extra ``pip install -e .[torch]``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn


def sinusoidal_positions(length: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same) (paper §3.5)."""
    pos = np.arange(length)[:, None]
    angle = pos / np.power(10000.0, np.arange(0, d_model, 2)[None, :] / d_model)
    pe = np.zeros((length, d_model))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return torch.tensor(pe, dtype=torch.float32)


class TorchTransformer(nn.Module):
    """``nn.Transformer`` with shared, scaled, tied embeddings and sinusoidal positions."""

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 512,
        num_heads: int = 8,
        d_ff: int = 2048,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dropout_rate: float = 0.1,
        max_len: int = 512,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embed.weight, std=d_model**-0.5)
        self.register_buffer("positions", sinusoidal_positions(max_len, d_model))
        self.dropout = nn.Dropout(dropout_rate)
        common = dict(dropout=dropout_rate, activation="relu", batch_first=True, norm_first=False)
        encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d_model, num_heads, d_ff, **common),
            num_encoder_layers,
            norm=None,
            enable_nested_tensor=False,
        )
        decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(d_model, num_heads, d_ff, **common),
            num_decoder_layers,
            norm=None,
        )
        self.transformer = nn.Transformer(
            d_model, num_heads, custom_encoder=encoder, custom_decoder=decoder, batch_first=True
        )

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) * math.sqrt(self.d_model) + self.positions[: tokens.shape[1]]
        return self.dropout(x)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, pad_id: int = 0) -> torch.Tensor:
        length = tgt_in.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool).triu(1)  # True = hidden
        hidden = self.transformer(
            self._embed(src),
            self._embed(tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src == pad_id,
            tgt_key_padding_mask=tgt_in == pad_id,
            memory_key_padding_mask=src == pad_id,
            tgt_is_causal=True,
        )
        return hidden @ self.embed.weight.T


def smoothed_loss(
    logits: torch.Tensor, targets: torch.Tensor, eps: float, pad_id: int = 0
) -> torch.Tensor:
    """Token-averaged cross-entropy against the tensor2tensor smoothed targets."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    vocab = logits.shape[-1]
    target = log_probs.gather(-1, targets[..., None])[..., 0]
    loss = -((1 - eps) * target + eps / (vocab - 1) * (log_probs.sum(-1) - target))
    weights = (targets != pad_id).float()
    return (loss * weights).sum() / weights.sum()


def build(spec: dict[str, Any]) -> Any:
    """A ``step()`` closure: one training step on a fixed random batch."""
    torch.set_num_threads(spec["threads"])
    if spec["matmul_precision"] == "bfloat16":  # oneDNN rounds float32 matmul inputs
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    torch.manual_seed(0)
    cfg = dict(spec["model"])
    model = TorchTransformer(
        cfg.pop("vocab_size"), **{k: v for k, v in cfg.items() if k != "max_len"}
    )
    model.train()
    d_model = model.d_model
    warmup = spec["warmup_steps"]
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: d_model**-0.5 * min((s + 1) ** -0.5, (s + 1) * warmup**-1.5)
    )
    rng = np.random.default_rng(0)
    vocab = spec["model"]["vocab_size"]
    src = torch.from_numpy(rng.integers(4, vocab, (spec["batch"], spec["src_len"])))
    tgt = torch.from_numpy(rng.integers(4, vocab, (spec["batch"], spec["tgt_len"] + 1)))

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = smoothed_loss(model(src, tgt[:, :-1]), tgt[:, 1:], spec["label_smoothing"])
        loss.backward()
        optimizer.step()
        schedule.step()
        return loss.item()

    return step


def main() -> None:
    step = build(json.loads(sys.argv[1]))
    for line in sys.stdin:
        times, cpu = [], []
        for _ in range(int(line)):
            start, start_cpu = time.perf_counter(), time.process_time()
            step()
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        print(json.dumps({"times": times, "cpu": cpu}), flush=True)


if __name__ == "__main__":
    main()
