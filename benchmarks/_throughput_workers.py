"""train_throughput.py's workers: the library's jitted training step, and PyTorch's in a child
process; each times ``run(n)`` steps (wall-clock and process CPU seconds of each).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
import time

from _throughput_settings import LABEL_SMOOTHING, VARIANTS, WARMUP_STEPS, Setting, random_batch


class JaxStep:
    """The library's jitted ``train_step`` on one fixed batch; ``run(n)`` times n steps.

    ``variant`` (a key of ``VARIANTS``) changes model fields, the dropout key's PRNG
    implementation (a typed key as the state's ``rng``) or the parallel wrapper;
    ``kernels`` is ``TransformerConfig.kernels``.
    """

    def __init__(self, setting: Setting, variant: str = "default", kernels: str = "auto") -> None:
        import flax.linen
        import jax

        from transformer_jax import Transformer, TransformerConfig
        from transformer_jax.training.mesh import make_parallel
        from transformer_jax.training.optimizer import transformer_optimizer, transformer_schedule
        from transformer_jax.training.steps import create_train_state, train_step

        options = VARIANTS[variant]
        fields = {**setting.model, **options.get("model", {})}
        fields["kernels"] = kernels
        self.config = TransformerConfig(**fields)
        model = Transformer(self.config)
        batch = random_batch(setting, tgt_vocab=self.config.tgt_vocab)
        key = jax.random.PRNGKey(0)
        params = jax.jit(lambda k: model.init(k, batch["src"][:1], batch["tgt_in"][:1]))(key)
        tx = transformer_optimizer(transformer_schedule(self.config.d_model, WARMUP_STEPS))
        rng_impl = options.get("rng_impl")
        rng = jax.random.key(1, impl=rng_impl) if rng_impl else jax.random.PRNGKey(1)
        state = create_train_state(flax.linen.unbox(params["params"]), tx, rng)
        parallel = options.get("parallel", "jit")
        if parallel == "jit":
            step = functools.partial(train_step, model=model, label_smoothing=LABEL_SMOOTHING)
            self._step = jax.jit(step, donate_argnums=(0,))
            self.state, self.batch = state, jax.device_put(batch)
        else:  # the training loop's path: pmap or shard_map over the local devices
            dp = make_parallel(parallel, model, LABEL_SMOOTHING)
            self._step = dp.train_step
            self.state, self.batch = dp.replicate(state), batch
        self.jitted = parallel == "jit"

    def step(self) -> None:
        import jax

        self.state, metrics = self._step(self.state, self.batch)
        jax.block_until_ready((self.state, metrics))

    def optimized_hlo(self) -> str:
        """XLA's optimised HLO of the jitted step (compiled again, not run)."""
        return self._step.lower(self.state, self.batch).compile().as_text()

    def run(self, steps: int) -> tuple[list[float], list[float]]:
        """Wall-clock and process CPU seconds of each of ``steps`` steps."""
        times, cpu = [], []
        for _ in range(steps):
            start, start_cpu = time.perf_counter(), time.process_time()
            self.step()
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        return times, cpu


class TorchWorker:
    """``benchmarks/torch_baseline.py`` in a child process, driven over stdin/stdout."""

    def __init__(
        self, setting: Setting, threads: int, system_malloc: bool, precision: str = "float32"
    ) -> None:
        from transformer_jax.kernels.malloc import retaining_environment

        spec = dict(
            dataclasses.asdict(setting),
            threads=threads,
            label_smoothing=LABEL_SMOOTHING,
            warmup_steps=WARMUP_STEPS,
            matmul_precision=precision,
        )
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_baseline.py")
        env = dict(os.environ, **({} if system_malloc else retaining_environment()))
        self.proc = subprocess.Popen(
            [sys.executable, script, json.dumps(spec)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.run(1)  # imports torch, builds the model, takes the first step

    def run(self, steps: int) -> tuple[list[float], list[float]]:
        """Wall-clock and process CPU seconds of each of ``steps`` steps."""
        self.proc.stdin.write(f"{steps}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(
                "the torch worker exited; is torch installed? (pip install -e .[torch])"
            )
        answer = json.loads(line)
        return answer["times"], answer["cpu"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
