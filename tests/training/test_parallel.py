"""Data parallelism: 1 and 4 devices, pmap and shard_map, and gradient accumulation give the
same losses for the same global batch, with Adam and with AdamW's weight decay (run on 4
simulated CPU devices in a subprocess)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import ROOT

from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.transformer import Transformer
from transformer_jax.training.mesh import make_parallel
from transformer_jax.training.parallel import shard_batch

# 4 simulated devices: a micro model, three batches of 10 rows, its initial train state and
# train(dp, state, batches, accum) -> (state, per-token losses)
SETUP = textwrap.dedent(
    """
    import json, sys
    import flax.linen as nn, jax, numpy as np
    from transformer_jax.model.config import TransformerConfig
    from transformer_jax.model.transformer import Transformer
    from transformer_jax.training import optimizer, parallel, steps
    from transformer_jax.training.mesh import make_parallel

    assert jax.device_count() == 4
    config = TransformerConfig(vocab_size=40, d_model=32, num_heads=4, d_ff=64,
                               num_encoder_layers=1, num_decoder_layers=1,
                               dropout_rate=0.0, max_len=32)
    model = Transformer(config)
    rs = np.random.RandomState(0)

    def batch(rows=10):  # 10 rows: padded with empty rows to 12 on 4 devices
        src = rs.randint(4, 40, (rows, 7)).astype(np.int32)
        src[:, 5:] = 0
        tgt = rs.randint(4, 40, (rows, 6)).astype(np.int32)
        tgt[:3, 4:] = 0
        return {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}

    batches = [batch() for _ in range(3)]
    params = model.init(jax.random.PRNGKey(0), batches[0]["src"], batches[0]["tgt_in"])["params"]
    params = nn.unbox(params)
    schedule = optimizer.transformer_schedule(32, 3)

    def initial(weight_decay=0.0):
        tx = optimizer.transformer_optimizer(schedule, weight_decay=weight_decay)
        return jax.device_get(steps.create_train_state(params, tx, jax.random.PRNGKey(1)))

    def train(dp, state, todo, accum=False):  # the state after the batches, and their losses
        losses = []
        for b in todo:
            if not accum:
                state, m = dp.train_step(state, b)
            else:  # two micro-batches of 5 rows make up the same global batch
                acc = dp.zero_accumulator(state)
                for j, part in enumerate([slice(0, 5), slice(5, None)]):
                    micro = {k: v[part] for k, v in b.items()}
                    acc = dp.accumulate(acc, state, micro, j)
                state, m = dp.apply(state, acc)
            losses.append(float(m["loss"] / m["tokens"]))
        return state, losses
    """
)
SCRIPT = SETUP + textwrap.dedent(
    """
    def run(kind, n, accum=False, evaluate=False, weight_decay=0.0):
        dp = make_parallel(kind, model, 0.1, devices=jax.devices()[:n])
        state, losses = train(dp, dp.replicate(initial(weight_decay)), batches, accum)
        if evaluate:
            ev = dp.eval_step(state.params, batches[0])
            losses.append(float(ev["loss"] / ev["tokens"]))
        return losses

    keys = jax.pmap(lambda x: steps._device_rng(jax.random.PRNGKey(0), "batch"),
                    axis_name="batch")(np.zeros(4))
    out = {
        "pmap1": run("pmap", 1, evaluate=True), "pmap4": run("pmap", 4),
        "shard4": run("shard_map", 4, evaluate=True), "accum_shard4": run("shard_map", 4, True),
        "adamw_pmap1": run("pmap", 1, weight_decay=0.5),
        "adamw_shard4": run("shard_map", 4, weight_decay=0.5),
        "distinct_device_keys": len({tuple(k) for k in np.asarray(keys).tolist()}),
    }
    print("RESULT" + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def results():
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0",
        JAX_PLATFORMS="cpu",
    )
    root = str(ROOT)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line.removeprefix("RESULT"))


@pytest.mark.parametrize("name", ["pmap4", "shard4"])
def test_devices_and_parallel_kinds_agree(results, name):
    n = len(results[name])  # 3 training losses (+ the eval loss after them)
    np.testing.assert_allclose(results[name], results["pmap1"][:n], rtol=2e-5, atol=1e-6)
    assert results["pmap1"][0] != results["pmap1"][-1]  # the model did train


def test_gradient_accumulation_equals_one_step_on_the_whole_batch(results):
    np.testing.assert_allclose(results["accum_shard4"], results["pmap1"][:3], rtol=2e-5, atol=1e-6)


def test_weight_decay_is_the_same_on_one_and_four_devices(results):
    np.testing.assert_allclose(
        results["adamw_shard4"], results["adamw_pmap1"], rtol=2e-5, atol=1e-6
    )
    assert results["adamw_pmap1"][0] == results["pmap1"][0]  # the first loss precedes any update
    assert abs(results["adamw_pmap1"][-1] - results["pmap1"][2]) > 1e-4


def test_each_device_gets_its_own_dropout_key(results):
    assert results["distinct_device_keys"] == 4


def test_unknown_parallel_kind():
    model = Transformer(TransformerConfig(vocab_size=8, d_model=8, num_heads=2, d_ff=8))
    with pytest.raises(
        ValueError, match=r"train.parallel must be one of \('pmap', 'shard_map', 'mesh'\)"
    ):
        make_parallel("tpu_magic", model, 0.1)


def test_shard_batch_pads_with_empty_rows():
    batch = {"src": np.ones((3, 4), np.int32), "src_segments": np.ones((3, 4), np.int32)}
    out = shard_batch(batch, 2)
    assert out["src"].shape == (2, 2, 4)
    assert (out["src"][1, 1] == 0).all() and (out["src_segments"][1, 1] == 0).all()
