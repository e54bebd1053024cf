"""The public API as a researcher imports it: the names of ``import transformer_jax as tj``,
and the README's variant example run in-process, its pieces checked (test_readme_examples.py
runs every README example as a file)."""

import importlib
import os
import re
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
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
    layer = nn.unbox(params)["decoder"]["layer_0"]  # init: boxes with axis names
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


def test_packages_import_their_modules_on_first_use():
    """Importing a package (and the config sections and schema) imports no JAX, Flax or
    TensorFlow; each name a package lists is its module's, imported when first used."""
    code = (
        "import sys\n"
        "import transformer_jax.data, transformer_jax.training, transformer_jax.model\n"
        "import transformer_jax.inference, transformer_jax.kernels\n"
        "from transformer_jax.training import schema\n"
        "schema.check_fields(schema.default_config())\n"
        "print(sorted(m for m in ('jax', 'flax', 'tensorflow') if m in sys.modules))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0 and result.stdout == "[]\n", result.stderr
    for package in (tj.data, tj.training):
        for name in package.__all__:
            defined = getattr(package, name)
            module = importlib.import_module(f"{package.__name__}.{package._PUBLIC[name]}")
            assert defined is getattr(module, name), f"{package.__name__}.{name}"
        assert set(package.__all__) <= set(dir(package))
    assert tj.data.SOURCES == ("tfds", "text", "synthetic") and tj.data.batching.Batcher
    assert tj.kernels.ops("xla") is tj.kernels.XLA and tj.kernels.precision.einsum
    assert tj.model.variants is tj.variants and tj.model.config.TransformerConfig
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        tj.data.nothing  # noqa: B018
