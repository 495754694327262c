"""Each rank's lines, reassembled from mpiexec's tagged pieces.

Open MPI 4.1.4 with ``--tag-output`` (measured here: two Python ranks writing ``\\r`` progress to
stderr and 110 kB without a newline to stdout) tags every piece it reads from a rank (at most
4 KiB) and every line start inside one, but ends no piece with a newline. So one line of the
master mixes pieces of several ranks, and a rank's long line spans many tags:

    [1,0]<stderr>:\\rbar 0 0%[1,0]<stderr>:\\rbar 0 1%[1,1]<stderr>:\\rbar 1 0%...[1,0]<stdout>:xxx(4095)[1,0]<stderr>:\\n
"""

from __future__ import annotations

import json
import random
import re
import tracemalloc

import pytest

from airflow_mpi.observe.lines import CUT_MARK, PartialLine, RankLineSplitter
from airflow_mpi.observe.output import OutputTracker

# The start of the master's output in that measurement, byte for byte.
MEASURED = (
    b"[1,0]<stderr>:\rbar 0 0%[1,0]<stderr>:\rbar 0 1%[1,1]<stderr>:\rbar 1 0%[1,0]<stderr>:\rbar 0 2%"
    b"[1,1]<stderr>:\rbar 1 1%[1,0]<stderr>:\rbar 0 3%[1,1]<stderr>:\rbar 1 2%[1,0]<stderr>:\rbar 0 4%"
    b"[1,1]<stderr>:\rbar 1 3%[1,0]<stdout>:" + b"x" * 4095 + b"[1,0]<stderr>:\n"
    b"[1,0]<stdout>:" + b"x" * 4095 + b"[1,0]<stdout>:" + b"x" * 1810 + b"end 0\n"
    b"[1,1]<stderr>:\rbar 1 4%[1,1]<stderr>:\n"
)


def mpiexec_output(writes: list[tuple[int, str, bytes]], piece: int = 4096) -> bytes:
    """What mpiexec 4.1 prints for these rank writes: each read piece tagged, a tag after every
    newline that more data of the piece follows, no newline added."""
    out = bytearray()
    for rank, stream, data in writes:
        tag = f"[1,{rank}]<{stream}>:".encode()
        for start in range(0, len(data), piece):
            chunk = data[start : start + piece]
            out += tag + chunk.replace(b"\n", b"\n" + tag)
            if chunk.endswith(b"\n"):
                del out[len(out) - len(tag) :]
    return bytes(out)


def split(data: bytes, sizes: list[int] | None = None, max_bytes: int = 64 * 1024) -> list[str]:
    splitter, lines, pos = RankLineSplitter(max_bytes), [], 0
    for size in sizes or [len(data) or 1]:
        lines += splitter.feed(data[pos : pos + size])
        pos += size
    lines += splitter.feed(data[pos:])
    return lines + splitter.flush()


TAG = re.compile(rb"(\[\d+,\d+\]<std(?:out|err|diag)>:)")


def reference(data: bytes, limit: int) -> list[str]:
    """The lines, worked out at once and slowly: split at every tag, each tag's text collected
    until its newline, then its last \r state, cut at the limit."""
    texts: dict[bytes, bytes] = {}
    out, tag = [], b""

    def render(tag: bytes, line: bytes) -> str:
        states = [state for state in line.split(b"\r") if state]
        last = (states or [b""])[-1]
        text = last.decode() if len(last) <= limit else last[:limit].decode() + CUT_MARK
        return tag.decode() + ("\r" + text if len(states) > 1 else text)

    for part in TAG.split(data):
        if TAG.fullmatch(part):
            tag = part
            continue
        while part:
            newline = part.find(b"\n")
            if newline < 0:
                texts[tag] = texts.get(tag, b"") + part
                break
            out.append(render(tag, texts.pop(tag, b"") + part[:newline]))
            part, tag = part[newline + 1 :], b""
    # The lines left unfinished at the end, in no particular order.
    return out + sorted(render(tag, text) for tag, text in texts.items() if text.strip(b"\r"))


@pytest.mark.parametrize("seed", range(40))
def test_random_output_any_chunking_matches_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    kinds = [b"step 7 loss=0.1\n", b"a\nb\n", b"\r12%", b"\n", b"x" * 300, b"[INFO] ok ]<stdout> text\n"]
    writes = [(rng.randrange(4), rng.choice(["stdout", "stderr"]), rng.choice(kinds)) for _ in range(200)]
    data = mpiexec_output(writes, piece=rng.choice([7, 64, 4096]))
    data = data.replace(b"[1,3]<stderr>:", b"")  # rank 3's stderr as if untagged (mpiexec's own text)
    sizes = [rng.randint(1, 200) for _ in range(len(data) // 50)]
    splitter, lines, pos = RankLineSplitter(256), [], 0
    for size in [*sizes, len(data)]:
        lines += splitter.feed(data[pos : pos + size])
        pos += size
    assert lines + sorted(splitter.flush()) == reference(data, 256)


def test_the_measured_output_gives_each_ranks_own_lines() -> None:
    lines = split(MEASURED)
    assert lines == [
        "[1,0]<stderr>:\rbar 0 4%",  # rank 0's bar, its last state, ended by its newline
        "[1,0]<stdout>:" + "x" * 10000 + "end 0",  # 10 kB in three pieces, one line again
        "[1,1]<stderr>:\rbar 1 4%",
    ]


@pytest.mark.parametrize("seed", range(20))
def test_any_chunking_gives_the_same_lines(seed: int) -> None:
    rng = random.Random(seed)
    writes = [
        (rng.randrange(3), rng.choice(["stdout", "stderr"]), rng.choice([b"step 1\n", b"\r50%", b"ab", b"x" * 5000]))
        for _ in range(60)
    ]
    ends = [(rank, stream, b"\n") for rank in range(3) for stream in ("stdout", "stderr")]
    data = mpiexec_output(writes + ends) + b"mpiexec noticed something\n"
    whole = split(data)
    sizes = [rng.randint(1, 50) for _ in range(len(data) // 10)]
    assert split(data, sizes) == whole
    assert "mpiexec noticed something" in whole


def test_a_line_interrupted_by_other_ranks_is_whole_and_mpiexecs_own_lines_pass() -> None:
    data = mpiexec_output([(0, "stdout", b"loss="), (1, "stdout", b"hello\nworld\n")])
    data += b"--------\nPrimary job terminated normally\n" + mpiexec_output([(0, "stdout", b"0.5\n")])
    assert split(data) == [
        "[1,1]<stdout>:hello",
        "[1,1]<stdout>:world",
        "--------",
        "Primary job terminated normally",
        "[1,0]<stdout>:loss=0.5",
    ]


def test_a_result_longer_than_a_piece_is_found_although_another_rank_writes_in_between() -> None:
    result = {"weights": list(range(3000))}  # ~15 kB: four pieces
    line = ("AIRFLOW_MPI_RESULT " + json.dumps(result) + "\n").encode()
    data = mpiexec_output([(0, "stdout", line[:5000]), (1, "stderr", b"\r10%"), (0, "stdout", line[5000:])])
    tracker = OutputTracker()
    tracker.feed(split(data, [777] * 40))
    assert tracker.result == result and tracker.result_errors == []


def test_each_rank_stream_is_capped_and_the_others_go_on() -> None:
    data = mpiexec_output([(0, "stdout", b"z" * 300), (1, "stdout", b"fine\n"), (0, "stdout", b"z" * 300 + b"\n")])
    assert split(data, [64] * 20, max_bytes=100) == ["[1,1]<stdout>:fine", "[1,0]<stdout>:" + "z" * 100 + CUT_MARK]


def test_progress_gives_the_latest_state_of_each_rank_once() -> None:
    splitter = RankLineSplitter()
    splitter.feed(mpiexec_output([(0, "stderr", b"\r1%\r2%\r3%"), (1, "stderr", b"\r7%\r8%")]))
    states = splitter.progress()
    assert sorted(states) == ["[1,0]<stderr>:\r2%", "[1,1]<stderr>:\r7%"]
    assert all(isinstance(state, PartialLine) for state in states)
    assert splitter.progress() == []
    assert splitter.flush() == ["[1,0]<stderr>:\r3%", "[1,1]<stderr>:\r8%"]


def test_a_tag_split_across_chunks_is_recognized() -> None:
    data = mpiexec_output([(12, "stdout", b"a"), (3, "stderr", b"b\n"), (12, "stdout", b"c\n")])
    for cut in range(1, len(data)):
        assert split(data, [cut]) == ["[1,3]<stderr>:b", "[1,12]<stdout>:ac"], cut


def test_32_mb_without_a_newline_in_flat_memory() -> None:
    splitter = RankLineSplitter()
    piece = mpiexec_output([(0, "stdout", b"#" * (1 << 20))])  # 1 MiB of one rank, tagged every 4 KiB
    tracemalloc.start()
    try:
        for _ in range(32):
            assert splitter.feed(piece) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # the chunk being split, and one capped line
    (line,) = splitter.feed(b"\n")
    assert line == "[1,0]<stdout>:" + "#" * 65536 + CUT_MARK
