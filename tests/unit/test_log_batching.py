"""The waiting path's log reader: what a kubelet sends a line per HTTP chunk is taken in one
batch per read (the caller's per-batch work is paid per read, not per line), bounded in bytes,
and the stream's end or error is still seen after the data before it."""

from __future__ import annotations

import queue
from typing import Any

from airflow_mpi.backends.log_follow import EOF, take_queued


def queued(*items: Any) -> queue.Queue[Any]:
    chunks: queue.Queue[Any] = queue.Queue()
    for item in items:
        chunks.put(item)
    return chunks


def test_the_chunks_already_there_are_joined_behind_the_first() -> None:
    chunks = queued(b"b\n", b"c\n")
    assert take_queued(chunks, b"a\n") == (b"a\nb\nc\n", None)
    assert chunks.empty()


def test_the_end_is_returned_after_the_data_before_it() -> None:
    assert take_queued(queued(b"b\n", EOF, b"never"), b"a\n") == (b"a\nb\n", EOF)
    error = ConnectionResetError("dropped")
    assert take_queued(queued(error), b"a\n") == (b"a\n", error)
    assert take_queued(queued(), EOF) == (b"", EOF)


def test_a_batch_is_bounded_in_bytes() -> None:
    chunks = queued(*[b"x" * 100] * 50)
    data, end = take_queued(chunks, b"x" * 100, limit=1000)
    assert (len(data), end) == (1000, None) and chunks.qsize() == 41
