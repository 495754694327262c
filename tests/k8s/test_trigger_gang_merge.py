"""The trigger's gang additions inside its bounded structure: a queued gang's missing pods are not
a deleted job, the watch wakes when the allowed queue wait ends, and the kwargs serialize."""

from __future__ import annotations

import time

from airflow_mpi.events import QUEUE_TIMEOUT, STATUS_ERROR
from airflow_mpi.job.mpirun import TIMEOUT_GRACE
from tests.k8s.test_gang import _waiting_pod
from tests.k8s.test_trigger import pod, table, trigger

QUEUED = (_waiting_pod("job-1-master-0", "master"), _waiting_pod("job-1-worker-0", "worker"))


def test_a_queued_gang_without_pods_is_not_a_vanished_job() -> None:
    gang = trigger(gang=True, queue_timeout=60)
    assert gang._vanished(table()) is None
    assert gang.decide(table()) is None  # queued: keeps waiting
    plain = trigger()
    assert (plain._vanished(table()) or {}).get("status") == STATUS_ERROR


def test_the_watch_wakes_when_the_allowed_queue_wait_ends_if_that_comes_first() -> None:
    now = time.time()
    queued = trigger(gang=True, deadline=now + 30, queue_timeout=5, created_at=now)
    assert queued._wake() == now + 30 + TIMEOUT_GRACE  # not seen queued yet: the deadline, and mpiexec's grace
    assert queued.decide(table(*QUEUED)) is None
    assert queued._wake() == now + 5  # queued since its creation
    unbounded = trigger(gang=True, deadline=now + 30, created_at=now)
    assert unbounded.decide(table(*QUEUED)) is None
    assert unbounded._wake() >= now + 30  # the deadline moves on while queued
    late = trigger(gang=True, deadline=now + 30, queue_timeout=5, created_at=now - 6)
    outcome = late.decide(table(*QUEUED))
    assert outcome is not None and outcome["outcome"] == QUEUE_TIMEOUT
    assert outcome["reason"].startswith("MPI job job-1 waited 6s for admission, past scheduling.queue_timeout (5s)")


def test_serialized_kwargs_carry_kind_gang_queue_custom_objects_and_api_timeout() -> None:
    kinds = [["batch.volcano.sh", "v1alpha1", "jobs"]]
    made = trigger(
        kind="volcano", gang=True, queue_timeout=60.0, created_at=123.0, custom_objects=kinds, api_timeout=7.0
    )
    _, kwargs = made.serialize()
    contract = kwargs["contract"]
    assert {
        key: contract[key] for key in ("kind", "gang", "queue_timeout", "created_at", "custom_objects", "api_timeout")
    } == {
        "kind": "volcano",
        "gang": True,
        "queue_timeout": 60.0,
        "created_at": 123.0,
        "custom_objects": kinds,
        "api_timeout": 7.0,
    }


def test_a_controller_pod_not_there_yet_at_the_first_list_is_pending_not_deleted() -> None:
    """The task defers right after submitting an MPIJob or a Volcano Job: the first list may show
    the workers before the controller (a batch Job, for the launcher) made the master. That pod is
    still to come, not a deleted one that fails the job (it fired "the pod was deleted" 2 s after
    the deferral, and the resumed task waited for the job itself)."""
    workers = (
        pod("job-1-worker-0", "worker", ready=True),
        pod("job-1-worker-1", "worker", ready=True),
    )
    for kind, master in (("mpijob", "job-1-launcher"), ("volcano", "job-1-master-0")):
        made = trigger(kind=kind, master_pod=master)
        listed = table(*workers)
        assert made._vanished(listed) is None
        assert master not in listed.deleted
        assert made.decide(listed) is None, kind  # the master is pending: keep waiting
    plain = trigger()
    listed = table(*workers)
    assert plain._vanished(listed) is None
    assert (plain.decide(listed) or {}).get("pod") == "job-1-master-0"  # the pods kind made it: deleted
