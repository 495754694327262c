"""What each job kind says about the master's own pod, as a pod watch sees the job: the trigger
follows that pod's log, so a name given before the pod exists is a 404 that ends the follow."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_mpi.job.naming import LABEL_ROLE
from airflow_mpi.kinds.registry import job_kind
from airflow_mpi.observe.status import PodTable


def pod(name: str, role: str, created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {LABEL_ROLE: role}, "creationTimestamp": created},
        "status": {"phase": "Pending"},
    }


@pytest.mark.parametrize("kind", ["pods", "volcano"])
def test_a_fixed_master_is_named_only_once_the_watch_has_seen_it(kind: str) -> None:
    # Volcano creates the pods after the Job is admitted: before then there is no log to open.
    table = PodTable()
    table.replace([pod("j-worker-0", "worker")], "1")
    assert job_kind(kind).master_pod_now(table, "j-master-0") is None
    table.apply({"type": "ADDED", "object": pod("j-master-0", "master")})
    assert job_kind(kind).master_pod_now(table, "j-master-0") == "j-master-0"
    table.apply({"type": "DELETED", "object": pod("j-master-0", "master")})
    assert job_kind(kind).master_pod_now(table, "j-master-0") is None


def test_a_generated_master_is_the_newest_pod_of_its_controller() -> None:
    table = PodTable()
    assert job_kind("mpijob").master_pod_now(table, "j-launcher") is None
    table.replace(
        [
            pod("j-launcher-b2", "master", "2026-01-01T00:01:00Z"),
            pod("j-launcher-a1", "master"),
            pod("j-worker-0", "worker"),
        ],
        "1",
    )
    assert job_kind("mpijob").master_pod_now(table, "j-launcher") == "j-launcher-b2"


@pytest.mark.parametrize("kind", ["pods", "volcano"])
def test_a_job_attached_by_name_waits_for_no_master_its_pods_do_not_show(kind: str) -> None:
    # The cluster CLI and the sshd sensor attach while a plain-pods master is not created yet.
    workers = {"j-worker-0": pod("j-worker-0", "worker")}
    master, roles = job_kind(kind).attached_roles("j", workers)
    assert (master, set(roles)) == ("j-master-0", {"j-worker-0"})
    master, roles = job_kind(kind).attached_roles("j", {**workers, "j-master-0": pod("j-master-0", "master")})
    assert (master, set(roles)) == ("j-master-0", {"j-worker-0", "j-master-0"})


def test_a_generated_master_is_attached_by_its_launchers_name_whatever_pods_are_seen() -> None:
    seen = {"j-launcher-a1": pod("j-launcher-a1", "master"), "j-worker-0": pod("j-worker-0", "worker")}
    master, roles = job_kind("mpijob").attached_roles("j", seen)
    assert master == "j-launcher"
    assert {name: role.value for name, role in roles.items()} == {"j-worker-0": "worker", "j-launcher": "master"}


# --- the decisions the waiting backend and the trigger share ------------------------------------

MPIJOB_NO_CONDITION = {"metadata": {"name": "j"}, "status": {}}
MPIJOB_FAILED = {"metadata": {"name": "j"}, "status": {"conditions": [
    {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "Job was active longer"}]}}  # fmt: skip


def test_admission_reads_the_controllers_events_only_while_queued_where_the_kind_says() -> None:
    asked: list[str] = []

    def refusal(answer: str | None) -> Any:
        def read() -> str | None:
            asked.append("events")
            return answer

        return read

    mpijob = job_kind("mpijob")
    refused = mpijob.admission("j", False, None, [], MPIJOB_NO_CONDITION, refusal("mpi-operator refused MPIJob j"))
    assert refused.never_starts == "mpi-operator refused MPIJob j" and refused.queued is None
    waiting = mpijob.admission("j", False, None, [], MPIJOB_NO_CONDITION, refusal(None))
    assert waiting.queued and waiting.never_starts is None
    assert asked == ["events", "events"]
    failed = mpijob.admission("j", False, None, [], MPIJOB_FAILED, refusal("never asked"))
    assert failed.never_starts is not None and failed.never_starts.startswith("MPIJob j: ")
    assert "DeadlineExceeded" in failed.never_starts
    plain = job_kind("pods").admission("j", False, None, [], None, refusal("never asked"))
    assert (plain.queued, plain.never_starts) == (None, None)  # no gang: never queued
    assert asked == ["events", "events"]


def test_a_master_deleted_for_a_reason_its_top_object_gives_fails_with_it() -> None:
    from airflow_mpi.observe.status import JobPhase, PodPhase, PodState, evaluate_job
    from airflow_mpi.spec import Role

    states = [
        PodState("j-launcher-x", Role.MASTER, PodPhase.FAILED, reason="Deleted"),
        PodState("j-worker-0", Role.WORKER, PodPhase.RUNNING, ready=True),
    ]
    kind = job_kind("mpijob")
    said = kind.deciding_states("j-launcher-x", states, set(), "MPIJob j failed: DeadlineExceeded")
    assert [(s.name, s.phase, s.reason) for s in said if s.role is Role.MASTER] == [
        ("j-launcher-x", PodPhase.FAILED, "MPIJob j failed: DeadlineExceeded")
    ]
    status = evaluate_job(said)
    assert status.phase is JobPhase.FAILED and status.failed_pod == "j-launcher-x"
    assert status.reason.endswith("failed, MPIJob j failed: DeadlineExceeded")
    assert kind.deciding_states("j-launcher-x", states, set(), None) == states  # a deleted master decides nothing
