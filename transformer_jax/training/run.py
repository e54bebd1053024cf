"""Starting a training run: the checked config, the tokenizer, the fresh or restored train
state and the checkpointer of a workdir."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from transformer_jax import data as data_lib
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.transformer import Transformer
from transformer_jax.training import checkpoints
from transformer_jax.training.optimizer import transformer_optimizer, transformer_schedule
from transformer_jax.training.parallel import DataParallel
from transformer_jax.training.steps import TrainState, create_train_state
from transformer_jax.training.validation import validate_config


def run_schedule(config: ml_collections.ConfigDict, model_config: TransformerConfig) -> Any:
    """The learning rate of each update: the paper's warmup schedule for ``config.train``."""
    return transformer_schedule(
        model_config.d_model, config.train.warmup_steps, config.train.learning_rate_scale
    )


def init_state(model_config: TransformerConfig, config: ml_collections.ConfigDict) -> TrainState:
    """Fresh parameters (host numpy) and Adam state for ``config``."""
    model = Transformer(model_config)
    key = jax.random.PRNGKey(config.train.seed)
    init_key, dropout_key = jax.random.split(key)
    dummy = jnp.ones((1, 8), jnp.int32)
    params = jax.jit(lambda k: model.init(k, dummy, dummy)["params"])(init_key)
    tx = transformer_optimizer(
        run_schedule(config, model_config),
        config.train.adam_b1,
        config.train.adam_b2,
        config.train.adam_eps,
    )
    return jax.device_get(create_train_state(params, tx, dropout_key))


@dataclasses.dataclass
class Run:
    """A started run: ``state`` is the host train state at step ``start``; ``data_state``
    the saved position of the training data (None for a new run)."""

    config: ml_collections.ConfigDict
    workdir: str
    model_config: TransformerConfig
    tokenizer: data_lib.Tokenizer
    dp: DataParallel
    state: TrainState
    data_state: dict[str, int] | None
    checkpointer: checkpoints.Checkpointer

    @property
    def start(self) -> int:
        return int(self.state.step)


def start_run(config: ml_collections.ConfigDict, workdir: str) -> Run:
    """Check ``config``, then restore the newest good checkpoint of ``workdir`` or start anew."""
    model_config = validate_config(config)
    os.makedirs(workdir, exist_ok=True)
    tokenizer = data_lib.get_tokenizer(config.data, workdir, config.model.vocab_size)
    if tokenizer.vocab_size > model_config.tgt_vocab:
        raise ValueError(
            f"model.vocab_size={model_config.tgt_vocab} is smaller than the tokenizer's "
            f"{tokenizer.vocab_size} pieces in {workdir}/tokenizer.model"
        )
    if jax.process_index() == 0:
        with open(os.path.join(workdir, checkpoints.CONFIG_FILE), "w") as f:
            f.write(config.to_json(indent=2))
    dp = DataParallel(
        config.train.parallel,
        Transformer(model_config),
        config.train.label_smoothing,
        label_smoothing_convention=config.train.label_smoothing_convention,
    )
    state = init_state(model_config, config)
    checkpointer = checkpoints.Checkpointer(workdir, config.train.keep_checkpoints)
    restored = checkpointer.restore_state(state)
    data_state = None
    if restored is not None:
        state, data_state = restored
    return Run(config, workdir, model_config, tokenizer, dp, state, data_state, checkpointer)
