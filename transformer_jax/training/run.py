"""Starting a training run: the checked config, the tokenizer, the fresh or restored train
state and the checkpointer of a workdir."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax import data as data_lib
from transformer_jax.fields import flatten
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.transformer import Transformer
from transformer_jax.multihost.distributed import from_process_zero
from transformer_jax.training import checkpoints
from transformer_jax.training.mesh import run_parallel
from transformer_jax.training.optimizer import (
    transformer_optimizer,
    transformer_schedule,
    with_cooldown,
)
from transformer_jax.training.parallel import Parallel
from transformer_jax.training.schema import RESUMABLE, RunConfig
from transformer_jax.training.steps import TrainState, create_train_state
from transformer_jax.training.workdir import empty_folders_removed

CONFIG_HISTORY_FILE = "config_history.jsonl"


def config_changes(saved: dict[str, Any], config: RunConfig) -> dict[str, tuple]:
    """``{field: (saved value, new value)}`` of the fields that differ; a field the saved
    config lacks (saved before the field existed) counts as its default."""
    defaults = flatten(RunConfig().to_dict())
    old, new = defaults | flatten(saved), flatten(config.to_dict())
    return {k: (old[k], new[k]) for k in new if k in old and old[k] != new[k]}


def check_resumable(config: RunConfig, workdir: str) -> dict[str, Any] | None:
    """The config saved in ``workdir`` (None if none); ValueError listing the fields that
    differ if ``workdir`` holds checkpoints of a run that ``config`` cannot resume."""
    path = os.path.join(workdir, checkpoints.CONFIG_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}; move it away to start anew") from None
    directory = os.path.join(workdir, checkpoints.CHECKPOINT_DIR)
    has_checkpoints = os.path.isdir(directory) and any(map(str.isdigit, os.listdir(directory)))
    changes = config_changes(saved, config)
    refused = {k: v for k, v in changes.items() if k not in RESUMABLE}
    if has_checkpoints and refused:
        listed = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        raise ValueError(
            f"{workdir!r} holds checkpoints of a run with another config ({listed}); to resume "
            f"it, use the saved values (in {path}); to start a new run, choose another "
            "--workdir. Nothing was changed."
        )
    return saved


def write_config(
    config: RunConfig, workdir: str, previous: dict[str, Any] | None, step: int
) -> None:
    """Write ``{workdir}/config.json``; a change to a saved config is appended to
    ``config_history.jsonl`` first (step, time and each field's old and new value)."""
    if previous is not None:
        changes = config_changes(previous, config)
        if not changes:
            return
        record = {"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "changed": changes}
        with open(os.path.join(workdir, CONFIG_HISTORY_FILE), "a") as f:
            f.write(json.dumps(record) + "\n")
    path = os.path.join(workdir, checkpoints.CONFIG_FILE)
    with open(f"{path}.tmp", "w") as f:
        f.write(config.to_json())
    os.replace(f"{path}.tmp", path)


def run_schedule(config: RunConfig, model_config: TransformerConfig) -> Any:
    """The learning rate of each update: the paper's warmup schedule for ``config.train``,
    decayed to zero over its last ``train.cooldown_steps``."""
    train = config.train
    paper = transformer_schedule(
        model_config.d_model, train.warmup_steps, train.learning_rate_scale
    )
    return with_cooldown(paper, train.num_steps, train.cooldown_steps)


def new_state(model_config: TransformerConfig, config: RunConfig) -> TrainState:
    """Fresh parameters and Adam state for ``config``, traceable (``jax.eval_shape`` gives
    the state's shapes without making it)."""
    model = Transformer(model_config)
    key = jax.random.PRNGKey(config.train.seed)
    init_key, dropout_key = jax.random.split(key)
    dummy = jnp.ones((1, 8), jnp.int32)
    params = nn.unbox(model.init(init_key, dummy, dummy)["params"])  # plain arrays
    tx = transformer_optimizer(
        run_schedule(config, model_config),
        config.train.adam_b1,
        config.train.adam_b2,
        config.train.adam_eps,
        config.train.weight_decay,
    )
    return create_train_state(params, tx, dropout_key)


def init_state(model_config: TransformerConfig, config: RunConfig) -> TrainState:
    """Fresh parameters and Adam state for ``config`` (host numpy)."""
    return jax.device_get(jax.jit(lambda: new_state(model_config, config))())


@dataclasses.dataclass
class Run:
    """A started run: ``state`` is the host train state at step ``start``; ``data_state``
    the saved position of the training data (None for a new run)."""

    config: RunConfig
    workdir: str
    model_config: TransformerConfig
    tokenizer: data_lib.Tokenizer
    dp: Parallel
    state: TrainState
    data_state: dict[str, int] | None
    checkpointer: checkpoints.Checkpointer

    @property
    def start(self) -> int:
        return int(self.state.step)


def start_run(config: RunConfig, model_config: TransformerConfig, workdir: str) -> Run:
    """Restore the newest good checkpoint of ``workdir`` or start anew; ``model_config`` is
    ``validate_config(config)``."""
    os.makedirs(workdir, exist_ok=True)
    previous = check_resumable(config, workdir)  # before anything is written

    target_vocab = model_config.tgt_vocab  # the target side's pieces: the first tgt_vocab

    def tokenizer_bytes() -> bytes:
        vocab_size = config.model.vocab_size
        return data_lib.get_tokenizer(config.data, workdir, vocab_size, target_vocab).model_proto

    def prepare() -> bytes:
        splits = data_lib.run_splits(config.data, config.train.final_test)
        data_lib.prepare_data(config.data, workdir, tokenizer, splits)
        return b""

    with empty_folders_removed(
        data_lib.cache_dir(config.data, workdir)
    ):  # data missing: no empty data_cache/ left
        # trained and written by process 0 alone; the other processes receive its bytes
        tokenizer = data_lib.Tokenizer(from_process_zero(tokenizer_bytes), target_vocab)
        if tokenizer.vocab_size > model_config.src_vocab:
            raise ValueError(
                f"model.vocab_size={model_config.src_vocab} is smaller than the tokenizer's "
                f"{tokenizer.vocab_size} pieces in {workdir}/tokenizer.model"
            )
        from_process_zero(prepare)  # the others then map the files process 0 wrote
    dp = run_parallel(config.train, Transformer(model_config))
    state = init_state(model_config, config)
    checkpointer = checkpoints.Checkpointer(workdir, config.train.keep_checkpoints)
    restored = checkpointer.restore_state(state)
    data_state = None
    if restored is not None:
        state, data_state = restored
    if jax.process_index() == 0:
        write_config(config, workdir, previous, int(state.step))
    return Run(config, workdir, model_config, tokenizer, dp, state, data_state, checkpointer)
