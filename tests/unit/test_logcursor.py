"""LogCursor: a Kubernetes log stream resumed from the whole second of its last line shows every
line exactly once, with equal timestamps, any drop points, and any clock offset of the node; and,
read byte by byte (``TimestampedLogSplitter``), every byte once, a line broken off mid-way included."""

from __future__ import annotations

import random

import pytest

from airflow_mpi.observe.cursor import (
    LogCursor,
    TimestampedLogSplitter,
    format_since_time,
    parse_log_timestamp,
    split_timestamped,
)
from airflow_mpi.observe.lines import RankLineSplitter
from tests.doubles.kube_double import rfc3339_nano

SECOND = 1_000_000_000


def test_parse_keeps_nanoseconds_and_trimmed_zeros() -> None:
    assert parse_log_timestamp("2026-11-29T20:00:01.123456789Z") % SECOND == 123456789
    assert parse_log_timestamp("2026-11-29T20:00:01.5Z") % SECOND == 500_000_000
    assert parse_log_timestamp("2026-11-29T20:00:01Z") % SECOND == 0
    assert split_timestamped("2026-11-29T20:00:01.25Z hello world") == (
        parse_log_timestamp("2026-11-29T20:00:01.25Z"),
        "hello world",
    )
    for ns in (1_795_982_401_000_000_000, 1_795_982_401_120_000_000, 1_795_982_401_123_456_789):
        assert parse_log_timestamp(rfc3339_nano(ns)) == ns  # the double writes what we read


def test_since_time_is_the_whole_second() -> None:
    assert format_since_time(parse_log_timestamp("2026-11-29T20:00:01.999Z")) == "2026-11-29T20:00:01Z"


def serve(lines: list[tuple[int, str]], since: str | None) -> list[tuple[int, str]]:
    """What the API server sends from ``sinceTime`` on (whole seconds, as it truncates)."""
    if since is None:
        return lines
    start = parse_log_timestamp(since)
    return [line for line in lines if line[0] >= start]


@pytest.mark.parametrize("seed", range(40))
def test_random_drops_never_duplicate_or_lose(seed: int) -> None:
    rng = random.Random(seed)
    now = 1_795_982_401 * SECOND + rng.randrange(SECOND)
    lines = []
    for i in range(rng.randint(50, 400)):
        now += rng.choice([0, 0, 1, 1000, 10**6, 3 * 10**8, 1_200_000_000])  # equal stamps happen
        lines.append((now, f"line {i}"))
    cursor, shown, drops = LogCursor(), [], 0
    while True:
        batch = serve(lines, cursor.resume())
        cut = rng.randint(0, len(batch)) if drops < 20 and rng.random() < 0.8 else len(batch)
        for stamp, text in batch[:cut]:
            if cursor.accept(stamp):
                shown.append(text)
        if cut == len(batch):
            break
        drops += 1
    assert shown == [text for _, text in lines]


def test_cursor_round_trips_through_a_dict() -> None:
    cursor = LogCursor()
    for stamp in (5, 5, 7):
        cursor.accept(stamp)
    again = LogCursor.from_dict(cursor.to_dict())
    assert (again.last_ns, again.count) == (7, 1)


def kubelet_log(entries: list[tuple[int, bytes, bool]], since: str | None) -> bytes:
    """A followed ``timestamps=true`` log from ``sinceTime`` on: each line stamped once, at its
    start, however many pieces it was written in (``ends``: the piece ends the line)."""
    start = parse_log_timestamp(since) if since else 0
    out, at_start = bytearray(), True
    for ns, piece, ends in entries:
        if at_start and ns >= start:
            out += rfc3339_nano(ns).encode() + b" "
        if ns >= start:
            out += piece + (b"\n" if ends else b"")
        at_start = ends
    return bytes(out)


@pytest.mark.parametrize("seed", range(40))
def test_streams_broken_off_at_any_byte_give_every_byte_once(seed: int) -> None:
    rng = random.Random(seed)
    now = 1_795_982_401 * SECOND + rng.randrange(SECOND)
    entries: list[tuple[int, bytes, bool]] = []
    reference = []
    for i in range(rng.randint(20, 200)):
        now += rng.choice([0, 0, 1, 10**6, 3 * 10**8, 1_200_000_000])
        pieces = rng.randint(1, 4)  # a line written in pieces keeps its first stamp
        text = ""
        for p in range(pieces):  # mpiexec tags each piece it reads
            repeat = rng.randint(1, 30)
            entries.append((now, f"[1,0]<stdout>:{i}.{p}|".encode() * repeat, p == pieces - 1))
            text += f"{i}.{p}|" * repeat
        reference.append(f"[1,0]<stdout>:{text}")
    cursor, lines = LogCursor(), RankLineSplitter()
    shown: list[str] = []
    for drop in range(30):
        stream = TimestampedLogSplitter(cursor, lines)
        data = kubelet_log(entries, cursor.resume())
        cut = rng.randint(0, len(data)) if drop < 29 else len(data)
        pos = 0
        while pos < cut:
            size = rng.randint(1, 300)
            shown += stream.feed(data[pos : min(pos + size, cut)])
            pos += size
        if cut == len(data):
            break
    assert shown + lines.flush() == reference
