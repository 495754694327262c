"""Queued or admitted, from what the API says: a group's pods, a Volcano Job's status; and the
pods a Volcano policy deleted are not what decided the job."""

from __future__ import annotations

from typing import Any

from airflow_mpi.job.naming import LABEL_ROLE
from airflow_mpi.kinds.gang import describe_group_wait
from airflow_mpi.kinds.registry import job_kind
from airflow_mpi.kinds.volcano import describe_volcano_wait, without_policy_kills
from airflow_mpi.observe.status import PodPhase, PodState, evaluate_job
from airflow_mpi.spec import Role


def pod(scheduled: str | None, reason: str = "", message: str = "") -> dict[str, Any]:
    conditions = [] if scheduled is None else [{"type": "PodScheduled", "status": scheduled, "reason": reason}]
    if message:
        conditions[0]["message"] = message
    return {"metadata": {"name": "p"}, "status": {"phase": "Pending", "conditions": conditions}}


def test_a_group_waits_while_none_of_its_pods_is_scheduled() -> None:
    waiting = pod("False", "Unschedulable", "pod group job-1 is Pending: 3 of 3 pods exist")
    assert describe_group_wait([waiting, pod(None)]) == "queued: pod group job-1 is Pending: 3 of 3 pods exist"
    assert describe_group_wait([pod("False", "SchedulingGated")]) == "queued: SchedulingGated"


def test_the_wait_names_the_queue_the_scheduler_does_not() -> None:
    # The real vc-scheduler's verdict on a group its queue cannot hold names no queue.
    verdict = "pod group is not ready, 3 Pending, 3 minAvailable; Pending: 3 Unschedulable"
    waiting = pod("False", "Unschedulable", verdict)
    assert describe_group_wait([waiting], "training") == f"queued in queue 'training': {verdict}"


def test_a_group_is_admitted_once_one_pod_is_scheduled_or_none_says_why() -> None:
    assert describe_group_wait([pod("False", "Unschedulable", "x"), pod("True")]) is None
    assert describe_group_wait([pod(None), pod(None)]) is None  # no verdict yet: not queued
    assert describe_group_wait([pod("False", "SomethingElse")]) is None
    assert describe_group_wait([]) is None


def volcano_job(phase: str, **status: Any) -> dict[str, Any]:
    return {"spec": {"queue": "training"}, "status": {"state": {"phase": phase}, **status}}


def test_a_volcano_job_is_queued_while_pending_without_pods() -> None:
    assert describe_volcano_wait(volcano_job("Pending")) == "queued in Volcano queue 'training': job Pending"
    assert (
        describe_volcano_wait({"spec": {}}) == "queued in Volcano queue 'default': job not yet seen by the controller"
    )
    assert describe_volcano_wait(volcano_job("Pending", running=1)) is None
    assert describe_volcano_wait(volcano_job("Running")) is None
    assert describe_volcano_wait(None) is None


def state(name: str, role: Role, phase: PodPhase, reason: str = "") -> PodState:
    return PodState(name, role, phase, reason=reason)


def test_pods_a_policy_deleted_after_a_pod_ended_are_left_out() -> None:
    master_done = state("m", Role.MASTER, PodPhase.SUCCEEDED)
    killed = state("w", Role.WORKER, PodPhase.FAILED, "Deleted")
    assert without_policy_kills([master_done, killed]) == [master_done]
    worker_failed = state("w0", Role.WORKER, PodPhase.FAILED, "Error")
    master_killed = state("m", Role.MASTER, PodPhase.FAILED, "Deleted")
    assert without_policy_kills([master_killed, worker_failed]) == [worker_failed]
    # Nothing ended by itself: a deleted pod is the cause (e.g. an eviction by deletion).
    assert without_policy_kills([killed, state("m", Role.MASTER, PodPhase.RUNNING)])[0] is killed


def test_a_pod_the_policy_is_still_deleting_is_not_named_as_the_cause() -> None:
    """A rank's failure ends the master (exit 3); the policy then deletes the workers, and until
    a worker is gone it shows the kill's 137: the master's failure decides, on the watch's path
    (``deleting``) as on the listed one."""
    master_failed = PodState("m", Role.MASTER, PodPhase.FAILED, exit_code=3, reason="Error")
    killed = PodState("w1", Role.WORKER, PodPhase.FAILED, exit_code=137, reason="Error")
    assert without_policy_kills([master_failed, killed], {"w1"}) == [master_failed]
    assert evaluate_job(without_policy_kills([killed, master_failed], {"w1"})).failed_pod == "m"
    # Not being deleted, the worker that ended is the cause, as before.
    assert evaluate_job(without_policy_kills([killed, master_failed])).failed_pod == "w1"


def test_volcano_listed_pods_being_deleted_count_as_deleted() -> None:
    def listed(name: str, role: Role, code: int, deleting: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "labels": {LABEL_ROLE: role.value}}
        if deleting:
            meta["deletionTimestamp"] = "2026-12-02T15:00:00Z"
        terminated = {"terminated": {"exitCode": code, "reason": "Error"}}
        return {"metadata": meta, "status": {"phase": "Failed", "containerStatuses": [{"state": terminated}]}}

    states = job_kind("volcano").listed_states(
        [listed("m", Role.MASTER, 3, False), listed("w1", Role.WORKER, 137, True)]
    )
    assert [state.name for state in states] == ["m"]


class FakeQueue:
    """A backend that is queued for the reasons given, then admitted."""

    def __init__(self, reasons: list[str | None], tick: float = 0.0) -> None:
        self.reasons, self.tick = list(reasons), tick

    def queue_status(self, job_name: str) -> str | None:
        return self.reasons.pop(0) if len(self.reasons) > 1 else self.reasons[0]

    def wait_for_change(self, job_name: str, timeout: float) -> None:
        import time

        time.sleep(self.tick)


def test_the_queue_wait_notes_each_new_reason_and_returns_once_admitted() -> None:
    import pytest

    from airflow_mpi.exceptions import JobTimeout
    from airflow_mpi.runner.waits import QueueWait
    from tests.helpers import plan_for, spec_from

    notes: list[str] = []
    plan = plan_for(spec_from(scheduling={"gang": "volcano"}))
    QueueWait(FakeQueue(["queued: a", "queued: a", "queued: b", None]), plan, notes.append).wait()  # type: ignore[arg-type]
    assert len(notes) == 2 and notes[0].endswith("queued: a") and notes[1].endswith("queued: b")
    assert "waits for admission" in notes[0]

    bounded = plan_for(spec_from(scheduling={"gang": "volcano", "queue_timeout": 1}))
    with pytest.raises(JobTimeout, match=r"scheduling.queue_timeout \(1s\): queued: full"):
        QueueWait(FakeQueue(["queued: full"], tick=0.2), bounded, notes.append).wait()  # type: ignore[arg-type]
