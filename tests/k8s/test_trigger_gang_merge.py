"""The trigger's gang additions inside its bounded structure: a queued gang's missing pods are not
a deleted job, the watch wakes at the queue deadline, and the new kwargs serialize."""

from __future__ import annotations

import time

from airflow_mpi.events import STATUS_ERROR, STATUS_TIMEOUT
from tests.k8s.test_trigger import table, trigger


def test_a_queued_gang_without_pods_is_not_a_vanished_job() -> None:
    gang = trigger(gang=True, queue_deadline=time.time() + 60)
    assert gang._vanished(table()) is None
    assert gang.decide(table()) is None  # queued: keeps waiting
    plain = trigger()
    assert (plain._vanished(table()) or {}).get("status") == STATUS_ERROR


def test_the_watch_wakes_at_the_queue_deadline_when_it_comes_first() -> None:
    now = time.time()
    assert trigger(gang=True, deadline=now + 30, queue_deadline=now + 5)._wake() == now + 5
    assert trigger(gang=True, deadline=now + 30, queue_deadline=None)._wake() == now + 30
    late = trigger(gang=True, deadline=now + 30, queue_deadline=now - 1)
    assert (late.decide(table()) or {}).get("status") == STATUS_TIMEOUT


def test_serialized_kwargs_carry_gang_queue_deadline_custom_objects_and_api_timeout() -> None:
    kinds = [["batch.volcano.sh", "v1alpha1", "jobs"]]
    _, kwargs = trigger(gang=True, queue_deadline=123.0, custom_objects=kinds, api_timeout=7.0).serialize()
    assert (kwargs["gang"], kwargs["queue_deadline"], kwargs["custom_objects"], kwargs["api_timeout"]) == (
        True,
        123.0,
        kinds,
        7.0,
    )
