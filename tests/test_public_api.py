"""The public API as a researcher imports it: the names of ``import transformer_jax as tj``,
and the README's library example (a decoder-only model trained and decoded) run as is."""

import re

from conftest import ROOT

import transformer_jax as tj
from transformer_jax.inference import decoding
from transformer_jax.model import attention, embeddings, layers

README = ROOT / "README.md"


def test_submodules_and_names_are_attributes():
    assert (tj.attention, tj.embeddings, tj.layers, tj.decoding) == (
        attention,
        embeddings,
        layers,
        decoding,
    )
    assert tj.attention.MultiHeadAttention is tj.MultiHeadAttention
    assert tj.layers.FeedForward is tj.FeedForward
    for name in ("greedy", "beam", "sample", "cached_step", "init_cache", "beam_search"):
        assert callable(getattr(tj.decoding, name)), name
    for name in ("make_batch", "create_train_state", "train_step", "eval_step", "summarize"):
        assert callable(getattr(tj.training, name)), name
    assert (tj.ids.PAD_ID, tj.ids.UNK_ID, tj.ids.BOS_ID, tj.ids.EOS_ID) == (0, 1, 2, 3)
    assert tj.data.PAD_ID == tj.ids.PAD_ID and callable(tj.data.load_tokenizer)
    assert set(tj.__all__) <= set(dir(tj))


def library_example() -> str:
    section = README.read_text().split("## The library", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "README's library section has no python example"
    return blocks[0]


def test_readme_library_example_trains_and_decodes_a_decoder_only_model(capsys):
    namespace: dict = {}
    exec(compile(library_example(), str(README), "exec"), namespace)
    assert namespace["decoded"] == namespace["text"]
    state, batch, model = namespace["state"], namespace["batch"], namespace["model"]
    assert isinstance(state, tj.training.TrainState) and int(state.step) == 150
    sums = tj.training.eval_step(state.params, batch, model=model)  # without dropout
    assert float(sums["correct"]) == float(sums["tokens"]) == 8 * (len(namespace["text"]) + 1)
    assert "attention is all you need" in capsys.readouterr().out
