"""``progress_pattern`` runs in time linear in the line (Google RE2), on every line of a job and
in the triggerer's event loop: a pattern that backtracks in Python's ``re`` costs microseconds, a
pattern RE2 cannot run, or one too large to run fast, is refused at validation naming the field."""

from __future__ import annotations

import asyncio
import time

import pytest

from airflow_mpi.exceptions import SpecError
from airflow_mpi.observe.master_output import MasterOutput, OutputPlan
from airflow_mpi.observe.progress import ProgressWatch
from airflow_mpi.spec.patterns import MAX_PROGRAM_SIZE, compile_pattern
from tests.helpers import spec_from

START = "[airflow-mpi] starting mpiexec: 2 rank(s)"
LINE = 64 * 1024 - 64  # a line as long as the splitter lets one be, with its tag
# Patterns that backtrack for seconds in Python's re, and large ones just under the size bound.
SLOW_IN_PYTHON = [
    r"(a+)+$",
    r"(x+x+)+y",
    r"(a|aa)*b",
    r"(\w+\s?)+$",
    r"(.*a){100}",
    r"[^x]{0,30}[^y]{0,30}q",
    r"\w{60}x",
]
HOSTILE_LINES = ["a" * LINE + "!", "ab " * (LINE // 3) + "!", "x" * LINE, "é" * (LINE // 2), " " * LINE]


def _timeout_spec(pattern: str) -> dict[str, object]:
    return {"progress_timeout": 60, "progress_pattern": pattern}


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        (r"(step)\1", "backreferences"),
        (r"step(?=\d)", "lookahead"),
        (r"(?<!no )step", "lookbehind"),
        (r"step \d+\Z", "\\z"),
        (r"(?>a+)b", "atomic"),
        (r".{1000}x", "instructions"),
        ("x" * 1001, "at most 1000"),
        ("(", "RE2"),
    ],
)
def test_a_pattern_re2_cannot_run_fast_is_refused_naming_the_field(pattern: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        spec_from(**_timeout_spec(pattern))
    message = next(str(issue) for issue in caught.value.issues if issue.field == "progress_pattern")
    assert words in message, message


@pytest.mark.parametrize(
    "pattern", [r"step \d+", r"(?i)^epoch \d+/\d+", r"loss=\d+\.\d+", r"\[\s*\d+/\d+\]", *SLOW_IN_PYTHON]
)
def test_real_and_backtracking_patterns_are_accepted(pattern: str) -> None:
    assert spec_from(**_timeout_spec(pattern)).progress_pattern == pattern


def test_the_size_bound_is_what_the_timing_below_covers() -> None:
    assert compile_pattern(r"(.*a){100}")._regexp.ProgramSize() <= MAX_PROGRAM_SIZE  # type: ignore[attr-defined]


@pytest.mark.parametrize("pattern", SLOW_IN_PYTHON)
def test_each_64_kib_line_is_matched_well_under_100_ms(pattern: str) -> None:
    watch = ProgressWatch(60, pattern, 2)
    watch.feed([START], 0.0)
    worst = 0.0
    for text in HOSTILE_LINES:
        for rank in (0, 1):
            started = time.perf_counter()
            watch.feed([f"[1,{rank}]<stdout>:{text}"], 1.0)
            worst = max(worst, time.perf_counter() - started)
    assert worst < 0.05, f"{pattern}: {worst * 1000:.1f} ms for one line"


def test_a_flood_of_hostile_lines_never_blocks_the_event_loop_over_100_ms() -> None:
    """The trigger's loop takes at most 64 KiB per step (triggers/logfollow.CHUNK_BYTES): each
    step here is one such batch through MasterOutput, while a ticker measures the loop's stalls."""
    plan = OutputPlan("job-1", "job-1-master-0", 2, (), (), 60.0, progress_timeout=60, progress_pattern=r"(a+)+$")
    shown: list[str] = []
    output = MasterOutput(plan, shown.append)

    async def run() -> float:
        stalls: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                stalls.append(now - last)
                last = now

        async def feed() -> None:
            output.take([START], 0.0)
            for index in range(40):
                text = HOSTILE_LINES[index % len(HOSTILE_LINES)]
                output.take([f"[1,{index % 2}]<stdout>:{text}"], float(index))
                await asyncio.sleep(0)
            done.set()

        await asyncio.gather(ticker(), feed())
        return max(stalls)

    assert asyncio.run(run()) < 0.1
    assert output.watch.started is not None and output.lines_read == 41
