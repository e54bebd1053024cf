"""Translation (translate, evaluate and training's evaluation) decodes data-parallel: over 4
simulated CPU devices (every local device by default, or the copies of pmap and shard_map
parameters; in a subprocess) and over processes, it gives exactly the translations of
``translate_lines`` on one device, in order."""

import json
import os
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import numpy as np
import pytest
from conftest import ROOT, TINY_CONFIG

from transformer_jax.data.tokenizer import train_tokenizer
from transformer_jax.inference import translation
from transformer_jax.inference.translation import translate_lines
from transformer_jax.model.transformer import Transformer

SENTENCES = [
    "A dog runs across the green field.",
    "Ein Hund rennt über das grüne Feld.",
    "Two children play near the old bridge.",
    "Zwei Kinder spielen an der alten Brücke.",
    "She reads a letter by the window.",
    "Sie liest einen Brief am Fenster.",
]
# 23 lines of one or two words and an empty one: six batches of 4 rows (of one shape), the
# last one with 3 lines
LINES = [" ".join(SENTENCES[i % 6].split()[: 1 + i % 2]) for i in range(23)] + [""]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import flax.linen, jax
    from transformer_jax.data.tokenizer import load_tokenizer
    from transformer_jax.inference import translation
    from transformer_jax.model.config import TransformerConfig
    from transformer_jax.model.transformer import Transformer
    from transformer_jax.training.mesh import make_parallel

    assert jax.device_count() == 4
    tokenizer = load_tokenizer(sys.argv[1])
    lines = json.loads(sys.argv[2])
    config = TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=16, num_heads=2,
                               d_ff=32, num_encoder_layers=1, num_decoder_layers=1, max_len=24)
    model = Transformer(config)
    src = jax.numpy.ones((1, 4), jax.numpy.int32)
    params = jax.device_get(jax.jit(model.init)(jax.random.PRNGKey(0), src, src)["params"])
    params = flax.linen.unbox(params)

    used = set()
    decode_batch = translation.decode_batch
    def recording(*args):
        out = decode_batch(*args)
        used.update(str(d) for d in out.devices())
        return out
    translation.decode_batch = recording

    options = dict(beam_size=3, alpha=0.6, max_extra_len=6, batch_size=4)
    out = {"one": translation.translate_lines(config, params, tokenizer, lines,
                                              devices=jax.local_devices()[:1], **options)}
    out["one_devices"] = len(used)
    used.clear()
    out["all"] = translation.translate_lines(config, params, tokenizer, lines, **options)
    out["all_devices"] = len(used)
    used.clear()
    for kind in ("pmap", "shard_map"):
        dp = make_parallel(kind, model, 0.1)
        copies = dp.local_copies(dp.replicate(params))
        out[kind] = translation.translate_on_devices(config, copies, tokenizer, lines, **options)
        out[kind + "_devices"] = len(used)
        used.clear()
    print("RESULT" + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tok") / "tokenizer.model")
    train_tokenizer(SENTENCES * 4, path, 300)
    return path


def tiny(vocab_size):
    config = TINY_CONFIG.replace(vocab_size=vocab_size)
    src = jax.numpy.ones((1, 4), jax.numpy.int32)
    init = jax.jit(Transformer(config).init)
    params = jax.device_get(init(jax.random.PRNGKey(0), src, src)["params"])
    return config, nn.unbox(params)


@pytest.mark.slow
def test_four_devices_give_the_one_device_translations(tokenizer_path):
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0",
        JAX_PLATFORMS="cpu",
    )
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    args = [tokenizer_path, json.dumps(LINES)]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    out = json.loads(line.removeprefix("RESULT"))
    assert out["all"] == out["pmap"] == out["shard_map"] == out["one"]
    assert out["one_devices"] == 1
    assert out["all_devices"] == out["pmap_devices"] == out["shard_map_devices"] == 4
    assert out["one"][-1] == "" and len(set(out["one"])) > 2  # not one translation for all


def test_each_process_decodes_its_batches_and_the_sum_has_them_all(tokenizer_path, monkeypatch):
    from transformer_jax.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path)
    config, params = tiny(tokenizer.vocab_size)
    expected = translate_lines(
        config, params, tokenizer, LINES, beam_size=1, max_extra_len=6, batch_size=4
    )
    shares = []

    def alone(values):  # the collective of a process whose peers decoded nothing
        shares.append(np.array(values))
        return lambda: tuple(int(v) for v in values)

    monkeypatch.setattr(translation.jax, "process_count", lambda: 2)
    monkeypatch.setattr(translation, "sum_over_processes", alone)
    for process in (0, 1):
        monkeypatch.setattr(translation.jax, "process_index", lambda p=process: p)
        translation.translate_on_devices(
            config,
            [params],
            tokenizer,
            LINES,
            beam_size=1,
            alpha=0.6,
            max_extra_len=6,
            batch_size=4,
        )
    rows = [np.asarray(s).reshape(len(LINES), -1) for s in shares]
    decoded = [rows[p].any(axis=1) for p in (0, 1)]
    assert not (decoded[0] & decoded[1]).any() and decoded[0].sum() and decoded[1].sum()
    assert [tokenizer.decode(row.tolist()) for row in rows[0] + rows[1]] == expected
