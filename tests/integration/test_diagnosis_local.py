"""Each failure users hit most, provoked for real on the local backend (real sshd, Open MPI, bash),
and the task's message that names its cause and fix. Where the spec already refuses the cause,
tests/unit/test_bad_input.py tests the refusal; here are the ones only a running job shows.

Fault knobs are test-only: env the launch script reads (``AIRFLOW_MPI_SSHD``, set on the rendered
plan, never allowed in a spec), the pods' PATH (``LocalBackend(path=...)``), and ordinary volumes.
Run under the integration lock: they start sshd, mpiexec and namespaces.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.exceptions import JobFailed, MPIJobError, SshdNotReady
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.observe.diagnosis import Cause
from airflow_mpi.runner.job import JobRunner
from tests.faults import FaultRow
from tests.integration.test_local_backend import Log, make_plan, with_worker_env
from tests.leaks import ours

PY = sys.executable


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def path_without(root: Path, hidden: set[str]) -> str:
    """A PATH with every program of this one except ``hidden`` (a directory of symlinks)."""
    farm = root / ("path-without-" + "-".join(sorted(hidden)))
    farm.mkdir()
    directories = [os.path.dirname(PY), *os.environ["PATH"].split(os.pathsep)]
    for directory in directories:
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            target = farm / entry.name
            if entry.name not in hidden and not target.exists() and os.access(entry.path, os.X_OK):
                target.symlink_to(entry.path)
    return str(farm)


def provoke(
    backend: LocalBackend,
    plan: JobPlan,
    fault: str,
    fault_row: FaultRow,
    expected: type[MPIJobError] = JobFailed,
) -> MPIJobError:
    """Run the job to its failure; record the fault table's row; nothing may be left."""
    started = time.monotonic()
    with pytest.raises(expected) as caught:
        JobRunner(backend, plan, Log()).run()
    seconds = time.monotonic() - started
    left = backend.leftovers(plan.job_name) + ours()
    fault_row(fault, "local", "waiting", "failed", seconds, str(caught.value), left)
    assert left == []
    return caught.value


def first_line(error: BaseException) -> str:
    return str(error).splitlines()[0]


@pytest.mark.fault
def test_sshd_without_privilege_separation_directory(
    backend: LocalBackend, shared_dir: Path, fault_row: FaultRow
) -> None:
    # Inside the worker's own mount namespace: an empty /run over the pod's (the job's ssh files
    # moved aside and back), so /run/sshd does not exist when the real sshd starts.
    wrapper = executable(
        shared_dir / "sshd-without-run-sshd",
        "#!/bin/bash\nset -e\nmkdir -p /tmp/keep\nmount --move /run/airflow-mpi /tmp/keep\n"
        "mount -t tmpfs -o size=1m tmpfs /run\nmkdir /run/airflow-mpi\nmount --move /tmp/keep /run/airflow-mpi\n"
        'exec /usr/sbin/sshd "$@"\n',
    )
    plan = with_worker_env(make_plan(["true"], startup_timeout=30), AIRFLOW_MPI_SSHD=str(wrapper))
    error = provoke(backend, plan, "sshd: missing /run/sshd", fault_row)
    assert first_line(error) == (
        f"MPI job {plan.job_name} failed before sshd was ready: sshd exited: its privilege separation "
        "directory /run/sshd does not exist"
    )
    assert "fix: create it before sshd starts: mkdir -p /run/sshd; chmod 0755 /run/sshd" in str(error)
    assert "seen: Missing privilege separation directory: /run/sshd" in str(error)


@pytest.mark.fault
def test_sshd_not_listening(backend: LocalBackend, shared_dir: Path, fault_row: FaultRow) -> None:
    fake = executable(shared_dir / "sshd-that-never-listens", "#!/bin/bash\nexec sleep 300\n")
    plan = with_worker_env(make_plan(["true"], startup_timeout=3), AIRFLOW_MPI_SSHD=str(fake))
    error = provoke(backend, plan, "sshd not listening", fault_row, SshdNotReady)
    assert first_line(error).startswith(f"MPI job {plan.job_name}: workers never accepted ssh: sshd is not running")
    assert error.causes == (Cause.SSHD_NOT_LISTENING.value,)  # type: ignore[attr-defined]
    assert "port closed: nothing listens on port 22" in str(error)


@pytest.mark.fault
def test_authorized_keys_with_wrong_modes_under_strict_modes(
    backend: LocalBackend, shared_dir: Path, fault_row: FaultRow
) -> None:
    wrapper = executable(
        shared_dir / "sshd-with-open-authorized-keys",
        '#!/bin/bash\nchmod 0666 /run/airflow-mpi/ssh/authorized_keys\nexec /usr/sbin/sshd "$@"\n',
    )
    plan = with_worker_env(make_plan(["true"], startup_timeout=4), AIRFLOW_MPI_SSHD=str(wrapper))
    error = provoke(backend, plan, "Permission denied (publickey): modes", fault_row, SshdNotReady)
    assert first_line(error).startswith(
        f"MPI job {plan.job_name}: workers never accepted ssh: sshd (StrictModes) refused the job key"
    )
    assert "seen: Authentication refused: bad ownership or modes for file /run/airflow-mpi/ssh/authorized_keys" in (
        str(error)
    )
    assert error.causes[:2] == (Cause.SSHD_BAD_MODES.value, Cause.SSH_KEY_REFUSED.value)  # type: ignore[attr-defined]


@pytest.mark.fault
def test_a_command_that_runs_its_own_mpirun_as_root(
    backend: LocalBackend, shared_dir: Path, fault_row: FaultRow
) -> None:
    script = executable(shared_dir / "run.sh", "#!/usr/bin/env bash\nmpirun -np 1 hostname\n")
    plan = make_plan(["bash", str(script)], workers={"replicas": 1})
    error = provoke(backend, plan, "mpirun refuses root", fault_row)
    assert first_line(error) == (
        f"MPI job {plan.job_name} failed: mpiexec refused to run as root (Open MPI needs --allow-run-as-root for root)"
    )
    assert "if your command starts its own mpirun or mpiexec, remove it" in str(error)


@pytest.mark.fault
def test_a_nested_deepspeed_launcher(backend: LocalBackend, shared_dir: Path, fault_row: FaultRow) -> None:
    # Validation refuses ["deepspeed", ...]; a script that runs it cannot be seen before the job.
    # Each of the two ranks starts its own DeepSpeed launcher, whose one process is rank 0 of a
    # world of 1; the training script's own sanity check (the world it joined is the one mpiexec
    # started) fails, as a real job's batch-size or data-shard arithmetic would.
    train = shared_dir / "train.py"
    train.write_text(
        "import os\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "mpi_size = int(os.environ['OMPI_COMM_WORLD_SIZE'])\n"
        "assert dist.get_world_size() == mpi_size, f'world of {dist.get_world_size()}, mpiexec started {mpi_size}'\n"
    )
    script = executable(shared_dir / "run.sh", f"#!/usr/bin/env bash\nexec deepspeed {train}\n")
    plan = make_plan(["bash", str(script)], workers={"replicas": 0}, master={"cpu": 2}, timeout=240)
    error = provoke(backend, plan, "nested deepspeed launcher", fault_row)
    assert first_line(error) == (
        f"MPI job {plan.job_name} failed: a second launcher (deepspeed, torchrun or horovodrun) runs inside the "
        "ranks mpiexec started: each starts its own processes, so ranks clash (wrong world size, the same rank "
        "twice, ports in use)"
    )
    assert "under mpiexec run the training script itself" in str(error) and "[launch.py:" in str(error)


@pytest.mark.fault
@pytest.mark.parametrize("case", ["no execute bit", "windows line ends"])
def test_a_script_run_without_bash(backend: LocalBackend, shared_dir: Path, fault_row: FaultRow, case: str) -> None:
    train = shared_dir / "train"  # no suffix: the spec cannot tell it is a script
    if case == "no execute bit":
        train.write_text("#!/usr/bin/env bash\necho training\n")
    else:
        executable(train, "#!/bin/bash\r\necho training\r\n")
    plan = make_plan([str(train)], workers={"replicas": 1})
    error = provoke(backend, plan, f"script without bash ({case})", fault_row)
    assert first_line(error) == (
        f"MPI job {plan.job_name} failed: the command is a script run without its interpreter, and the system "
        "could not execute it (its mode bits or its #! line are wrong in the pod)"
    )
    assert "fix: run it through its interpreter: ['bash', 'run.sh', ...]" in str(error)


@pytest.mark.fault
def test_no_mpiexec_in_the_image(state_root: Path, shared_dir: Path, fault_row: FaultRow) -> None:
    backend = LocalBackend(state_dir=state_root, path=path_without(shared_dir, {"mpiexec", "mpirun", "orterun"}))
    plan = make_plan(["true"], workers={"replicas": 1})
    error = provoke(backend, plan, "no mpiexec in the image", fault_row)
    assert first_line(error) == f"MPI job {plan.job_name} failed: the image has no mpiexec on the master's PATH"
    assert "apt-get install openmpi-bin" in str(error) and "mpiexec: not found" in str(error)


@pytest.mark.fault
def test_no_sshd_in_the_image(backend: LocalBackend, shared_dir: Path, fault_row: FaultRow) -> None:
    empty = shared_dir / "empty-sbin"
    empty.mkdir()
    volume = {"name": "no-sbin", "host_path": str(empty), "mount_path": "/usr/sbin", "read_only": True}
    plan = make_plan(["true"], workers={"replicas": 1}, pod={"volumes": [volume]})
    error = provoke(backend, plan, "no sshd in the image", fault_row)
    assert first_line(error) == (
        f"MPI job {plan.job_name} failed before sshd was ready: the image has no sshd: /usr/sbin/sshd is missing, "
        "so a worker cannot accept mpiexec's ssh logins"
    )
    assert "apt-get install openssh-server" in str(error)


@pytest.mark.fault
def test_orted_not_on_the_path_of_ssh_sessions(state_root: Path, shared_dir: Path, fault_row: FaultRow) -> None:
    backend = LocalBackend(state_dir=state_root, path=path_without(shared_dir, {"orted"}))
    plan = make_plan(["hostname"], workers={"replicas": 1})
    error = provoke(backend, plan, "orted not on PATH over ssh", fault_row)
    assert first_line(error).startswith(
        f"MPI job {plan.job_name} failed: the MPI's daemon is not found in a worker's ssh session"
    )
    assert "seen: bash: line 1: orted: command not found" in str(error)


def test_a_healthy_job_through_the_same_knobs_succeeds(state_root: Path, shared_dir: Path) -> None:
    """The PATH knob itself breaks nothing: only the hidden program is missing."""
    backend = LocalBackend(state_dir=state_root, path=path_without(shared_dir, {"deepspeed"}))
    log = Log()
    result = JobRunner(backend, make_plan(["hostname"], workers={"replicas": 1}), log).run()
    assert result.exit_code == 0 and len([line for line in log.lines if line.startswith("[1,")]) == 2
    assert ours() == []
