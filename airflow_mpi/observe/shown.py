"""How many of the master's lines a deferred job's task log holds, as an annotation on the job's
own ConfigMap, where every triggerer can read it. Pure: the value and its rules; the trigger
reads and writes it (``triggers.logshown``).

A trigger that starts again on another triggerer (a second triggerer for availability, a
rescheduled triggerer pod with none of the first one's log folder, remote logging) goes on after
the lines the mark counts. The mark names the trigger that writes it (``owner``): a trigger that
finds it taken by another stops showing lines, so two triggerers running the same trigger for a
while (Airflow's handover) never show a line twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

SHOWN_ANNOTATION = "airflow-mpi.io/log-shown"


@dataclass(frozen=True)
class ShownMark:
    """``lines`` of the master's log are in the task's log; ``owner`` writes the mark now."""

    lines: int
    owner: str
    try_number: int

    def render(self) -> str:
        return json.dumps({"lines": self.lines, "owner": self.owner, "try": self.try_number}, sort_keys=True)


def parse_shown_mark(annotations: Mapping[str, str] | None) -> ShownMark | None:
    """The mark in a ConfigMap's annotations; None when there is none or it is not ours to read
    (edited by hand into something else: the lines are then shown from the trigger's own count)."""
    text = (annotations or {}).get(SHOWN_ANNOTATION)
    if not text:
        return None
    try:
        value = json.loads(text)
        lines, owner, try_number = int(value["lines"]), str(value["owner"]), int(value["try"])
    except (ValueError, TypeError, KeyError):
        return None
    if lines < 0:
        return None
    return ShownMark(lines, owner, try_number)


def lines_to_skip(mark: ShownMark | None, given: int) -> int:
    """Lines of the master's log not to show again: what the mark counts (any try of the task:
    a retry that reattached goes on where the earlier try's log stopped), or what the operator
    handed the trigger (its state store), whichever is further."""
    return max(given, mark.lines if mark is not None else 0)
