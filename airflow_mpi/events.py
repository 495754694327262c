"""What a deferred MPIJobOperator waits for and what the trigger hands back.

The wait is one value, ``WaitContract``: the runner builds it, the trigger takes it whole and
serializes it as it came (primitives only: Airflow stores it).

The trigger's event says what ended the wait in one tag, ``outcome``, and carries the fields of
that outcome only: a discriminated union (``Outcome``), built by the functions below and read
back with ``outcome_of``. The coarse ``status`` (finished, failed, timeout, error) travels
beside the tag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict, Union, cast, get_args, get_type_hints

if TYPE_CHECKING:
    from airflow_mpi.exceptions import JobFailed
    from airflow_mpi.observe.progress import Hang

# How a wait ends, coarsely: the trigger waits until the job ends.
STATUS_FINISHED: Final = "finished"  # the master ended well
STATUS_FAILED: Final = "failed"  # something failed (the outcome says what)
STATUS_TIMEOUT: Final = "timeout"  # a bound passed (the outcome says which)
STATUS_ERROR: Final = "error"  # the API refused the watch, or did not answer for the bound

# What ended the wait: the event's tag.
FINISHED: Final = "finished"  # the master ended well
POD_FAILED: Final = "pod_failed"  # a pod failed; the master's own failure is decided by its log
RANK_FAILED: Final = "rank_failed"  # the master's output failed the world-size check
HUNG: Final = "hung"  # no progress for ``progress_timeout``
NEVER_STARTS: Final = "never_starts"  # the job's controller refused or failed it before its pods ran
QUEUE_TIMEOUT: Final = "queue_timeout"  # queued past scheduling.queue_timeout
STARTUP_TIMEOUT: Final = "startup_timeout"  # a worker not Ready within startup_timeout
JOB_TIMEOUT: Final = "job_timeout"  # the job ran past its timeout
API_REFUSED: Final = "api_refused"  # the API refused a request (401, 403, 404 ...)
API_UNREACHABLE: Final = "api_unreachable"  # the API did not answer for api_timeout


@dataclass(frozen=True)
class WaitContract:
    """Everything a trigger needs to watch a job the operator created, and to hand back."""

    job_name: str
    namespace: str
    kubernetes_conn_id: str
    deadline: float  # epoch seconds
    timeout: float  # what the deadline stands for, for the message
    master_pod: str
    worker_pods: tuple[str, ...]
    api_timeout: float  # seconds the API may go without answering
    kind: str = "pods"  # the job kind's name (``kinds``): how its pods and top object are read
    ssh_port: int = 22
    try_number: int = 1  # the try that created the job (its name hashes it)
    marks: Mapping[str, float] = field(default_factory=dict)  # phase -> epoch seconds so far
    gang: bool = False  # the job has a gang setting (it may wait for admission)
    queue: str | None = None  # the queue it names
    queue_timeout: float | None = None  # bounds the whole wait for admission
    created_at: float | None = None  # epoch seconds: a job queued from the start waits from then
    custom_objects: tuple[tuple[str, str, str], ...] = ()  # (group, version, plural) deleted on a kill
    master_log: Mapping[str, Any] | None = None  # ``OutputPlan.to_dict()``: the log followed live
    skip_lines: int = 0  # whole lines of the master's log the task's log already holds
    startup_timeout: float | None = None  # every worker Ready within it (the master started with them)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["worker_pods"] = list(self.worker_pods)
        data["custom_objects"] = [list(kind) for kind in self.custom_objects]
        data["marks"] = dict(self.marks)
        data["master_log"] = dict(self.master_log) if self.master_log is not None else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WaitContract:
        """From ``to_dict()``; unknown keys are refused by name."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TypeError(f"unknown wait contract field(s): {', '.join(unknown)}")
        values = dict(data)
        values["worker_pods"] = tuple(values.get("worker_pods") or ())
        values["custom_objects"] = tuple(tuple(kind) for kind in values.get("custom_objects") or ())
        values["marks"] = dict(values.get("marks") or {})
        return cls(**values)


class _Shown(TypedDict, total=False):
    log_lines: int  # whole master lines the trigger's log follow read (shown, or shown before)
    tail: list[str]  # the master's last lines it read (for a message once the pod's log is gone)


class Finished(_Shown):
    outcome: Literal["finished"]
    status: Literal["finished"]


class PodFailed(_Shown):
    outcome: Literal["pod_failed"]
    status: Literal["failed"]
    pod: str | None
    exit_code: int | None
    reason: str
    starting: bool  # before every worker was Ready


class RankFailed(_Shown):
    outcome: Literal["rank_failed"]
    status: Literal["failed"]
    pod: str | None
    rank: int | None
    exit_code: int | None
    reason: str  # the error's first line
    message: str  # the whole error


class Hung(_Shown):
    outcome: Literal["hung"]
    status: Literal["failed"]
    reason: str
    hung: dict[str, Any]  # ``observe.progress.Hang.to_dict()``


class NeverStarts(_Shown):
    outcome: Literal["never_starts"]
    status: Literal["failed"]
    reason: str


class QueueTimeout(_Shown):
    outcome: Literal["queue_timeout"]
    status: Literal["timeout"]
    reason: str  # the whole error


class StartupTimeout(_Shown):
    outcome: Literal["startup_timeout"]
    status: Literal["timeout"]
    reason: str  # one line per worker not Ready


class JobTimeout(_Shown):
    outcome: Literal["job_timeout"]
    status: Literal["timeout"]
    reason: str


class ApiRefused(_Shown):
    outcome: Literal["api_refused"]
    status: Literal["error"]
    reason: str  # what to change


class ApiUnreachable(_Shown):
    outcome: Literal["api_unreachable"]
    status: Literal["error"]
    reason: str


Outcome = Union[  # noqa: UP007 (a union of TypedDicts, read at run time on Python 3.10 too)
    Finished,
    PodFailed,
    RankFailed,
    Hung,
    NeverStarts,
    QueueTimeout,
    StartupTimeout,
    JobTimeout,
    ApiRefused,
    ApiUnreachable,
]


class Envelope(TypedDict):
    """What the resumed operator (a new object) needs beside the outcome."""

    job_name: str
    at: float  # epoch seconds when it fired
    try_number: int  # the try that created the job (its name hashes it)
    marks: dict[str, float]  # phase -> epoch seconds so far (the result's timings)


# The event as it travels: the envelope's and the outcome's fields in one flat mapping.
JobEvent = Mapping[str, Any]


def finished() -> Finished:
    return {"outcome": FINISHED, "status": STATUS_FINISHED}


def pod_failed(pod: str | None, exit_code: int | None, reason: str, *, starting: bool) -> PodFailed:
    return {
        "outcome": POD_FAILED,
        "status": STATUS_FAILED,
        "pod": pod,
        "exit_code": exit_code,
        "reason": reason,
        "starting": starting,
    }


def rank_failed(failure: JobFailed, log_lines: int) -> RankFailed:
    """The master's output failed the world-size check: the whole error travels."""
    return {
        "outcome": RANK_FAILED,
        "status": STATUS_FAILED,
        "pod": failure.pod,
        "rank": failure.rank,
        "exit_code": None,
        "reason": str(failure).split("\n", 1)[0],
        "message": str(failure),
        "log_lines": log_lines,
    }


def hung(hang: Hang, log_lines: int) -> Hung:
    """Silent past ``progress_timeout``: the resumed task takes the stacks, then ends the job."""
    summary = hang.summary()
    return {"outcome": HUNG, "status": STATUS_FAILED, "reason": summary, "hung": hang.to_dict(), "log_lines": log_lines}


def never_starts(reason: str) -> NeverStarts:
    return {"outcome": NEVER_STARTS, "status": STATUS_FAILED, "reason": reason}


def queue_timeout(reason: str) -> QueueTimeout:
    return {"outcome": QUEUE_TIMEOUT, "status": STATUS_TIMEOUT, "reason": reason}


def startup_timeout(reason: str) -> StartupTimeout:
    return {"outcome": STARTUP_TIMEOUT, "status": STATUS_TIMEOUT, "reason": reason}


def job_timeout(reason: str) -> JobTimeout:
    return {"outcome": JOB_TIMEOUT, "status": STATUS_TIMEOUT, "reason": reason}


def api_refused(reason: str) -> ApiRefused:
    return {"outcome": API_REFUSED, "status": STATUS_ERROR, "reason": reason}


def api_unreachable(reason: str) -> ApiUnreachable:
    return {"outcome": API_UNREACHABLE, "status": STATUS_ERROR, "reason": reason}


def fire(outcome: Outcome, envelope: Envelope) -> dict[str, Any]:
    """The event's payload: flat, primitives only (Airflow stores it)."""
    return {**outcome, **envelope}


def outcome_of(event: JobEvent) -> Outcome:
    """The outcome an event stands for (its fields but the envelope's)."""
    if event.get("outcome") not in _KINDS:
        raise ValueError(f"not an MPI job event: no known outcome in {sorted(event)}")
    return cast("Outcome", {key: value for key, value in event.items() if key not in _ENVELOPE_KEYS})


# Every outcome's tag, as the union's members declare it.
_KINDS: Final = frozenset(get_args(get_type_hints(member)["outcome"])[0] for member in get_args(Outcome))
_ENVELOPE_KEYS: Final = frozenset(Envelope.__annotations__)
