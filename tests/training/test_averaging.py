"""The library function behind the average command, without the CLI."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import Transformer
from transformer_jax.model.config import TransformerConfig
from transformer_jax.training.averaging import average_checkpoints, average_params
from transformer_jax.training.checkpoints import CHECKPOINT_DIR, load_run, save_params
from transformer_jax.training.schema import RunConfig, default_config


def test_average_checkpoints_saves_the_mean_of_the_last_ones(tmp_path):
    workdir = str(tmp_path)
    config = default_config()
    config.model.update(d_model=8, num_heads=2, d_ff=16, num_encoder_layers=1)
    config.model.update(num_decoder_layers=1, vocab_size=260, max_len=8)
    config.data.max_len = 8
    config = RunConfig.from_config(config)
    (tmp_path / "config.json").write_text(config.to_json())
    model, src = Transformer(config.model), jnp.ones((1, 4), jnp.int32)
    saved = {}
    for step in (1, 2, 3):
        saved[step] = nn.unbox(jax.device_get(model.init(jax.random.key(step), src, src)["params"]))
        save_params(os.path.join(workdir, CHECKPOINT_DIR), saved[step], step)
    assert average_checkpoints(workdir, 2) == ([2, 3], os.path.join(workdir, "averaged"))
    _, averaged, step = load_run(workdir, "averaged")
    expected = jax.tree.map(lambda a, b: (a + b) / 2, saved[2], saved[3])
    assert step == 3
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), averaged, expected)
    with pytest.raises(ValueError, match="needs 4 checkpoints"):
        average_checkpoints(workdir, 4)
    mean = average_params([{"w": np.float32([1, 2])}, {"w": np.float32([2, 4])}])
    assert mean["w"].dtype == np.float32 and mean["w"].tolist() == [1.5, 3.0]


def test_average_params_takes_init_output_boxed_or_plain():
    config = TransformerConfig(
        vocab_size=16, d_model=8, num_heads=2, d_ff=16, num_encoder_layers=1, num_decoder_layers=1
    )
    model, src = Transformer(config), jnp.ones((1, 4), jnp.int32)
    init = jax.jit(model.init)
    boxed = [init(jax.random.key(seed), src, src)["params"] for seed in (0, 1)]
    plain = average_params([nn.unbox(tree) for tree in boxed])
    mixed = average_params([boxed[0], nn.unbox(boxed[1])])
    assert jax.tree.all(jax.tree.map(np.array_equal, mixed, plain))
