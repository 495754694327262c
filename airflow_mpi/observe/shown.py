"""How many of the master's lines a deferred job's task log holds (its "shown mark"), kept on the
job's own Lease (``coordination.k8s.io/v1``, ``<job>-log``), where every triggerer can read it.
Pure: the mark's rules, how it is read from a Lease and written into one; the trigger reads and
writes it (``triggers.logshown``).

A trigger that starts again on another triggerer (a second triggerer for availability, a
rescheduled triggerer pod with none of the first one's log folder, remote logging) goes on after
the lines the mark counts. The Lease's holder (``spec.holderIdentity``) is the trigger that
writes the mark now: a trigger that finds it held by another live trigger of the job leaves the
lines to it, so two triggerers running the same trigger for a while (Airflow's handover) never
show a line twice.

Whoever may update Leases in the namespace can write anything there, so a mark is read as
untrusted input: a count that is not a plain whole number (``Infinity``, ``-1``, ``1e9``), a
holder that is not a trigger's, is reported once and not believed; the trigger then shows the
lines from its own knowledge (``given``: what the operator handed it), never fewer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LINES_ANNOTATION = "airflow-mpi.io/log-lines"  # the count, on the Lease
TRY_ANNOTATION = "airflow-mpi.io/log-try"  # the task try whose trigger wrote it
# A live holder counts a line within this many seconds of the log having it (it writes the mark
# once a second as it shows lines): another trigger that read a line this long ago, still not
# counted, takes the mark back. Written into the Lease as its ``leaseDurationSeconds``.
LEASE_SECONDS = 30
MAX_DIGITS = 15  # a count past this (10**15 lines) is no log's: not believed
# What ``build_trigger_owner`` makes: host, process id, a random part.
_OWNER = re.compile(r"[^\s:]{1,253}:[0-9]{1,10}:[0-9a-f]{8}")
_COUNT = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}")
_TRY = re.compile(r"[0-9]{1,6}")


@dataclass(frozen=True)
class ShownMark:
    """``lines`` of the master's log are in the task's log; ``owner`` writes the mark now."""

    lines: int
    owner: str
    try_number: int


@dataclass(frozen=True)
class LeaseMark:
    """A Lease as read: ``mark`` (None: none yet, or one not believed), ``problem`` (why it is
    not believed, for the one report), ``holder`` (``spec.holderIdentity``, "" for none) and
    ``version`` (its resourceVersion: a change means its holder wrote)."""

    mark: ShownMark | None
    problem: str | None
    holder: str
    version: str


def build_trigger_owner(host: str, pid: int, random_hex: str) -> str:
    """A trigger's name among every triggerer's: ``host:pid:random``."""
    return f"{host}:{pid}:{random_hex[:8]}"


def is_trigger_owner(holder: str) -> bool:
    """Whether ``holder`` has the form every trigger's name has (``build_trigger_owner``)."""
    return _OWNER.fullmatch(holder) is not None


def parse_lease_mark(lease: Mapping[str, Any]) -> LeaseMark:
    """The mark on ``lease``. A Lease with no count is a new one (no problem); a count, try or
    holder that is not of the form a trigger writes is a problem, and the mark is None."""
    metadata = lease.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    holder = holder if isinstance(holder, str) else ""
    version = str(metadata.get("resourceVersion") or "")
    count, try_text = annotations.get(LINES_ANNOTATION), annotations.get(TRY_ANNOTATION)
    if count is None and not holder:
        return LeaseMark(None, None, holder, version)
    problem = None
    if not isinstance(count, str) or _COUNT.fullmatch(count) is None:
        problem = f"its line count {_quoted(count)} is not a whole number of lines"
    elif not isinstance(try_text, str) or _TRY.fullmatch(try_text) is None:
        problem = f"its try {_quoted(try_text)} is not a try number"
    elif not is_trigger_owner(holder):
        problem = f"its holder {_quoted(holder)} is not an airflow-mpi trigger"
    if problem is not None:
        return LeaseMark(None, problem, holder, version)
    assert isinstance(count, str)
    assert isinstance(try_text, str)
    return LeaseMark(ShownMark(int(count), holder, int(try_text)), None, holder, version)


def render_lease_mark(lease: Mapping[str, Any], mark: ShownMark, now: str) -> dict[str, Any]:
    """``lease`` (as read: its resourceVersion makes the write conditional) with ``mark`` written
    into it: the count and try as annotations, the owner as holder, ``now`` (RFC 3339 with
    microseconds) as its renewal; a new holder counts a transition."""
    metadata = dict(lease.get("metadata") or {})
    metadata["annotations"] = {
        **(metadata.get("annotations") or {}),
        LINES_ANNOTATION: str(mark.lines),
        TRY_ANNOTATION: str(mark.try_number),
    }
    spec = dict(lease.get("spec") or {})
    if spec.get("holderIdentity") != mark.owner:
        transitions = spec.get("leaseTransitions")
        spec["leaseTransitions"] = (transitions if isinstance(transitions, int) and transitions >= 0 else 0) + (
            1 if spec.get("holderIdentity") else 0
        )
        spec["acquireTime"] = now
    spec.update(holderIdentity=mark.owner, leaseDurationSeconds=LEASE_SECONDS, renewTime=now)
    return {**lease, "metadata": metadata, "spec": spec}


def lines_to_skip(mark: ShownMark | None, given: int) -> int:
    """Lines of the master's log not to show again: what the mark counts (any try of the task:
    a retry that reattached goes on where the earlier try's log stopped), or what the operator
    handed the trigger (its state store), whichever is further."""
    return max(given, mark.lines if mark is not None else 0)


def _quoted(value: object, limit: int = 40) -> str:
    """An untrusted value for a log line: quoted, escaped, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
