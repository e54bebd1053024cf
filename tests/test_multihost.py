"""Multi-host training as a cluster user runs it: the launch flags and their precedence over
the environment, refusal of a multi-process launch without ``--multihost``, and two real
``train.py`` processes on 127.0.0.1 (CPU collectives over gloo) that train, stop on
signals, snapshot and resume in step, equal to one process with two devices."""

import os
import re
import subprocess
import sys

import pytest

from transformer_jax.training import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
