"""Write tests/interop/torch_transformer_{post,pre}.npz: a small ``torch.nn.Transformer``
(default bias=True, layer_norm_eps=1e-5, final norms; random weights), its state dict, the
embedding and output projection kept outside it, token ids with padding, and torch's outputs
(encoder memory, logits) under the causal and key padding masks. Run once, with torch:
``/work/venv-torch/bin/python tests/interop/make_torch_fixture.py``."""

from pathlib import Path

import numpy as np

from transformer_jax.model.embeddings import sinusoidal_positions

HERE = Path(__file__).parent
D_MODEL, NHEAD, D_FF, LAYERS, VOCAB = 16, 2, 32, 2, 11
SRC = np.array([[4, 5, 6, 7, 8, 9, 3], [5, 4, 3, 0, 0, 0, 0]], np.int64)
TGT = np.array([[2, 4, 7, 9, 5, 3], [2, 10, 4, 0, 0, 0]], np.int64)


def make_case(norm_first: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """The arrays of one fixture, computed by torch (imported here: optional)."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Transformer(
        D_MODEL, NHEAD, LAYERS, LAYERS, D_FF, batch_first=True, norm_first=norm_first
    )
    generator = torch.nn.Linear(D_MODEL, VOCAB)
    embedding = torch.randn(VOCAB, D_MODEL) * D_MODEL**-0.5
    with torch.no_grad():  # every weight random: biases and norms too (torch inits them 0 / 1)
        for name, p in [*model.named_parameters(), *generator.named_parameters()]:
            norm_weight = f".{name}".split(".")[-2].startswith("norm") and name.endswith("weight")
            p.copy_(torch.randn_like(p) * 0.3 + norm_weight)
    model.eval()  # no dropout; gradients stay on, so torch's nested-tensor fast path is off
    positions = torch.from_numpy(np.array(sinusoidal_positions(64, D_MODEL)))
    src, tgt = torch.from_numpy(SRC), torch.from_numpy(TGT)
    embed = lambda ids: embedding[ids] * D_MODEL**0.5 + positions[: ids.shape[1]]  # noqa: E731
    causal = torch.triu(torch.ones(TGT.shape[1], TGT.shape[1], dtype=torch.bool), 1)
    src_pad, tgt_pad = src == 0, tgt == 0  # True: a key not attended to
    memory = model.encoder(embed(src), src_key_padding_mask=src_pad)
    out = model(
        embed(src),
        embed(tgt),
        tgt_mask=causal,
        src_key_padding_mask=src_pad,
        tgt_key_padding_mask=tgt_pad,
        memory_key_padding_mask=src_pad,
    )
    case = {f"torch.{k}": v.numpy() for k, v in model.state_dict().items()}
    return case | {
        "embedding": embedding.numpy(),
        "output_weight": generator.weight.detach().numpy(),
        "output_bias": generator.bias.detach().numpy(),
        "src": SRC.astype(np.int32),
        "tgt": TGT.astype(np.int32),
        "norm_first": np.array(norm_first),
        "memory": memory.detach().numpy(),
        "logits": generator(out).detach().numpy(),
    }


if __name__ == "__main__":
    for name, norm_first in (("post", False), ("pre", True)):
        np.savez_compressed(HERE / f"torch_transformer_{name}.npz", **make_case(norm_first))
