"""Multi-host training as a cluster user runs it: the launch flags and their precedence over
the environment, refusal of a multi-process launch without ``--multihost``, and two real
``train.py`` processes on 127.0.0.1 (CPU collectives over gloo) that train, stop on
signals, snapshot and resume in step, equal to one process with two devices; two processes
that decode their shares of the evaluation translations and each receive all of them."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest
from conftest import ROOT as REPO_ROOT

from transformer_jax.multihost import distributed, peers
from transformer_jax.training import checkpoints
from transformer_jax.training.logs import read_metrics
from transformer_jax.training.workdir import lock_workdir

ROOT = str(REPO_ROOT)

MPIRUN_ENV = {  # what `mpirun -np 2` (Open MPI) gives the process of rank 1
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1:34911",
}
SRUN_ENV = {  # `srun --nodes=2 --ntasks=4`: two tasks per node, task 3
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_NODELIST": "node[001-002]",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
}


def test_single_process_without_a_launcher():
    assert distributed.launch_arguments(False, environ={}) is None
    batch_script = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "8", "SLURM_PROCID": "0"}
    assert distributed.launch_arguments(False, environ=batch_script) is None  # not under srun


@pytest.mark.parametrize(
    "environ, named",
    [
        (MPIRUN_ENV, "Open MPI (OMPI_COMM_WORLD_SIZE=2)"),
        (SRUN_ENV, "SLURM (SLURM_STEP_NUM_TASKS=4)"),
        ({"PMI_SIZE": "2", "PMI_RANK": "0"}, "MPICH or Intel MPI (PMI_SIZE=2)"),
        ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, "JAX_COORDINATOR_ADDRESS=10.0.0.1:1234"),
    ],
)
def test_a_launcher_without_the_switch_is_refused(environ, named):
    with pytest.raises(ValueError, match=re.escape(f"by {named}, but without --multihost")) as e:
        distributed.launch_arguments(False, environ=environ)
    assert "\n" not in str(e.value)


def test_flags_take_precedence_over_the_environment():
    arguments = distributed.launch_arguments(
        False, "127.0.0.1:5000", 2, 0, environ={**SRUN_ENV, "JAX_COORDINATOR_ADDRESS": "x:1"}
    )
    assert arguments == {
        "coordinator_address": "127.0.0.1:5000",
        "num_processes": 2,
        "process_id": 0,
    }


def test_what_the_flags_leave_out_jax_detects():
    assert distributed.launch_arguments(True, environ=SRUN_ENV) == dict.fromkeys(
        distributed.LAUNCH_FLAGS
    )
    given = distributed.launch_arguments(True, num_processes=2, environ=MPIRUN_ENV)
    assert given == {"coordinator_address": None, "num_processes": 2, "process_id": None}


def test_one_task_per_node_uses_every_gpu_of_the_node():
    per_node = {**SRUN_ENV, "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2"}
    assert distributed.launch_arguments(True, environ=per_node)["local_device_ids"] == []
    assert "local_device_ids" not in distributed.launch_arguments(True, environ=SRUN_ENV)
    mpirun_per_node = {**MPIRUN_ENV, "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
    assert distributed.launch_arguments(True, environ=mpirun_per_node)["local_device_ids"] == []


@pytest.mark.parametrize(
    "launch, message",
    [
        ({}, "--multihost needs --coordinator_address, --num_processes, --process_id"),
        ({"coordinator_address": "h:1"}, "--multihost needs --num_processes, --process_id"),
        ({"num_processes": 2, "process_id": 2, "coordinator_address": "h:1"}, "--process_id"),
    ],
)
def test_incomplete_launch_values_are_named(launch, message):
    with pytest.raises(ValueError, match=message):
        distributed.launch_arguments(True, environ={}, **launch)


def test_coordinator_address_from_the_environment():
    arguments = distributed.launch_arguments(
        True, num_processes=2, process_id=1, environ={"JAX_COORDINATOR_ADDRESS": "h:9"}
    )
    assert arguments["coordinator_address"] == "h:9"


def test_a_launch_difference_names_the_field_and_both_values():
    mine = {"num_processes": 2, "config": {"train": {"num_steps": 20, "seed": 0}}}
    theirs = {"num_processes": 2, "config": {"train": {"num_steps": 10, "seed": 0}}}
    assert peers._differences(mine, mine, 1) is None
    assert peers._differences(mine, theirs, 0) == (
        "the config differs from process 0's: train.num_steps=10 there, 20 here"
    )
    newer = {"num_processes": 2, "config": {"train": {"num_steps": 10, "seed": 0, "new": 1}}}
    assert peers._differences(newer, theirs, 0).endswith("train.new=None there, 1 here")
    assert peers._differences({**mine, "num_processes": 3}, theirs, 1) == (
        "--num_processes=3 here but 2 on process 1"
    )


def test_the_coordinator_process_finds_the_package_this_process_found(monkeypatch):
    """``python train.py`` found the package in its script's folder alone: the child
    (``-m transformer_jax.multihost.coordinator``) gets that folder on PYTHONPATH."""
    assert distributed.with_package_on_path({"A": "1"}) == {"A": "1"}  # on sys.path: as is
    elsewhere = [p for p in sys.path if os.path.abspath(p) != ROOT]
    monkeypatch.setattr(sys, "path", [ROOT, *elsewhere])
    env = distributed.with_package_on_path({"PYTHONPATH": "/x"})
    assert env["PYTHONPATH"] == os.pathsep.join([ROOT, "/x"])


def test_process_zeros_coordination_service_outlives_it_for_the_grace_time_only():
    """Started as process 0 starts it: ready, then gone ``grace`` s after process 0's end
    (stdin closed without ``done``), or at once after ``done``."""
    module = "transformer_jax.multihost.coordinator"
    env = distributed.with_package_on_path({k: v for k, v in os.environ.items()})
    for said, lives in ((b"", 3), (b"done\n", 0)):
        child = subprocess.Popen(
            [sys.executable, "-m", module, f"[::]:{free_port()}", "2", "60", str(lives)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd="/",  # the package is found through PYTHONPATH alone
        )
        assert child.stdout.readline() == b"ready\n"
        child.stdin.write(said)
        child.stdin.close()
        started = time.time()
        assert child.wait(timeout=30) == 0
        assert lives <= time.time() - started < lives + 2


def test_train_py_under_mpirun_without_the_switch_is_refused_in_one_line(tmp_path):
    workdir = tmp_path / "run"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, **MPIRUN_ENV)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), f"--workdir={workdir}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: launched as one of several processes by Open MPI (OMPI_COMM_WORLD_SIZE=2), "
        "but without --multihost: each would train alone in the same workdir; add "
        "--multihost (README, Multi-host) or start a single process"
    ]
    assert not workdir.exists()  # refused before anything was written


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_env(**extra):
    """A CPU-only environment that imports this checkout, without launcher variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "SLURM_", "PMI_"))}
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, **extra)
    return env


COLLECTIVES = textwrap.dedent(
    """
    import sys
    import jax
    from transformer_jax.multihost import distributed, peers

    port, index = sys.argv[1], int(sys.argv[2])
    assert distributed.initialize(False, coordinator_address=f"127.0.0.1:{port}",
                                  num_processes=2, process_id=index)
    seen = [distributed.any_process([index == 1, False, index == 0])() for _ in range(2)]
    data = distributed.from_process_zero(lambda: b"made by process %d" % index)

    def fails():
        raise ValueError("no training sentences")

    try:
        distributed.from_process_zero(fails)
        failed = "nothing"
    except ValueError as e:
        failed = str(e)
    print(f"RESULT {seen} {data!r} {failed}", flush=True)
    """
)


def run_two(script, *args, timeout=120):
    """``script`` as processes 0 and 1 of two on 127.0.0.1 (argv: port, index, ``args``);
    the line each printed starting with ``RESULT``."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(port), str(i), *args],
            env=cpu_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outs = []
    try:
        for proc in procs:
            outs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            proc.kill()
    results = []
    for out in outs:
        line = next((x for x in out.splitlines() if x.startswith("RESULT")), None)
        assert line, out[-3000:]
        results.append(line)
    return results


def test_two_processes_agree_on_flags_and_receive_process_zeros_bytes():
    results = run_two(COLLECTIVES)
    assert results[0] == (
        "RESULT [(True, False, True), (True, False, True)] b'made by process 0' "
        "no training sentences"
    )
    assert results[1] == (
        "RESULT [(True, False, True), (True, False, True)] b'made by process 0' "
        "process 0: no training sentences"
    )


MICRO = """
import sys
sys.path.insert(0, {root!r})
from configs.tiny import get_config as tiny


def get_config():
    config = tiny()
    config.model.update(vocab_size=300, d_model=32, num_heads=2, d_ff=64,
                        num_encoder_layers=1, num_decoder_layers=1)
    config.data.update(tokens_per_batch=256, tokenizer_train_sentences=2000)
    config.train.update(num_steps=16, warmup_steps=10, log_every=1, checkpoint_every=4,
                        eval_sentences=0, final_test=False, keep_checkpoints=50,
                        parallel={parallel!r}, grad_accum_steps={accum})
    return config
"""


class Launch:
    """``train.py`` as the README's Multi-host section runs it: one process per host, here
    both on 127.0.0.1 with one CPU device each (or one process with two devices)."""

    def __init__(self, tmp_path, parallel="pmap", accum=1):
        self.config = tmp_path / f"micro_{parallel}_{accum}.py"
        self.config.write_text(MICRO.format(root=ROOT, parallel=parallel, accum=accum))
        self.cache = tmp_path / "xla_cache"  # one compilation per program for all runs

    def env(self, **extra):
        return cpu_env(
            JAX_COMPILATION_CACHE_DIR=str(self.cache),
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            **extra,
        )

    def start(self, workdir, num_processes=2, overrides=()):
        """Start the processes of one run; their output goes to ``{workdir}.{i}.log``."""
        command = [sys.executable, os.path.join(ROOT, "train.py"), f"--config={self.config}"]
        command += [f"--workdir={workdir}", *overrides]
        if num_processes == 1:
            flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"
            env = self.env(XLA_FLAGS=flags.strip())
            return [self._popen(command, env, f"{workdir}.0.log")]
        address = f"127.0.0.1:{free_port()}"
        return [
            self._popen(
                command
                + [
                    f"--coordinator_address={address}",
                    f"--num_processes={num_processes}",
                    f"--process_id={i}",
                ],
                self.env(),
                f"{workdir}.{i}.log",
            )
            for i in range(num_processes)
        ]

    @staticmethod
    def _popen(command, env, log):
        with open(log, "w") as out:
            proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        proc.log = log
        return proc

    def run(self, workdir, num_processes=2):
        return finish(self.start(workdir, num_processes))


def output(proc):
    with open(proc.log) as f:
        return f.read()


def finish(procs, code=0, timeout=300):
    """Wait for every process (killing all if one overruns) to exit with ``code`` (75:
    stopped by SIGTERM); their outputs."""
    end = time.time() + timeout
    try:
        for proc in procs:
            proc.wait(timeout=max(end - time.time(), 1))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    outs = [output(proc) for proc in procs]
    for proc, out in zip(procs, outs, strict=True):
        assert proc.returncode == code, out[-3000:]
    return outs


def wait_for(predicate, procs, timeout=240):
    end = time.time() + timeout
    while not predicate():
        for proc in procs:
            assert proc.poll() is None, output(proc)[-3000:]
        assert time.time() < end, "timed out"
        time.sleep(0.05)


def losses(workdir):
    """Loss per logged training step of ``metrics.jsonl`` (each step exactly once)."""
    steps = [r for r in read_metrics(str(workdir)) if "learning_rate" in r]
    assert len({r["step"] for r in steps}) == len(steps), "a step was logged twice"
    return {r["step"]: r["loss"] for r in steps}


def logged_step(workdir):
    return max(losses(workdir), default=0) if os.path.isfile(workdir / "metrics.jsonl") else 0


def assert_same_run(workdir, reference):
    assert losses(workdir) == losses(reference)
    _, params, step = checkpoints.load_run(str(workdir))
    _, expected, expected_step = checkpoints.load_run(str(reference))
    assert step == expected_step == 16
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(a, b)


def prepared(reference, workdir):
    """A workdir holding the reference run's tokenizer and encoded data."""
    os.makedirs(workdir)
    shutil.copy(reference / "tokenizer.model", workdir)
    shutil.copytree(reference / "data_cache", workdir / "data_cache")
    return workdir


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """An uninterrupted two-process run (which trains its own tokenizer) and its launcher."""
    tmp = tmp_path_factory.mktemp("multihost")
    launch = Launch(tmp)
    reference = tmp / "reference"
    outs = launch.run(reference)
    return launch, reference, outs


@pytest.mark.integration
def test_two_processes_equal_one_process_with_two_devices(two_processes, tmp_path):
    launch, reference, outs = two_processes
    assert "train: 100%" in outs[0] and "train:" not in outs[1]  # one progress bar
    for once in ("2 device(s)", "evaluating step 16", "dev: loss", "workdir: "):  # process 0's
        assert once in outs[0] and once not in outs[1], (once, outs)
    assert sorted(losses(reference)) == list(range(1, 17))  # process 0 alone logs
    assert not [f for f in os.listdir(reference) if f.endswith(".tmp")]
    launch.run(prepared(reference, tmp_path / "one"), num_processes=1)
    assert_same_run(tmp_path / "one", reference)

    def padding(workdir):  # the token counts of every process's batches
        return [r["padding_efficiency"] for r in read_metrics(str(workdir)) if "loss" in r]

    assert padding(reference) == padding(tmp_path / "one")


@pytest.mark.integration
def test_shard_map_with_accumulation_two_processes_equal_one(two_processes, tmp_path):
    _, reference, _ = two_processes
    launch = Launch(tmp_path, parallel="shard_map", accum=2)
    two = prepared(reference, tmp_path / "two")
    launch.run(two)
    launch.run(prepared(reference, tmp_path / "one"), num_processes=1)
    assert_same_run(tmp_path / "one", two)


@pytest.mark.integration
def test_a_workdir_in_use_stops_every_process_with_one_line(two_processes, tmp_path):
    launch, reference, _ = two_processes
    workdir = prepared(reference, tmp_path / "run")
    with lock_workdir(str(workdir)):  # another train.py holds the workdir
        outs = finish(launch.start(workdir), code=1)
    for out in outs:
        errors = [line for line in out.splitlines() if "error" in line.lower()]
        assert len(errors) == 1 and "is in use by another process" in errors[0], out
    assert outs[1].count("error: process 0: workdir") == 1


@pytest.mark.integration
def test_signals_to_one_process_act_on_both_then_resume_equals_the_uninterrupted_run(
    two_processes, tmp_path
):
    launch, reference, _ = two_processes
    workdir = prepared(reference, tmp_path / "run")
    # A checkpoint at every step: the snapshot always follows a checkpoint of its own step.
    procs = launch.start(workdir, overrides=["--config.train.checkpoint_every=1"])
    wait_for(lambda: logged_step(workdir) >= 2, procs)
    procs[1].send_signal(signal.SIGUSR1)  # a snapshot, and training goes on
    snapshots = workdir / "snapshots"
    wait_for(lambda: snapshots.is_dir() and any(map(str.isdigit, os.listdir(snapshots))), procs)
    procs[1].send_signal(signal.SIGTERM)  # process 1 only: both stop at one step
    outs = finish(procs, code=75)
    snapshot = {int(re.search(r"saved the parameters of step (\d+)", o)[1]) for o in outs}
    stopped = {int(re.search(r"SIGTERM: saved the checkpoint at step (\d+)", o)[1]) for o in outs}
    assert len(snapshot) == len(stopped) == 1, outs
    assert os.listdir(snapshots) == [str(*snapshot)]
    assert max(stopped) < 16 and max(stopped) in checkpoints.list_steps(str(workdir))
    assert max(losses(workdir)) == max(stopped)

    outs = launch.run(workdir)
    assert all(f"resuming from the checkpoint at step {max(stopped)}" in out for out in outs)
    assert_same_run(workdir, reference)


@pytest.mark.integration
def test_sigterm_to_both_processes_steps_apart_saves_one_checkpoint(two_processes, tmp_path):
    launch, reference, _ = two_processes
    workdir = prepared(reference, tmp_path / "run")
    procs = launch.start(workdir)
    wait_for(lambda: logged_step(workdir) >= 2, procs)
    procs[0].send_signal(signal.SIGTERM)
    time.sleep(0.3)  # a few steps of this model
    procs[1].send_signal(signal.SIGTERM)
    outs = finish(procs, code=75)
    stopped = {int(re.search(r"SIGTERM: saved the checkpoint at step (\d+)", o)[1]) for o in outs}
    assert len(stopped) == 1 and max(stopped) in checkpoints.list_steps(str(workdir))
    launch.run(workdir)
    assert_same_run(workdir, reference)


@pytest.mark.integration
def test_sigkill_of_one_process_then_a_relaunch_resumes(two_processes, tmp_path):
    launch, reference, _ = two_processes
    workdir = prepared(reference, tmp_path / "run")
    procs = launch.start(workdir)
    wait_for(lambda: logged_step(workdir) >= 5, procs)  # the checkpoint of step 4 is written
    procs[1].kill()
    time.sleep(2)
    procs[0].kill()  # what the launcher does to the job when one of its tasks dies
    for proc in procs:
        proc.wait()
    killed_at = logged_step(workdir)
    assert killed_at < 16, "the run finished before it was killed"
    outs = launch.run(workdir)
    saved = [s for s in checkpoints.list_steps(str(workdir)) if s <= killed_at]
    for out in outs:
        assert f"resuming from the checkpoint at step {max(saved)}" in out, out[-3000:]
    assert_same_run(workdir, reference)


@pytest.mark.integration
def test_an_unreadable_checkpoint_is_set_aside_once_with_one_line_per_process(
    two_processes, tmp_path
):
    launch, reference, _ = two_processes
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    for root, _, files in os.walk(workdir / "checkpoints" / "16" / "params"):
        for name in files:
            if "ocdbt.process_" in root:
                os.truncate(os.path.join(root, name), 10)
    outs = launch.run(workdir)
    for out in outs:
        assert "Traceback" not in out and "never retrieved" not in out, out
        assert out.count("warning:") == 1, out
        assert "warning: checkpoint 16 in" in out and "is unreadable" in out
        assert "resuming from the checkpoint at step 12" in out
    assert "16.unreadable" in os.listdir(workdir / "checkpoints")
    assert_same_run(workdir, reference)


def start_each(launch, workdir, flags, timeout_flags=("--initialization_timeout=5",)):
    """Start one ``train.py`` per entry of ``flags`` (its own launch flags)."""
    command = [sys.executable, os.path.join(ROOT, "train.py"), f"--config={launch.config}"]
    command += [f"--workdir={workdir}", *timeout_flags]
    return [
        launch._popen(command + list(own), launch.env(), f"{workdir}.{i}.log")
        for i, own in enumerate(flags)
    ]


def assert_one_error_line(out, message):
    errors = [line for line in out.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: ") and message in errors[0], out
    for noise in ("Traceback", "Check failure", "Terminating process", "F1"):
        assert noise not in out, out


@pytest.mark.integration
@pytest.mark.parametrize(
    "case, messages",
    [
        ("--num_processes 3 and 2", ["did not all connect"] * 2),
        (
            "--num_processes 2 and 3",
            ["--num_processes=2 here but 3 on process 1", "--num_processes=3 here but 2 on"],
        ),
        ("a wrong port for process 1", ["did not all connect"] * 2),
        ("--process_id=0 twice", ["did not all connect"] * 2),
        (
            "another config on process 1",
            ["train.num_steps=20 there, 16 here", "train.num_steps=16 there, 20 here"],
        ),
    ],
)
def test_a_launch_mistake_ends_every_process_with_one_line_in_seconds(tmp_path, case, messages):
    launch = Launch(tmp_path)
    address, wrong = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    flags = [[f"--coordinator_address={address}", "--num_processes=2", "--process_id=0"]]
    flags.append(list(flags[0][:2]) + ["--process_id=1"])
    if case == "--num_processes 3 and 2":
        flags[0][1] = "--num_processes=3"
    elif case == "--num_processes 2 and 3":
        flags[1][1] = "--num_processes=3"
    elif case == "a wrong port for process 1":
        flags[1][0] = f"--coordinator_address={wrong}"
    elif case == "--process_id=0 twice":
        flags[1][2] = "--process_id=0"
    else:
        flags[1].append("--config.train.num_steps=20")
    started = time.time()
    outs = finish(start_each(launch, tmp_path / "run", flags), code=1, timeout=50)
    assert time.time() - started < 45
    for out, message in zip(outs, messages, strict=True):
        assert_one_error_line(out, message)


@pytest.mark.integration
@pytest.mark.parametrize("killed", [0, 1])
def test_a_killed_process_ends_the_others_with_one_line_in_seconds(tmp_path, killed):
    """A process killed mid-run (process 0 hosts the coordination service): the other ends
    with one line and exit 1."""
    launch = Launch(tmp_path)
    address = f"127.0.0.1:{free_port()}"
    workdir = tmp_path / "run"
    flags = [
        [f"--coordinator_address={address}", "--num_processes=2", f"--process_id={i}"]
        for i in range(2)
    ]
    timeouts = ("--initialization_timeout=20", "--peer_timeout=3", "--config.train.num_steps=5000")
    procs = start_each(launch, workdir, flags, timeouts)
    wait_for(lambda: logged_step(workdir) >= 2, procs, timeout=150)
    procs[killed].kill()
    started = time.time()
    survivor = procs[1 - killed]
    survivor.wait(timeout=30)
    assert time.time() - started < 15 and survivor.returncode == 1
    assert_one_error_line(output(survivor), "lost")


EVAL_TRANSLATIONS = textwrap.dedent(
    """
    import json, sys
    import jax
    from transformer_jax.data.tokenizer import load_tokenizer
    from transformer_jax.inference import translation
    from transformer_jax.inference.translation import translate_lines
    from transformer_jax.model.config import TransformerConfig
    from transformer_jax.model.transformer import Transformer
    from transformer_jax.multihost import distributed, peers

    port, index, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    assert distributed.initialize(False, coordinator_address=f"127.0.0.1:{port}",
                                  num_processes=2, process_id=index)
    tokenizer = load_tokenizer(path)
    lines = [f"{w} {v}" for w in ("a dog", "the cat", "green field") for v in "xyz"] * 3
    config = TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=16, num_heads=2,
                               d_ff=32, num_encoder_layers=1, num_decoder_layers=1, max_len=24)
    model = Transformer(config)
    src = jax.numpy.ones((1, 4), jax.numpy.int32)
    params = jax.device_get(jax.jit(model.init)(jax.random.PRNGKey(0), src, src)["params"])
    decoded = []
    decode_batch = translation.decode_batch
    translation.decode_batch = lambda *a: decoded.append(len(a[2])) or decode_batch(*a)
    shared = translation.translate_on_devices(config, [params], tokenizer, lines, beam_size=3,
                                              alpha=0.6, max_extra_len=6, batch_size=4)
    batches = len(decoded)
    jax.process_count, jax.process_index = (lambda: 1), (lambda: 0)  # this process alone
    alone = translate_lines(config, params, tokenizer, lines, beam_size=3, max_extra_len=6,
                            batch_size=4)
    print("RESULT " + json.dumps({"shared": shared, "alone": alone, "batches": batches}))
    """
)


@pytest.mark.integration
def test_two_processes_translate_their_batches_and_each_gets_every_translation(tmp_path):
    from transformer_jax.data.tokenizer import train_tokenizer

    path = str(tmp_path / "tokenizer.model")
    words = "a dog the cat green field x y z runs over ein Hund die Katze grünes Feld".split()
    train_tokenizer([" ".join(words[i:] + words[:i]) for i in range(len(words))] * 4, path, 300)
    lines = run_two(EVAL_TRANSLATIONS, path, timeout=240)
    results = [json.loads(line.removeprefix("RESULT ")) for line in lines]
    alone = results[0]["alone"]  # one process decoding every line on one device
    assert len(alone) == 27 and len(set(alone)) > 2
    assert [r["shared"] for r in results] == [alone, alone]
    assert [r["batches"] for r in results] == [4, 3]  # 7 batches of 4 lines, taken in turn
