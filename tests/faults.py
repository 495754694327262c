"""The fault table: tests that provoke a failure record one row each; `make faults` prints them.

A fault test is marked ``@pytest.mark.fault`` and calls the ``fault_row`` fixture once with what
it saw: the fault, backend, mode (waiting/deferrable/cli), the task state it ended in, seconds to
detect, the message, and what was left (objects or processes; the test asserts it is empty).
Rows go as JSON lines to ``$AIRFLOW_MPI_FAULT_ROWS`` (``make faults`` sets it); without it they
are kept for the session only. ``python -m tests.faults FILE`` prints the Markdown table;
``--page docs/guides/troubleshooting.md`` also puts it on that page, between its markers
(``make faults FAULTS_PAGE=1``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

ROWS_ENV = "AIRFLOW_MPI_FAULT_ROWS"
TABLE_START = "<!-- fault table: make faults FAULTS_PAGE=1 writes it -->"
TABLE_END = "<!-- end of the fault table -->"
COLUMNS = ("fault", "backend", "mode", "task state", "seconds to detect", "message (first line)", "left")

FaultRow = Callable[..., None]


@pytest.fixture
def fault_row(request: pytest.FixtureRequest) -> FaultRow:
    """``fault_row(fault, backend, mode, state, seconds, message, left)``: record this test's row."""

    def record(
        fault: str, backend: str, mode: str, state: str, seconds: float, message: str, left: Sequence[str]
    ) -> None:
        row = {
            "test": request.node.nodeid,
            "fault": fault,
            "backend": backend,
            "mode": mode,
            "state": state,
            "seconds": round(float(seconds), 2),
            "message": (str(message).strip().splitlines() or [""])[0][:240],  # the fix and its guide too
            "left": list(left),
        }
        target = os.environ.get(ROWS_ENV)
        if target:
            with open(target, "a", encoding="utf-8") as out:
                out.write(json.dumps(row) + "\n")

    return record


def render_table(rows: Sequence[dict[str, object]]) -> str:
    """The rows as one Markdown table, sorted by backend, fault and mode."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in sorted(rows, key=lambda r: (str(r["backend"]), str(r["fault"]), str(r["mode"]))):
        left = row["left"]
        cells = [
            row["fault"],
            row["backend"],
            row["mode"],
            row["state"],
            f"{row['seconds']:.1f}",
            "`" + str(row["message"]).replace("|", "\\|").replace("`", "'") + "`",
            str(len(left)) if isinstance(left, list) else str(left),
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def replace_table(page: str, table: str) -> str:
    """The page text with ``table`` between its fault-table markers."""
    start, end = page.find(TABLE_START), page.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no fault table markers: add {TABLE_START!r} and {TABLE_END!r}")
    return page[: start + len(TABLE_START)] + "\n" + table + "\n" + page[end:]


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    page = None
    if "--page" in args:
        at = args.index("--page")
        page = Path(args[at + 1])
        del args[at : at + 2]
    path = Path(args[0]) if args else None
    if path is None or not path.exists():
        print("no fault rows recorded", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    table = render_table(rows)
    print(table)
    bad = [r for r in rows if r["left"]]
    print(f"\n{len(rows)} faults, {len(bad)} with something left")
    if page is not None:
        page.write_text(replace_table(page.read_text(), table))
        print(f"written to {page}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
