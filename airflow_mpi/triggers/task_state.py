"""Whether a dropped trigger's job is still the task's to follow, as Airflow's database has it.

Airflow calls a trigger's ``on_kill`` whenever a triggerer drops a trigger it no longer owns,
and that happens for reasons it does not tell apart: the user acted on the task (marked it failed
or successful, cleared it), or the trigger was handed to another triggerer because this one's
heartbeat came late (the task is still ``deferred``, the other copy follows the job), or that
other copy has fired meanwhile (the task resumes: ``scheduled``, ``queued``, ``running``, and the
resumed task tears the job down itself). Only the first may delete the job, so ``on_kill`` asks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from airflow_mpi.compat import task_states

# The task instance's states in which the job is still the task's: deferred on another
# triggerer, or resumed to finish it. Any other state (failed, success, up_for_retry, cleared)
# is the user's action, or the task's end, and the job is deleted.
STILL_THE_TASKS = frozenset({"deferred", "scheduled", "queued", "running"})
# Seconds the triggerer's supervisor may take to answer. Generous: a loaded machine delays the
# answer exactly when it delays the heartbeat that hands the trigger to another triggerer, and
# deleting the job then, for want of an answer, would end a job the other copy follows. A kill
# waits this long at most; the job is deleted all the same if no answer comes.
ASK_TIMEOUT = 60.0

log = logging.getLogger(__name__)


def state_key(task_id: str, map_index: int) -> str:
    """The key of one task instance in the answer to GetTaskStates: a mapped instance's task id
    carries its map index (``train_3``), an unmapped one's does not."""
    return task_id if map_index < 0 else f"{task_id}_{map_index}"


def state_in(states: Mapping[str, Mapping[str, Any]], run_id: str, task_id: str, map_index: int) -> str | None:
    """The task instance's state in a ``{run_id: {key: state}}`` answer (None: none, or not there)."""
    state = (states.get(run_id) or {}).get(state_key(task_id, map_index))
    return None if state is None else str(getattr(state, "value", state))


async def job_still_the_tasks(task_instance: Any) -> tuple[bool, str]:
    """(whether the job must be left running, the task's state as read). Left only when the
    state says so; when this process cannot ask (no task instance, no supervisor, an Airflow
    without the request) the job is deleted, as a user's kill asks."""
    try:
        dag_id, run_id, task_id = task_instance.dag_id, task_instance.run_id, task_instance.task_id
        map_index = getattr(task_instance, "map_index", None)
        map_index = -1 if map_index is None else int(map_index)
    except (AttributeError, TypeError, ValueError):
        return False, "unknown (no task instance)"
    try:
        states = await asyncio.wait_for(
            asyncio.to_thread(task_states, dag_id, [task_id], [run_id], map_index), ASK_TIMEOUT
        )
    except Exception as error:  # no supervisor here, or it did not answer: cannot tell
        log.warning("could not read the state of %s/%s/%s: %s", dag_id, run_id, task_id, error)
        return False, f"unknown ({type(error).__name__})"
    state = state_in(states, run_id, task_id, map_index)
    return state in STILL_THE_TASKS, str(state)
