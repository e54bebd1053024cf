"""Several processes (hosts) training one model, and the signals a run acts on.

``distributed``: the launch (``jax.distributed``), per-step agreement and one writer;
``coordinator``: process 0's coordination service in a process of its own; ``peers``:
agreeing on the launch and a heartbeat, so that every process ends with one line;
``signals``: SIGTERM, SIGINT and SIGUSR1 during training, acted on by every process at the
same step; ``preemption``: the train command's exit code and handler for a SIGTERM before
training starts; ``jax_private``: the private JAX names these use, in one place. The
training loop (:mod:`transformer_jax.training.loop`) and the train command use them;
importing them installs no handler.
"""
