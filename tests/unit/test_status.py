"""The one state machine: pod states -> job phase and cause."""

from __future__ import annotations

import pytest

from airflow_mpi.spec import Role
from airflow_mpi.status import JobPhase, PodPhase, PodState, evaluate_job

M, W = Role.MASTER, Role.WORKER


def pod(name: str, role: Role, phase: PodPhase, **kw: object) -> PodState:
    return PodState(name, role, phase, **kw)  # type: ignore[arg-type]


CASES = [
    (
        "workers starting",
        [pod("w0", W, PodPhase.PENDING), pod("w1", W, PodPhase.RUNNING, ready=True)],
        JobPhase.STARTING,
        None,
    ),
    ("workers ready", [pod("w0", W, PodPhase.RUNNING, ready=True)], JobPhase.READY, None),
    ("no workers", [], JobPhase.READY, None),
    (
        "master pending",
        [pod("m", M, PodPhase.PENDING), pod("w0", W, PodPhase.RUNNING, ready=True)],
        JobPhase.RUNNING,
        None,
    ),
    (
        "master running",
        [pod("m", M, PodPhase.RUNNING), pod("w0", W, PodPhase.RUNNING, ready=True)],
        JobPhase.RUNNING,
        None,
    ),
    (
        "master done",
        [pod("m", M, PodPhase.SUCCEEDED, exit_code=0), pod("w0", W, PodPhase.RUNNING)],
        JobPhase.SUCCEEDED,
        None,
    ),
    (
        "master failed",
        [pod("m", M, PodPhase.FAILED, exit_code=3), pod("w0", W, PodPhase.RUNNING)],
        JobPhase.FAILED,
        "m",
    ),
    (
        "worker lost while master runs",
        [pod("m", M, PodPhase.RUNNING), pod("w0", W, PodPhase.FAILED, exit_code=137, reason="OOMKilled")],
        JobPhase.FAILED,
        "w0",
    ),
    (
        "worker lost beats master failure",
        [pod("m", M, PodPhase.FAILED, exit_code=1), pod("w0", W, PodPhase.FAILED, reason="Evicted")],
        JobPhase.FAILED,
        "w0",
    ),
    ("worker exits 0 early", [pod("w0", W, PodPhase.SUCCEEDED, exit_code=0)], JobPhase.FAILED, "w0"),
    (
        "image pull",
        [pod("w0", W, PodPhase.PENDING, reason="ImagePullBackOff", message="no such image")],
        JobPhase.FAILED,
        "w0",
    ),
    ("crash loop", [pod("w1", W, PodPhase.RUNNING, reason="CrashLoopBackOff")], JobPhase.FAILED, "w1"),
]


@pytest.mark.parametrize(("case", "pods", "phase", "failed"), CASES, ids=[c[0] for c in CASES])
def test_evaluate_job(case: str, pods: list[PodState], phase: JobPhase, failed: str | None) -> None:
    status = evaluate_job(pods)
    assert status.phase is phase
    assert status.failed_pod == failed
    if failed:
        assert failed in status.reason


def test_describe_names_reason_and_code() -> None:
    text = pod("w0", W, PodPhase.FAILED, exit_code=137, reason="OOMKilled").describe()
    assert text == "pod w0 (worker) failed, exit code 137, OOMKilled"
