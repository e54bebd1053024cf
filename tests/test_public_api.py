"""The public API as a researcher imports it: the names of ``import transformer_jax as tj``,
and the README's variant example run in-process, its pieces checked (test_readme_examples.py
runs every README example as a file)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
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
    assert callable(tj.analysis.attention_maps) and callable(tj.analysis.hidden_states)
    assert callable(tj.variants.rope) and callable(tj.variants.rms_norm)


def library_example(index: int) -> str:
    section = README.read_text().split("## The library", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) > index, "README's library section lacks a python example"
    return blocks[index]


def test_readme_variant_is_used_and_decodes_from_its_cache():
    """The README's variant (a registered SwiGLU and ALiBi of user code, RMSNorm, grouped-query
    attention): its pieces are in the parameters, by name and by module alike, its scores
    change the output, cached decoding equals the full pass."""
    namespace: dict = {}
    exec(compile(library_example(1), str(README), "exec"), namespace)
    model, params, src = namespace["model"], namespace["params"], namespace["src"]
    layer = params["decoder"]["layer_0"]
    assert set(layer["ffn"]) == {"gate", "value", "out"} and set(layer["ffn_block"]) == {"norm"}
    assert layer["self_attention"]["key"]["kernel"].shape == (32, 2, 8)  # 2 K/V heads
    assert namespace["translation"].shape == (1, 32)  # min(5 + 50, max_len)
    assert len(namespace["maps"]["encoder"]) == 2
    tgt = jnp.array([[2, 9, 10, 11, 3]])
    full = jax.jit(model.apply)({"params": params}, src, tgt)
    same = jax.jit(namespace["same"].apply)({"params": params}, src, tgt)
    np.testing.assert_array_equal(same, full)
    no_hook = tj.Transformer(namespace["config"].replace(positional="none"))
    paper_scores = jax.jit(no_hook.apply)({"params": params}, src, tgt)
    assert float(jnp.abs(full - paper_scores).max()) > 1e-3
    step, cache = tj.decoding.transformer_step(model, params, src, tgt.shape[1])
    step = jax.jit(step)
    for i in range(tgt.shape[1]):
        logits, cache = step(tgt[:, i : i + 1], cache)
        np.testing.assert_allclose(logits[:, -1], full[:, i], atol=1e-5)
