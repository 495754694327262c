"""What a deferred MPIJobOperator waits for and what the trigger hands back: the two waits, the
event's statuses and its shape. The trigger fires these; the runner turns them into the result
or the same error the synchronous flow raises.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, TypedDict

if TYPE_CHECKING:
    from airflow_mpi.exceptions import JobFailed
    from airflow_mpi.observe.progress import Hang

# The two waits. A wait that ends well fires an event whose status is the wait's own name.
WAIT_FINISHED: Final = "finished"  # until the master ends (what the operator defers for)
WAIT_READY: Final = "ready"  # until every worker is Ready (earlier versions deferred for it first)
# How a wait ends badly.
STATUS_FAILED: Final = "failed"  # a pod failed (the job's state machine says which)
STATUS_TIMEOUT: Final = "timeout"  # the wait's deadline passed
STATUS_ERROR: Final = "error"  # the API refused the watch, or did not answer for the bound


class _Status(TypedDict):
    status: str  # WAIT_READY, WAIT_FINISHED, STATUS_FAILED, STATUS_TIMEOUT or STATUS_ERROR


class Outcome(_Status, total=False):
    """How the pods decided a wait: the status, and for a failure or timeout what and why."""

    pod: str | None  # the failed pod (STATUS_FAILED)
    exit_code: int | None  # its exit code, when it has one
    reason: str  # the failure's cause, or why the wait timed out (one line per host not ready)
    unreachable: bool  # STATUS_ERROR: the API did not answer (else it refused)
    rank: int | None  # the rank the world-size check found missing (STATUS_FAILED with ``message``)
    message: str  # STATUS_FAILED by the master's output (the world-size check): the whole error
    log_lines: int  # whole master lines the trigger's log follow read (shown, or shown before)
    tail: list[str]  # the master's last lines the trigger read (for a message once its log is gone)
    queued: bool  # STATUS_TIMEOUT: past scheduling.queue_timeout (``reason`` is the whole error)
    starting: bool  # before every worker was Ready (STATUS_TIMEOUT: not within startup_timeout)
    never_starts: bool  # STATUS_FAILED: the job's controller refused or failed it before its pods ran
    hung: dict[str, Any]  # STATUS_FAILED by the hang watchdog: ``observe.progress.Hang.to_dict()``


class JobEvent(Outcome):
    """The trigger's event: the outcome plus what the resumed operator (a new object) needs."""

    job_name: str
    wait_for: str  # WAIT_READY or WAIT_FINISHED
    at: float  # epoch seconds when it fired
    try_number: int  # the try that created the job (its name hashes it)
    marks: dict[str, float]  # phase -> epoch seconds so far (the result's timings)


def rank_failure_outcome(failure: JobFailed, log_lines: int) -> Outcome:
    """The master's output failed the world-size check: the whole error travels."""
    return {
        "status": STATUS_FAILED,
        "pod": failure.pod,
        "rank": failure.rank,
        "exit_code": None,
        "reason": str(failure).split("\n", 1)[0],
        "message": str(failure),
        "log_lines": log_lines,
    }


def hang_outcome(hang: Hang, log_lines: int) -> Outcome:
    """Silent past ``progress_timeout``: the resumed task takes the stacks, then ends the job."""
    return {
        "status": STATUS_FAILED,
        "pod": None,
        "exit_code": None,
        "reason": hang.summary(),
        "hung": hang.to_dict(),
        "log_lines": log_lines,
    }
