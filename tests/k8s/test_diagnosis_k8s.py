"""The Kubernetes backend's failures carry the diagnosed cause, waiting and deferred: scripted pods
print what sshd and mpiexec really print, and the task's message leads with the cause and fix."""

from __future__ import annotations

import time
from typing import Any

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import JobFailed
from airflow_mpi.observe.diagnosis import Cause
from airflow_mpi.runner.job import JobRunner
from tests.airflow_helpers import task_states
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.faults import FaultRow
from tests.k8s.conftest import Scripts, job_objects
from tests.k8s.test_kubernetes_backend import Log, make_plan

PRIVSEP = [
    "[airflow-mpi] Starting MPI worker w: sshd on port 22",
    "Missing privilege separation directory: /run/sshd",
]
ORTED = [
    "MPI_NP=3",
    "bash: line 1: orted: command not found",
    "--------------------------------------------------------------------------",
    "ORTE was unable to reliably start one or more daemons.",
    "This usually is caused by:",
    "* not finding the required libraries and/or binaries on",
    "  one or more nodes. Please check your PATH and LD_LIBRARY_PATH",
    "--------------------------------------------------------------------------",
]


def lines_of(text: list[str]) -> Any:
    return lambda: iter(text)


@pytest.mark.fault
def test_worker_sshd_without_privsep_dir_fails_naming_the_cause(
    backend: KubernetesBackend, double: KubeDouble, scripts: Scripts, fault_row: FaultRow
) -> None:
    scripts.on("-worker-1", PodScript(lines=lines_of(PRIVSEP), exit_code=255))
    plan = make_plan(workers=2)
    started = time.monotonic()
    with pytest.raises(JobFailed) as caught:
        JobRunner(backend, plan, Log()).run()
    seconds = time.monotonic() - started
    message = str(caught.value)
    left = job_objects(double, plan.job_name)
    fault_row("sshd: missing /run/sshd", "kubernetes", "waiting", "failed", seconds, message, left)
    assert message.startswith(
        f"MPI job {plan.job_name} failed before sshd was ready: sshd exited: its privilege separation directory"
    )
    assert "mkdir -p /run/sshd; chmod 0755 /run/sshd" in message
    assert "seen: Missing privilege separation directory: /run/sshd" in message
    assert caught.value.causes[0] == Cause.SSHD_PRIVSEP_DIR.value and caught.value.pod == plan.workers[1].name
    assert left == []


@pytest.mark.fault
def test_orted_not_on_the_workers_path_fails_naming_the_cause(
    backend: KubernetesBackend, double: KubeDouble, scripts: Scripts, fault_row: FaultRow
) -> None:
    scripts.on("-master-", PodScript(lines=lines_of(ORTED), exit_code=255))
    plan = make_plan(workers=2)
    started = time.monotonic()
    with pytest.raises(JobFailed) as caught:
        JobRunner(backend, plan, Log()).run()
    seconds = time.monotonic() - started
    message = str(caught.value)
    left = job_objects(double, plan.job_name)
    fault_row("orted not on PATH over ssh", "kubernetes", "waiting", "failed", seconds, message, left)
    assert message.splitlines()[0] == (
        f"MPI job {plan.job_name} failed: the MPI's daemon is not found in a worker's ssh session: "
        "mpiexec starts it there with a non-interactive ssh command (Open MPI 4: orted, 5: prted, by name on the "
        "session's PATH; MPICH and Intel MPI: hydra_pmi_proxy, by the absolute path it has beside mpiexec on the "
        "master)"
    )
    assert "docs/contract.md#orted-command-not-found" in message
    assert caught.value.causes == (Cause.ORTED_NOT_FOUND.value,)
    assert left == []


@pytest.mark.fault
@pytest.mark.usefixtures("connections")
def test_deferred_job_whose_worker_sshd_cannot_start_names_the_cause(
    dagbag: Any, double: KubeDouble, scripts: Scripts, capfd: pytest.CaptureFixture[str], fault_row: FaultRow
) -> None:
    scripts.on("-worker-", PodScript(lines=lines_of(PRIVSEP), exit_code=255))
    # Started with the workers, the master's launch script waits for their sshd meanwhile.
    scripts.on("-master-", PodScript(lines=lambda: iter(["[airflow-mpi] waiting for sshd"])))
    started = time.monotonic()
    dag_run = dagbag.get_dag("mpi_test_k8s_deferred").test()
    seconds = time.monotonic() - started
    out = capfd.readouterr().out
    state = task_states(dag_run)["train"]
    left = job_objects(double)
    cause_line = next((line for line in out.splitlines() if "privilege separation directory" in line), "")
    cause_line = cause_line[cause_line.find("MPI job") :]  # the message, without the log line's prefix
    fault_row("sshd: missing /run/sshd", "kubernetes", "deferrable", state, seconds, cause_line, left)
    assert state == "failed"
    assert (
        "failed before sshd was ready: sshd exited: its privilege separation directory /run/sshd does not exist" in out
    )
    assert "fix: create it before sshd starts: mkdir -p /run/sshd" in out
    assert left == []


def test_a_job_that_succeeds_with_a_nested_launcher_is_warned_about(
    backend: KubernetesBackend, double: KubeDouble, scripts: Scripts
) -> None:
    # On CPUs each nested launcher's process is rank 0 of its own world: nothing fails, N models train alone.
    nested = [
        "[1,0]<stdout>:[2026-11-30 20:32:29,938] [INFO] [launch.py:152:main] WORLD INFO DICT: {'localhost': [0]}",
        "[1,0]<stdout>:rank 0 of 1",
        "[1,1]<stdout>:rank 0 of 1",
    ]
    scripts.on("-master-", PodScript(lines=lines_of(nested), exit_code=0))
    log = Log()
    result = JobRunner(backend, make_plan(workers=1), log).run()
    assert result.exit_code == 0
    warning = next(i for i, line in enumerate(log) if line.startswith("airflow-mpi: WARNING:"))
    assert log[warning] == (
        "airflow-mpi: WARNING: the job succeeded, but a second launcher (deepspeed, torchrun or horovodrun) runs "
        "inside the ranks mpiexec started: each starts its own processes, so ranks clash (wrong world size, the "
        "same rank twice, ports in use)"
    )
    assert log[warning + 1].startswith("  fix: under mpiexec run the training script itself")
    assert log[warning + 2] == f"  seen: {nested[0]}"


def test_a_healthy_job_gets_no_warning(backend: KubernetesBackend, double: KubeDouble, scripts: Scripts) -> None:
    scripts.on("-master-", PodScript(lines=lines_of(["[1,0]<stdout>:epoch 1 loss 0.3"]), exit_code=0))
    log = Log()
    JobRunner(backend, make_plan(workers=1), log).run()
    assert not [line for line in log if "WARNING" in line]
