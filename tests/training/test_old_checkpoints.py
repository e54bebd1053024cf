"""Checkpoints and workdirs written before the sub-layer norms were named by their role (then
``*_block/LayerNorm_0`` or ``RMSNorm_0``, now ``*_block/norm``) resume and load as today's
trees (:mod:`transformer_jax.training.upgrade`); what is saved now keeps today's names."""

import flax.linen as nn
import jax
import numpy as np

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.training.checkpoints import (
    CONFIG_FILE,
    Checkpointer,
    list_steps,
    load_run,
    save_params,
)
from transformer_jax.training.integrity import checksums
from transformer_jax.training.optimizer import transformer_optimizer, transformer_schedule
from transformer_jax.training.schema import default_config
from transformer_jax.training.steps import create_train_state
from transformer_jax.training.upgrade import saved_layout, upgrade

SIZES = dict(vocab_size=260, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1)
CFG = TransformerConfig(num_decoder_layers=1, max_len=32, **SIZES)


def params_of(config=CFG):
    tokens = np.zeros((1, 4), np.int32)
    return nn.unbox(
        jax.device_get(Transformer(config).init(jax.random.key(0), tokens, tokens)["params"])
    )


def as_before(tree, norm="LayerNorm_0", parent=None):
    """``tree`` with the names the version before gave: each sub-layer's norm by its class."""
    if isinstance(tree, dict):
        rename = lambda k: norm if k == "norm" and str(parent).endswith("_block") else k  # noqa: E731
        return {rename(k): as_before(v, norm, k) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(as_before(x, norm) for x in tree))
    if isinstance(tree, list | tuple):
        return type(tree)(as_before(x, norm) for x in tree)
    return tree


def state_of(params, step=0):
    tx = transformer_optimizer(transformer_schedule(16, 10))
    state = create_train_state(params, tx, jax.random.PRNGKey(0))
    return jax.device_get(state.replace(step=np.array(step, np.int32)))


def assert_same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_upgrade_renames_old_trees_paths_and_optimizer_states():
    params = params_of(CFG.replace(norm_type="rms"))
    old = as_before(params, "RMSNorm_0")
    assert "RMSNorm_0" in old["decoder"]["layer_0"]["cross_attention_block"]
    assert_same(upgrade(old), params)
    assert upgrade(checksums(old)) == checksums(params)  # the checksums' paths
    state, old_state = state_of(params), state_of(old)
    assert_same(upgrade(old_state.opt_state), state.opt_state)  # Adam's named tuples kept
    assert jax.tree.structure(saved_layout(state.opt_state, old_state.opt_state)) == (
        jax.tree.structure(old_state.opt_state)
    )
    assert_same(upgrade(params), params)  # today's trees pass unchanged


def test_an_old_checkpoint_resumes_and_saves_todays_names(tmp_path):
    params = params_of()
    before = Checkpointer(str(tmp_path), keep=3)
    before.save_state(state_of(as_before(params), step=3), {"position": 3})
    before.close()

    checkpointer = Checkpointer(str(tmp_path), keep=3)
    restored, data = checkpointer.restore_state(state_of(params))
    assert int(restored.step) == 3 and data == {"position": 3}
    assert_same(restored.params, params)
    assert_same(restored.opt_state, state_of(params).opt_state)
    checkpointer.save_state(restored.replace(step=np.array(4, np.int32)), {"position": 4})
    checkpointer.close()
    metadata = Checkpointer(str(tmp_path), keep=3).manager._manager.item_metadata(4)
    assert "norm" in metadata["params"].tree["encoder"]["layer_0"]["ffn_block"]


def test_an_old_workdir_loads_its_checkpoints_and_averaged_parameters(tmp_path):
    config = default_config()
    config.model.update(num_decoder_layers=1, max_len=32, **SIZES)
    config.data.max_len = 32
    (tmp_path / CONFIG_FILE).write_text(config.to_json(indent=2))
    params = params_of()
    before = Checkpointer(str(tmp_path), keep=3)
    before.save_state(state_of(as_before(params), step=2), {"position": 2})
    before.close()
    save_params(str(tmp_path / "averaged"), as_before(params), 2)
    assert list_steps(str(tmp_path)) == [2]

    for checkpoint in ("latest", "averaged"):
        saved, restored, step = load_run(str(tmp_path), checkpoint)
        assert step == 2 and saved.model.d_model == 16
        assert_same(jax.device_get(restored), params)
