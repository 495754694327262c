"""The fault table harness: rows to one Markdown table, the exit status, and the page block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.faults import TABLE_END, TABLE_START, main, render_table, replace_table


def row(
    fault: str, backend: str = "kubernetes", mode: str = "waiting", left: list[str] | None = None
) -> dict[str, object]:
    return {
        "test": "t",
        "fault": fault,
        "backend": backend,
        "mode": mode,
        "state": "failed",
        "seconds": 3.04,
        "message": "a | b `c`",
        "left": left or [],
    }


def test_one_table_sorted_by_backend_fault_and_mode_with_cells_escaped() -> None:
    table = render_table([row("b"), row("a", mode="deferrable"), row("a"), row("z", backend="local")]).splitlines()
    assert table[0] == "| fault | backend | mode | task state | seconds to detect | message (first line) | left |"
    assert [line.split(" | ")[0] + " " + line.split(" | ")[2] for line in table[2:]] == [
        "| a deferrable",
        "| a waiting",
        "| b waiting",
        "| z waiting",
    ]
    assert table[2] == "| a | kubernetes | deferrable | failed | 3.0 | `a \\| b 'c'` | 0 |"


def test_main_fails_when_a_fault_left_something(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = tmp_path / "rows"
    rows.write_text(json.dumps(row("a")) + "\n")
    assert main([str(rows)]) == 0
    rows.write_text(json.dumps(row("a")) + "\n" + json.dumps(row("b", left=["pod p"])) + "\n")
    assert main([str(rows)]) == 1
    assert "2 faults, 1 with something left" in capsys.readouterr().out
    assert main([str(tmp_path / "none")]) == 1


def test_the_page_block_is_replaced_and_nothing_else(tmp_path: Path) -> None:
    page = tmp_path / "troubleshooting.md"
    page.write_text(f"# x\n\n{TABLE_START}\nold table\n{TABLE_END}\n\nafter\n")
    rows = tmp_path / "rows"
    rows.write_text(json.dumps(row("a")) + "\n")
    assert main([str(rows), "--page", str(page)]) == 0
    text = page.read_text()
    assert "old table" not in text and text.startswith("# x\n\n") and text.endswith(f"{TABLE_END}\n\nafter\n")
    assert render_table([row("a")]) in text
    with pytest.raises(ValueError, match="no fault table markers"):
        replace_table("# no markers", "table")
