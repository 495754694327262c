"""The trigger's event is a discriminated union: one tag, ``outcome``, says what ended the wait,
and the runner reads the tag, never a set of flags; an event without a known tag is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_mpi import events
from airflow_mpi.events import Envelope, Outcome, outcome_of
from airflow_mpi.exceptions import (
    BackendRequestFailed,
    BackendUnreachable,
    JobFailed,
    JobHung,
    JobTimeout,
    LaunchError,
    SshdNotReady,
)
from airflow_mpi.observe.progress import Hang, Silence
from tests.unit.test_failures import PLAN, WORKER, runner

ENVELOPE: Envelope = {"job_name": PLAN.job_name, "at": 1.0, "try_number": 2, "marks": {"created": 0.5}}
HANG = Hang(timeout=10.0, silent=(Silence(1, 12.0, "step 4"),), whole_job=False)
RANK = JobFailed("MPI job x failed: rank 2 never reported\nmore", pod=WORKER, rank=2)

# Each outcome, the error class its event resumes to (None: the job goes on), and the same
# outcome as an earlier version's event said it (status and flags).
CASES: list[tuple[Outcome, type[Exception] | None, dict[str, Any]]] = [
    (events.finished(), None, {"status": "finished"}),
    (events.pod_failed(WORKER, 137, "OOMKilled", starting=False), JobFailed,
     {"status": "failed", "pod": WORKER, "exit_code": 137, "reason": "OOMKilled"}),
    (events.pod_failed(PLAN.master.name, 1, "Error", starting=False), None,
     {"status": "failed", "pod": PLAN.master.name, "exit_code": 1, "reason": "Error"}),
    (events.rank_failed(RANK, 40), JobFailed,
     {"status": "failed", "pod": WORKER, "rank": 2, "exit_code": None, "reason": "MPI job x failed: rank 2 never "
      "reported", "message": str(RANK), "log_lines": 40}),
    (events.hung(HANG, 7), JobHung, {"status": "failed", "pod": None, "reason": HANG.summary(),
                                     "hung": HANG.to_dict(), "log_lines": 7}),
    (events.never_starts("refused"), LaunchError,
     {"status": "failed", "never_starts": True, "pod": None, "reason": "refused"}),
    (events.queue_timeout("queued too long"), JobTimeout,
     {"status": "timeout", "queued": True, "reason": "queued too long"}),
    (events.startup_timeout("1 of 2 not ready"), SshdNotReady,
     {"status": "timeout", "starting": True, "reason": "1 of 2 not ready"}),
    (events.job_timeout("ran past"), JobTimeout, {"status": "timeout", "reason": "ran past"}),
    (events.api_refused("403"), BackendRequestFailed, {"status": "error", "reason": "403"}),
    (events.api_unreachable("no answer"), BackendUnreachable,
     {"status": "error", "unreachable": True, "reason": "no answer"}),
]  # fmt: skip
IDS = [f"{outcome['outcome']}-{i}" for i, (outcome, _, _) in enumerate(CASES)]


def test_every_outcome_has_a_case() -> None:
    tags = {value for name, value in vars(events).items() if name.isupper() and isinstance(value, str)}
    tags -= {events.STATUS_FINISHED, events.STATUS_FAILED, events.STATUS_TIMEOUT, events.STATUS_ERROR}
    assert {outcome["outcome"] for outcome, _, _ in CASES} == tags | {events.FINISHED}


@pytest.mark.parametrize(("outcome", "error", "legacy"), CASES, ids=IDS)
def test_an_event_travels_as_json_and_reads_back_as_its_outcome(
    outcome: Outcome, error: type[Exception] | None, legacy: dict[str, Any]
) -> None:
    payload = json.loads(json.dumps(events.fire(outcome, ENVELOPE)))  # Airflow stores it
    assert {key: payload[key] for key in ENVELOPE} == ENVELOPE
    assert outcome_of(payload) == {**outcome}
    failure = runner().event_failure(payload)
    assert type(failure) is error if error else failure is None


def test_an_event_without_a_known_outcome_is_refused() -> None:
    with pytest.raises(ValueError, match="not an MPI job event: no known outcome"):
        outcome_of({"status": "failed", "pod": WORKER, "job_name": PLAN.job_name})


def test_a_failure_before_every_worker_was_ready_is_said_so() -> None:
    starting = runner().event_failure(events.fire(events.pod_failed(WORKER, 3, "Error", starting=True), ENVELOPE))
    training = runner().event_failure(events.fire(events.pod_failed(WORKER, 3, "Error", starting=False), ENVELOPE))
    assert "failed before sshd was ready" in str(starting)
    assert "failed while training" in str(training)
