"""The one byte-line splitter both backends read pod output with: any chunking gives the same
lines, ``\r`` before a newline goes, a line rewritten with ``\r`` keeps its latest state, and a
line past the cap is cut and marked."""

from __future__ import annotations

import random

import pytest

from airflow_mpi.observe.lines import CUT_MARK, LineSplitter
from airflow_mpi.observe.output import TAIL_LINES, format_tail

TEXT = b"first\r\nsecond\n\nthird \xe2\x9c\x93\r\r\nlast without newline"
LINES = ["first", "second", "", "third \u2713", "last without newline"]


def split(data: bytes, size: int, max_bytes: int | None = 64) -> list[str]:
    splitter = LineSplitter(max_bytes=max_bytes)
    lines = []
    for start in range(0, len(data), size):
        lines += splitter.feed(data[start : start + size])
    return lines + splitter.flush()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 1 << 20])
def test_any_chunking_gives_the_same_lines(size: int) -> None:
    assert split(TEXT, size) == LINES


def test_carriage_returns_before_the_newline_are_dropped_a_rewritten_line_keeps_its_last_state() -> None:
    # "\r" + state marks a line that overwrote earlier states (a progress bar); one state is a plain line.
    text = b"a\r\nb\r\r\nprogress\r50%\r100%\n\r\rfirst only\r\n\r\n50%\r\r\n"
    for size in (1, 2, 4, 100):
        assert split(text, size) == ["a", "b", "\r100%", "first only", "", "50%"], size


def reference(data: bytes, limit: int) -> list[str]:
    """What the splitter must give, computed line by line at once: the last non-empty state of
    each line, cut at the limit, marked when it overwrote others."""
    lines = data.split(b"\n")
    last = lines.pop()
    out = []
    for line in lines + ([last] if last.strip(b"\r") else []):
        states = [state for state in line.split(b"\r") if state]
        text = (states or [b""])[-1]
        shown = text.decode() if len(text) <= limit else text[:limit].decode() + CUT_MARK
        out.append("\r" + shown if len(states) > 1 else shown)
    return out


@pytest.mark.parametrize("seed", range(30))
def test_progress_lines_any_chunking_match_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = [b"a", b"bb", b"\r", b"\n", b"\r\n", b"0123456789" * 3]
    data = b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
    splitter, lines, pos = LineSplitter(max_bytes=16), [], 0
    while pos < len(data):
        size = rng.randint(1, 40)
        lines += splitter.feed(data[pos : pos + size])
        pos += size
    assert lines + splitter.flush() == reference(data, 16)


def test_a_bar_updated_100k_times_keeps_one_state_and_reports_the_latest() -> None:
    splitter = LineSplitter()
    snapshots = []
    for i in range(1, 100_001):
        assert splitter.feed(f"\r{i:>6}/100000 |{'#' * (i // 5000):<20}|".encode()) == []
        assert len(splitter._partial) <= 64 * 1024
        if i % 10_000 == 0:
            snapshots.append(splitter.progress())
    assert snapshots[0] == "\r  9999/100000 |#                   |"  # the last finished state
    assert splitter.progress() is None  # nothing new since
    (line,) = splitter.feed(b"\n")
    assert line == "\r100000/100000 |####################|"


def test_progress_reports_each_new_state_once_and_never_a_crlf_split_across_chunks() -> None:
    splitter = LineSplitter()
    splitter.feed(b"plain line\r")
    assert splitter.progress() is None  # may be "\r\n" split across two chunks
    assert splitter.feed(b"\n") == ["plain line"]
    splitter.feed(b"\r 1%\r 2%")
    assert splitter.progress() == "\r 1%" and splitter.progress() is None
    splitter.feed(b"\r 3%\r")
    assert splitter.progress() == "\r 3%"
    assert splitter.flush() == ["\r 3%"]  # the stream ended inside the bar: its last state


def test_each_state_of_a_progress_line_is_cut_on_its_own() -> None:
    assert split(b"x" * 40 + b"\r" + b"y" * 40 + b"\n", 7, max_bytes=16) == ["\r" + "y" * 16 + CUT_MARK]
    assert split(b"x" * 40 + b"\rshort\n", 7, max_bytes=16) == ["\rshort"]


def test_flush_is_empty_after_a_final_newline() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"one\ntwo\n") == ["one", "two"]
    assert splitter.flush() == []


def test_a_line_past_the_cap_is_cut_and_marked_and_the_next_line_is_whole() -> None:
    long = b"x" * 100
    for size in (1, 10, 33, 1000):
        assert split(long + b"\nnext\n", size, max_bytes=16) == ["x" * 16 + CUT_MARK, "next"], size
    # Cut in a stream that ends without a newline, and exactly at the cap (not cut).
    assert split(long, 7, max_bytes=16) == ["x" * 16 + CUT_MARK]
    assert split(b"y" * 16 + b"\n", 5, max_bytes=16) == ["y" * 16]


def test_the_cut_never_splits_a_character() -> None:
    line = "\u00e9" * 10  # two bytes each: a cap of 5 bytes ends inside the third
    assert split(line.encode() + b"\n", 3, max_bytes=5) == ["\u00e9\u00e9" + CUT_MARK]
    assert split(line.encode() + b"\n", 100, max_bytes=5) == ["\u00e9\u00e9" + CUT_MARK]


def test_default_cap_is_64_kib_and_memory_stays_bounded() -> None:
    splitter = LineSplitter()
    for _ in range(64):  # 4 MiB without a newline
        assert splitter.feed(b"z" * 65536) == []
        assert len(splitter._partial) <= 64 * 1024
    (line,) = splitter.feed(b"\n")
    assert line == "z" * 65536 + CUT_MARK


def test_no_cap_keeps_long_lines_whole() -> None:
    assert split(b"j" * 200_000 + b"\n", 65536, max_bytes=None) == ["j" * 200_000]


def test_tail_block_shows_the_last_lines_of_its_source() -> None:
    assert format_tail("job-worker-1", []) == ""
    text = format_tail("rank 2", [f"line {i}" for i in range(40)])
    shown = text.splitlines()
    assert shown[1] == "last lines of rank 2:" and shown[0] == ""
    assert shown[2:] == [f"  | line {i}" for i in range(40 - TAIL_LINES, 40)]
