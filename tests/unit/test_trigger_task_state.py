"""What a dropped trigger reads to decide whether its job is the task's still (the answer of
Airflow's GetTaskStates, keyed by run and by task id, a mapped one's with its map index)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from airflow_mpi.triggers.task_state import STILL_THE_TASKS, job_still_the_tasks, state_in, state_key


def test_a_mapped_instance_is_keyed_with_its_index() -> None:
    assert state_key("train", -1) == "train"
    assert state_key("train", 0) == "train_0"
    assert state_key("train", 12) == "train_12"


@pytest.mark.parametrize(
    ("states", "map_index", "expected"),
    [
        ({"run": {"train": "deferred"}}, -1, "deferred"),
        ({"run": {"train_2": "failed", "train_3": "deferred"}}, 2, "failed"),
        ({"run": {"train": None}}, -1, None),  # cleared
        ({"run": {}}, -1, None),  # not there
        ({}, -1, None),  # the run deleted
        ({"other": {"train": "deferred"}}, -1, None),
    ],
)
def test_the_state_is_read_for_the_run_and_instance_only(states: dict, map_index: int, expected: str | None) -> None:
    assert state_in(states, "run", "train", map_index) == expected


def test_only_deferred_or_resumed_leave_the_job() -> None:
    assert {"deferred", "scheduled", "queued", "running"} == STILL_THE_TASKS
    for killed in ("failed", "success", "up_for_retry", "restarting", "removed", "skipped", "None"):
        assert killed not in STILL_THE_TASKS


def test_without_a_supervisor_to_ask_the_job_is_deleted() -> None:
    # No task instance (the trigger run outside a triggerer), or one without Airflow's
    # supervisor to answer (this process): as a user's kill asks.
    assert asyncio.run(job_still_the_tasks(None)) == (False, "unknown (no task instance)")
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=None)
    left, state = asyncio.run(job_still_the_tasks(ti))
    assert left is False and state.startswith("unknown ("), state
