"""bench/report.py: targets decide `met`, the table shows each figure beside its baseline, and the
the figures page's generated section is replaced between its markers only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from report import PAGE_END, PAGE_START, figure, markdown_table, rewrite_page

META = {"mode": "bench", "started": "2026-11-30 21:00 UTC", "cpus": 2, "load_average": [4, 3.5, 3], "seconds": 61}


def test_targets_decide_met() -> None:
    assert figure("overhead", 0.4, "s", at_most=0.5).met is True
    assert figure("overhead", 0.6, "s", at_most=0.5).met is False
    assert figure("rss", 150, "MB", at_least=200).met is False
    faster = figure("logs", 300_000, "lines/s", baseline="KPO", baseline_value=20_000, ratio_at_least=10)
    assert (faster.ratio, faster.met, faster.target) == (15.0, True, "ratio >= 10")
    assert figure("logs", 100_000, "lines/s", baseline_value=20_000, ratio_at_least=10).met is False
    assert figure("lost", 0, "lines", at_most=0).met is True
    untargeted = figure("phase", 0.2, "s")
    assert (untargeted.target, untargeted.met, untargeted.ratio) == (None, None, None)
    assert figure("nothing", None, "s", at_most=1).met is None


def test_table_shows_baseline_ratio_and_misses() -> None:
    figures = [
        figure("launch wall", 1.25, "s", baseline="bare mpiexec", baseline_value=0.5).to_json(),
        figure("launch overhead", 0.7, "s", at_most=0.5).to_json(),
    ]
    lines = markdown_table(figures).splitlines()
    assert lines[0].startswith("| figure | value | baseline")
    assert lines[2] == "| launch wall | 1.25 s | bare mpiexec = 0.500 s | 2.5 | - | - |"
    assert lines[3] == "| launch overhead | 0.700 s | - | - | <= 0.500 s | **no** |"


def test_page_section_replaced_between_markers_only() -> None:
    page = f"# title\n\nbefore\n{PAGE_START}\nold table\n{PAGE_END}\nafter\n"
    results = {"meta": META, "figures": [figure("x", 2.0, "s", at_most=3).to_json()]}
    rewritten = rewrite_page(page, results)
    assert rewritten.startswith("# title\n\nbefore\n")
    assert rewritten.endswith(f"{PAGE_END}\nafter\n")
    assert "old table" not in rewritten
    assert "| x | 2 s | - | - | <= 3 s | yes |" in rewritten
    assert "load average 4.00 / 3.50 / 3.00" in rewritten
    assert rewrite_page(rewritten, results) == rewritten  # idempotent


def test_page_without_markers_names_the_fix() -> None:
    with pytest.raises(ValueError, match="bench:start"):
        rewrite_page("# no section\n", {"meta": META, "figures": []})


def test_a_benchmark_rerun_alone_is_said_under_the_table() -> None:
    from report import describe_run

    assert "rerun" not in describe_run(META)
    line = describe_run({**META, "rerun": {"deferred_logs": "2026-12-02 02:30 UTC"}})
    assert line.endswith(" `deferred_logs` rerun alone on 2026-12-02 02:30 UTC.")
