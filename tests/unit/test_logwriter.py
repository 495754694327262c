"""The log writer: the master's lines written by a thread of their own, in order, each in the
context of the trigger that queued it, with the event loop never waiting on a slow sink."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from airflow_mpi.triggers import logwriter
from airflow_mpi.triggers.logwriter import LogWriter

TRIGGER = contextvars.ContextVar("trigger_id", default=None)


def test_records_are_written_in_order_each_in_the_context_that_queued_it() -> None:
    writer, seen = LogWriter(), []

    async def trigger(trigger_id: int) -> None:
        TRIGGER.set(trigger_id)  # as Airflow binds a trigger's ids before running it
        for line in range(500):
            writer.write(lambda line=line: seen.append((TRIGGER.get(), line)))
            if line % 50 == 0:
                await asyncio.sleep(0)

    async def both() -> None:
        await asyncio.gather(trigger(1), trigger(2))
        await writer.written()

    asyncio.run(both())
    assert len(seen) == 1000 and writer.backlog == 0
    for trigger_id in (1, 2):
        assert [line for owner, line in seen if owner == trigger_id] == list(range(500))


def test_a_blocked_sink_does_not_block_the_event_loop() -> None:
    writer, gate = LogWriter(), threading.Event()

    async def main() -> tuple[float, float]:
        gaps, last = [0.0], time.monotonic()

        async def tick() -> None:
            nonlocal last
            while True:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        started = time.monotonic()
        number = writer.write(lambda: gate.wait(10))  # a supervisor not reading its socket
        queued_in = time.monotonic() - started
        asyncio.get_running_loop().call_later(0.5, gate.set)
        await writer.written(number)
        ticker.cancel()
        return queued_in, max(gaps)

    queued_in, longest_gap = asyncio.run(main())
    assert queued_in < 0.05
    assert longest_gap < 0.2  # the loop went on for the 0.5 s the write was blocked


def test_room_waits_while_too_much_is_queued() -> None:
    writer, gate = LogWriter(limit=10), threading.Event()

    async def main() -> None:
        for _ in range(20):
            writer.write(gate.wait, 10)
        room = asyncio.create_task(writer.room())
        await asyncio.sleep(0.3)
        assert not room.done() and writer.backlog >= 10  # the follows wait: lines stay in the pod's log
        gate.set()
        async with asyncio.timeout(5):
            await room
            await writer.written()
        assert writer.backlog == 0

    asyncio.run(main())


def test_a_failing_record_is_not_fatal() -> None:
    writer, seen = LogWriter(), []

    def broken() -> None:
        raise ValueError("cannot write")

    async def main() -> None:
        writer.write(broken)
        writer.write(seen.append, "after")
        await writer.written()

    asyncio.run(main())
    assert seen == ["after"]


def test_the_thread_ends_when_idle_and_starts_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logwriter, "IDLE_EXIT", 0.1)
    writer, seen = LogWriter(), []

    async def write(value: str) -> None:
        writer.write(seen.append, value)
        await writer.written()

    asyncio.run(write("first"))
    deadline = time.monotonic() + 5
    while writer._thread is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert writer._thread is None
    asyncio.run(write("second"))
    assert seen == ["first", "second"]
