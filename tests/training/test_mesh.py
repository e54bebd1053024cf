"""train.parallel='mesh': logical axis names on every parameter, and one jit over a
('data', 'model') mesh that trains as pmap does with parameters and Adam state sharded (4
simulated CPU devices in a subprocess), checkpoints that resume, and train.py on it."""

import json
import os
import re
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from conftest import ROOT
from test_loop import micro_config
from test_parallel import SETUP

from transformer_jax.model import variants
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.partitioning import logical_specs
from transformer_jax.model.transformer import Transformer
from transformer_jax.training.config import PARALLEL_KINDS, parse_rules
from transformer_jax.training.logs import read_metrics
from transformer_jax.training.mesh import RULES, make_parallel, mesh_shape
from transformer_jax.training.parallel import Parallel
from transformer_jax.training.schema import RunConfig, default_config
from transformer_jax.training.validation import validate_config

NAMES = {"vocab", "embed", "heads", "kv", "mlp", "length", "layers"}
LOSS_TOLERANCE = 1e-5  # float32 sums in another order: mesh vs pmap per-token losses

SCRIPT = SETUP + textwrap.dedent(
    """
    from transformer_jax.training import checkpoints
    from transformer_jax.training.config import DEFAULT_RULES, parse_rules
    from transformer_jax.training.mesh import MeshParallel

    start = initial()

    pmap = make_parallel("pmap", model, 0.1)
    mesh = make_parallel("mesh", model, 0.1, mesh_model=2)
    _, out_pmap = train(pmap, pmap.replicate(start), batches)
    state, out_mesh = train(mesh, mesh.replicate(start), batches)
    _, out_accum = train(mesh, mesh.replicate(start), batches, accum=True)
    ev = mesh.eval_step(state.params, batches[0])

    def shards(tree):  # path -> [whole shape, this device's shard shape]
        leaves = jax.tree_util.tree_leaves_with_path(tree)
        return {jax.tree_util.keystr(p): [x.shape, x.addressable_shards[0].data.shape]
                for p, x in leaves}

    device = lambda tree: sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree))
    whole = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))
    placed = (state.params, state.opt_state)

    # a checkpoint of the state after two mesh steps, restored and placed, takes step 3
    ckpt = checkpoints.Checkpointer(sys.argv[1], 5)
    two, _ = train(mesh, mesh.replicate(start), batches[:2])
    ckpt.save_state(mesh.unreplicate(two), {"position": 2})
    ckpt.wait()
    restored, data = ckpt.restore_state(start)
    _, resumed = train(mesh, mesh.replicate(restored), batches[2:])
    _, resumed_pmap = train(pmap, pmap.replicate(restored), batches[2:])

    # scan_layers: the same parameters stacked on a leading layer axis (one layer a stack)
    stack = lambda part: {("layers" if k == "layer_0" else k):
                          jax.tree.map(lambda x: x[None], v) if k == "layer_0" else v
                          for k, v in part.items()}
    scan_params = {k: stack(v) if k in ("encoder", "decoder") else v for k, v in params.items()}
    scan_start = jax.device_get(steps.create_train_state(scan_params, start.tx, start.rng))
    scan_mesh = MeshParallel(Transformer(config.replace(scan_layers=True)), 0.1, model_size=2)
    scan_state, out_scan = train(scan_mesh, scan_mesh.replicate(scan_start), batches)

    # every leaf's sharding is Flax's logical_to_mesh_sharding of the boxed abstract state
    def boxed_state(module, tx):
        tokens = np.zeros((1, 8), np.int32)
        boxed = module.init(jax.random.key(0), tokens, tokens)["params"]
        return steps.create_train_state(boxed, tx, jax.random.PRNGKey(1))
    def flax_specs(module, tx, rules):
        abstract = jax.eval_shape(lambda: boxed_state(module, tx))
        named = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh.mesh, rules)
        return [trimmed(s.spec) for s in jax.tree.leaves(named)]
    def trimmed(spec):  # P('data', None) and P('data') place alike
        spec = list(spec)
        while spec and spec[-1] is None:
            spec.pop()
        return spec
    placed_specs = lambda tree: [trimmed(x.sharding.spec) for x in jax.tree.leaves(tree)]
    adamw = initial(0.5)
    adamw_state, _ = train(mesh, mesh.replicate(adamw), batches[:1])
    no_embed = ",".join(f"{k}={v}" for k, v in parse_rules(DEFAULT_RULES) if k != "embed")
    model_only = make_parallel("mesh", model, 0.1, mesh_model=2, logical_axis_rules=no_embed)
    model_state, out_model_only = train(model_only, model_only.replicate(start), batches)
    moments = state.opt_state[0]
    out_specs = {
        "state": placed_specs(state) == flax_specs(model, start.tx, mesh.rules),
        "adamw": placed_specs(adamw_state) == flax_specs(model, adamw.tx, mesh.rules),
        "scan": placed_specs(scan_state) == flax_specs(scan_mesh.step_options["model"],
                                                       start.tx, mesh.rules),
        "rules": placed_specs(model_state) == flax_specs(model, start.tx, model_only.rules),
        "moments": [placed_specs(moments.mu), placed_specs(moments.nu)],
        "params": placed_specs(state.params),
        "model_only": shards(model_state.params),
    }
    out = {
        "pmap": out_pmap, "mesh": out_mesh, "accum": out_accum,
        "eval": float(ev["loss"] / ev["tokens"]),
        "params": shards(state.params), "opt_state": shards(state.opt_state),
        "device_bytes": device(placed), "whole_bytes": whole(placed),
        "resumed": resumed, "resumed_pmap": resumed_pmap, "data": data,
        "step": int(restored.step), "scan_losses": out_scan, "scan": shards(scan_state.params),
        "model_only_losses": out_model_only, "specs": out_specs,
    }
    print("RESULT" + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0",
        JAX_PLATFORMS="cpu",
    )
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    workdir = str(tmp_path_factory.mktemp("mesh_checkpoints"))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, workdir],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line.removeprefix("RESULT"))


def _names(config, **pieces):
    tokens = jnp.ones((1, 8), jnp.int32)
    model = Transformer(config, **pieces)
    specs = logical_specs(lambda: model.init(jax.random.key(0), tokens, tokens)["params"])
    params = nn.unbox(model.init(jax.random.key(0), tokens, tokens)["params"])
    is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)  # noqa: E731
    named = jax.tree_util.tree_leaves_with_path(specs, is_leaf=is_spec)
    plain = jax.tree_util.tree_leaves_with_path(params)
    assert [p for p, _ in named] == [p for p, _ in plain]  # the same tree: checkpoints keep it
    assert all(type(x) is type(jnp.zeros(1)) for _, x in plain)  # unboxed: plain arrays
    pairs = zip(named, plain, strict=True)
    return {jax.tree_util.keystr(p): (tuple(s), x.shape) for (p, s), (_, x) in pairs}


CONFIG = TransformerConfig(
    vocab_size=40, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=2, num_decoder_layers=2
)


@pytest.mark.parametrize("scan", [False, True])
def test_every_parameter_has_a_logical_name_per_axis(scan):
    config = CONFIG.replace(
        scan_layers=scan,
        tie_output=False,
        positional="learned",
        attention_bias=True,
        final_norm=True,
    )
    names = _names(config)
    for path, (spec, shape) in names.items():
        assert len(spec) == len(shape) and set(spec) <= NAMES, path
        assert (spec[0] == "layers") == ("layers" in path), path
    layer = "['layers']" if scan else "['layer_1']"
    lead = ("layers",) if scan else ()
    assert names[f"['encoder']{layer}['self_attention']['query']['kernel']"][0] == (
        *lead,
        "embed",
        "heads",
        "kv",
    )
    assert names[f"['decoder']{layer}['ffn']['w2']['kernel']"][0] == (*lead, "mlp", "embed")
    assert names["['decoder']['logits']['kernel']"][0] == ("embed", "vocab")
    assert names["['shared_embed']['embedding']"][0] == ("vocab", "embed")


def test_variants_pieces_are_named_too():
    names = _names(CONFIG, ffn=variants.GatedFeedForward, norm=variants.rms_norm)
    assert names["['encoder']['layer_0']['ffn']['gate']['kernel']"][0] == ("embed", "mlp")
    assert names["['encoder']['layer_0']['ffn']['out']['kernel']"][0] == ("mlp", "embed")
    assert names["['encoder']['layer_0']['ffn_block']['norm']['scale']"][0] == ("embed",)


def test_mesh_model_must_divide_the_devices():
    assert mesh_shape(8, 2) == (4, 2)
    with pytest.raises(ValueError, match=r"train.mesh_model=3 must divide the 4 devices"):
        mesh_shape(4, 3)
    config = default_config()
    config.train.update(parallel="mesh", mesh_model=jax.device_count() + 1)
    with pytest.raises(ValueError, match="train.mesh_model=.* must divide"):
        validate_config(RunConfig.from_config(config))
    config.train.mesh_model = 0
    with pytest.raises(ValueError, match="train.mesh_model must be a positive integer, got 0"):
        validate_config(RunConfig.from_config(config))


def test_make_parallel_gives_one_class_per_strategy():
    model = Transformer(CONFIG)
    for kind in PARALLEL_KINDS:
        dp = make_parallel(kind, model, 0.1, devices=jax.devices()[:1])
        assert isinstance(dp, Parallel) and dp.kind == kind


def test_logical_axis_rules_are_checked_in_one_line():
    assert parse_rules(" embed=data, heads=model,") == (("embed", "data"), ("heads", "model"))
    assert parse_rules("") == ()
    config = default_config()
    assert parse_rules(config.train.logical_axis_rules) == RULES
    for bad in ("embed=fsdp", "embed", "embed=data,embed=model"):
        config.train.logical_axis_rules = bad
        with pytest.raises(ValueError, match="train.logical_axis_rules must be comma-separated"):
            validate_config(RunConfig.from_config(config))


def test_no_context_variable_and_no_private_attributes_read_across_objects():
    partitioning = (ROOT / "transformer_jax" / "model" / "partitioning.py").read_text()
    assert "ContextVar" not in partitioning and "_BOXED" not in partitioning
    private = re.compile(r"\b(?!self\b|cls\b)[a-z]\w*\._[a-z]\w*")  # obj._name, not self._
    for path in sorted((ROOT / "transformer_jax" / "aot").glob("*.py")):
        found = [m for m in private.findall(path.read_text()) if not m.startswith("jax._src")]
        assert not found, (path.name, found)
    for name in ("tests/kernels/test_gpu_lowering.py", "benchmarks/_gpu_check_row.py"):
        assert not re.search(r"\.(_train|_accumulate|_apply|_eval)\b", (ROOT / name).read_text())


@pytest.mark.slow  # a 4-device subprocess compiling pmap and mesh steps
def test_mesh_trains_to_pmap_losses(results):
    for name in ("mesh", "accum", "scan_losses"):
        assert results[name] == pytest.approx(results["pmap"], abs=LOSS_TOLERANCE), name
    assert results["pmap"][0] > results["pmap"][-1]  # it learns
    assert 0 < results["eval"] < results["pmap"][0]


@pytest.mark.slow
def test_parameters_and_adam_state_are_sharded(results):
    params, moments = results["params"], results["opt_state"]
    quarter = [
        "['encoder']['layer_0']['self_attention']['query']['kernel']",  # embed x heads
        "['decoder']['layer_0']['ffn']['w1']['kernel']",  # embed x mlp
        "['shared_embed']['embedding']",  # vocab x embed
    ]
    for path in quarter:
        whole, shard = params[path]
        assert shard[0] * 2 == whole[0] and shard[1] * 2 == whole[1], (path, whole, shard)
        for moment in ("mu", "nu"):
            assert moments[f"[0].{moment}{path}"] == [whole, shard]
    assert params["['decoder']['layer_0']['ffn']['w1']['bias']"] == [[64], [32]]  # mlp
    assert params["['encoder']['layer_0']['ffn_block']['norm']['scale']"] == [[32], [16]]
    assert results["device_bytes"] * 3 < results["whole_bytes"]  # ~1/4 held by each device
    assert results["specs"]["moments"] == [results["specs"]["params"]] * 2
    scanned = results["scan"]["['encoder']['layers']['self_attention']['out']['kernel']"]
    assert scanned == [[1, 4, 8, 32], [1, 2, 8, 16]]  # layers x heads x kv x embed


@pytest.mark.slow
def test_every_leaf_of_the_mesh_state_is_placed_by_flax_logical_partitioning(results):
    for name in ("state", "adamw", "scan", "rules"):  # Adam, AdamW, scan_layers, other rules
        assert results["specs"][name], name


@pytest.mark.slow
def test_logical_axis_rules_change_the_placement(results):
    """Without 'embed=data' the parameters are whole over 'data': split only over 'model'."""
    query = "['encoder']['layer_0']['self_attention']['query']['kernel']"
    whole, shard = results["specs"]["model_only"][query]
    assert shard == [whole[0], whole[1] // 2, whole[2]], (whole, shard)  # embed x heads x kv
    norm = results["specs"]["model_only"]["['encoder']['layer_0']['ffn_block']['norm']['scale']"]
    assert norm[0] == norm[1]  # embed only: whole
    assert results["model_only_losses"] == pytest.approx(results["pmap"], abs=LOSS_TOLERANCE)


@pytest.mark.slow
def test_a_mesh_checkpoint_restores_and_resumes_under_mesh_and_pmap(results):
    assert results["step"] == 2 and results["data"] == {"position": 2}
    assert results["resumed"] == pytest.approx(results["mesh"][2:], abs=1e-6)
    assert results["resumed_pmap"] == pytest.approx(results["mesh"][2:], abs=LOSS_TOLERANCE)


@pytest.mark.slow  # a train.py process on 4 devices: tokenizer, 4 steps, evaluation, test BLEU
def test_train_py_with_parallel_mesh(tmp_path):
    _, config_path = micro_config(tmp_path, steps=4, every=2)
    workdir = tmp_path / "run"
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
    )
    args = [
        f"--config={config_path}",
        f"--workdir={workdir}",
        "--config.train.parallel=mesh",
        "--config.train.mesh_model=2",
        "--config.train.eval_every=2",
        "--config.train.final_test=True",
        "--config.train.test_sentences=2",
    ]
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "train.parallel=mesh" in proc.stdout + proc.stderr
    records = read_metrics(str(workdir))
    assert sorted(r["step"] for r in records if "loss" in r) == [1, 2, 3, 4]
    assert any("eval_loss" in r for r in records) and any("test_bleu" in r for r in records)
    assert sorted(os.listdir(workdir / "checkpoints"))[-1] == "4"
