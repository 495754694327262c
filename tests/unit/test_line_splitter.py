"""The one byte-line splitter both backends read pod output with: any chunking gives the same
lines, ``\r`` before a newline goes, and a line past the cap is cut and marked."""

from __future__ import annotations

import pytest

from airflow_mpi.logstream import CUT_MARK, TAIL_LINES, LineSplitter, format_tail

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


def test_carriage_returns_before_the_newline_are_dropped_others_kept() -> None:
    assert split(b"a\r\nb\r\r\nprogress\r50%\r100%\n", 4) == ["a", "b", "progress\r50%\r100%"]


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
