"""Train a Transformer: ``python train.py`` trains configs/tiny.py on the embedded data.

    python train.py --config configs/base.py --workdir runs/base
    python train.py --config configs/tiny.py --config.train.num_steps=500

Any config field can be overridden with ``--config.<section>.<field>=value``; the
workdir defaults to ``runs/<config file name>``. Rerunning resumes from the last
checkpoint. ``--multihost`` starts one process of a run over several hosts (README,
Multi-host): ``--coordinator_address``, ``--num_processes`` and ``--process_id``, or what
SLURM, Open MPI or Kubernetes tell JAX; each process trains on its share of every batch.
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from transformer_jax.kernels.malloc import retain_freed_memory
from transformer_jax.kernels.vectors import prefer_wide_vectors
from transformer_jax.training import distributed
from transformer_jax.training.loop import train_and_evaluate

_HERE = os.path.dirname(os.path.abspath(__file__))
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(_HERE, "configs", "tiny.py"), "Run configuration file."
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (default runs/<config name>).")
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False, "One process of a run over several processes (jax.distributed)."
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 (implies --multihost)."
)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "Processes in the run (implies --multihost)."
)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "This process's index, 0 to num_processes - 1 (implies --multihost)."
)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    name = os.path.splitext(os.path.basename(flags.FLAGS["config"].config_filename))[0]
    workdir = _WORKDIR.value or os.path.join("runs", name)
    logging.set_verbosity(logging.WARNING)  # Orbax logs every file it writes at INFO
    retain_freed_memory()  # before JAX starts its threads: steps reuse freed pages
    prefer_wide_vectors()  # before the first computation: XLA reads its flags then
    try:
        distributed.initialize(
            _MULTIHOST.value,
            coordinator_address=_COORDINATOR.value,
            num_processes=_NUM_PROCESSES.value,
            process_id=_PROCESS_ID.value,
        )
        train_and_evaluate(_CONFIG.value, workdir)
    except (ValueError, FloatingPointError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
