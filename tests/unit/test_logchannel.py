"""The loop's log channel on a real Unix socket pair, standing for the trigger runner's log
socket and its supervisor: while the supervisor does not read, records wait in one FIFO and the
loop goes on; once it reads, the loop is woken and the records go out in arrival order; a trigger
that ends has its records written first; the queue is bounded."""

from __future__ import annotations

import asyncio
import contextvars
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import structlog

from airflow_mpi import compat
from airflow_mpi.compat import trigger_log_fd
from airflow_mpi.triggers import logchannel
from airflow_mpi.triggers.logchannel import LogChannel, record_bytes

RECORD = 4096  # bytes a test record writes


@contextmanager
def log_socket() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(runner's end, supervisor's end), the runner's send buffer small so it fills at once."""
    runner, supervisor = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    runner.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
    supervisor.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    try:
        yield runner, supervisor
    finally:
        runner.close()
        supervisor.close()


def read_records(supervisor: socket.socket, count: int) -> list[bytes]:
    """What the supervisor reads: ``count`` records, each a tag then padding up to RECORD bytes."""
    data = b""
    supervisor.settimeout(5)
    while len(data) < count * RECORD:
        data += supervisor.recv(65536)
    return [data[i * RECORD : i * RECORD + 8] for i in range(count)]


def writer(fd: int, tag: str, written: list[str]) -> Callable[[], None]:
    def write() -> None:
        os.write(fd, tag.encode().ljust(RECORD, b"."))
        written.append(tag)

    return write


def test_records_wait_for_the_supervisor_in_one_fifo_and_the_loop_never_blocks() -> None:
    waits: list[float] = []
    written: list[str] = []

    async def run(runner: socket.socket, supervisor: socket.socket) -> tuple[float, list[bytes], bool]:
        channel = LogChannel(asyncio.get_running_loop(), runner.fileno(), waits.append)
        size = record_bytes("x" * RECORD)
        jobs = [object(), object()]
        started = time.monotonic()
        for i in range(40):  # 160 KB into a 16 KB buffer no one reads yet
            channel.submit(jobs[i % 2], size, writer(runner.fileno(), f"r{i:02d}", written))
        blocked = time.monotonic() - started
        assert channel.queue and channel.watching
        assert written == [f"r{i:02d}" for i in range(len(written))]  # what fit went at once, in order
        reading = asyncio.create_task(asyncio.to_thread(read_records, supervisor, 40))
        drained = await channel.drained(jobs[0], timeout=10)
        got = await reading
        return blocked, got, drained and not channel.watching

    with log_socket() as (runner, supervisor):
        blocked, got, drained = asyncio.run(run(runner, supervisor))
    assert blocked < 0.1  # never waited on the socket
    assert got == [f"r{i:02d}".encode().ljust(8, b".") for i in range(40)]
    assert written == [f"r{i:02d}" for i in range(40)]
    assert drained
    assert waits and max(waits) > 0  # the budget heard that records waited


def test_a_follow_reads_on_once_the_channel_has_caught_up() -> None:
    """While records wait for the supervisor, ``caught_up`` waits (the follows read no more);
    once the supervisor has read them all, it returns."""

    async def run(runner: socket.socket, supervisor: socket.socket) -> tuple[bool, bool]:
        channel = LogChannel(asyncio.get_running_loop(), runner.fileno(), lambda waited: None)
        await asyncio.wait_for(channel.caught_up(), 1)  # nothing queued: at once
        size = record_bytes("x" * RECORD)
        for i in range(20):
            channel.submit(object(), size, writer(runner.fileno(), f"r{i:02d}", []))
        waiting = asyncio.create_task(channel.caught_up())
        await asyncio.sleep(0.3)
        behind = not waiting.done()
        await asyncio.to_thread(read_records, supervisor, 20)
        await asyncio.wait_for(waiting, 10)
        return behind, not channel.queue

    with log_socket() as (runner, supervisor):
        behind, empty = asyncio.run(run(runner, supervisor))
    assert behind and empty


def test_a_trigger_that_ends_writes_its_records_first() -> None:
    written: list[str] = []

    async def run(runner: socket.socket, supervisor: socket.socket) -> None:
        channel = LogChannel(asyncio.get_running_loop(), runner.fileno(), lambda waited: None)
        size = record_bytes("x" * RECORD)
        ending, other = object(), object()
        for i in range(20):
            channel.submit(ending if i % 2 else other, size, writer(runner.fileno(), f"r{i:02d}", written))
        reader = threading.Thread(target=read_records, args=(supervisor, 20), daemon=True)
        reader.start()
        channel.write_now(ending)  # waits for the supervisor: its records, in their order
        assert all(record.owner is other for record in channel.queue)
        assert await channel.drained(ending, timeout=0)
        assert await channel.drained(other, timeout=10)
        reader.join(5)

    with log_socket() as (runner, supervisor):
        asyncio.run(run(runner, supervisor))
    odd = [tag for tag in written if int(tag[1:]) % 2]
    assert odd == [f"r{i:02d}" for i in range(1, 20, 2)]
    assert sorted(written) == [f"r{i:02d}" for i in range(20)]


def test_past_its_bound_the_queue_writes_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[str] = []
    monkeypatch.setattr(logchannel, "MAX_QUEUED_BYTES", 3 * record_bytes("x" * RECORD))

    async def run(runner: socket.socket, supervisor: socket.socket) -> int:
        channel = LogChannel(asyncio.get_running_loop(), runner.fileno(), lambda waited: None)
        size = record_bytes("x" * RECORD)
        reader = threading.Timer(0.3, read_records, args=(supervisor, 30))  # the supervisor reads late
        reader.daemon = True
        reader.start()
        job = object()
        for i in range(30):
            channel.submit(job, size, writer(runner.fileno(), f"r{i:02d}", written))
            assert channel.queued_bytes <= logchannel.MAX_QUEUED_BYTES
        await channel.drained(job, timeout=10)
        reader.join(5)
        return channel.forced

    with log_socket() as (runner, supervisor):
        forced = asyncio.run(run(runner, supervisor))
    assert forced > 0
    assert written == [f"r{i:02d}" for i in range(30)]


def test_a_queued_record_is_written_in_its_triggers_context() -> None:
    """Airflow sends a record to the task log the trigger's context variables name: written
    later from the loop's callback, each record still carries its own trigger's."""
    trigger_id: contextvars.ContextVar[int] = contextvars.ContextVar("trigger_id")
    seen: list[tuple[str, int]] = []

    async def run(runner: socket.socket, supervisor: socket.socket) -> None:
        channel = LogChannel(asyncio.get_running_loop(), runner.fileno(), lambda waited: None)
        size = record_bytes("x" * RECORD)

        def record(tag: str) -> Callable[[], None]:
            write = writer(runner.fileno(), tag, [])
            return lambda: (seen.append((tag, trigger_id.get())), write())[1]

        async def trigger(number: int) -> None:
            trigger_id.set(number)
            for i in range(10):
                channel.submit(number, size, record(f"t{number}r{i}"))
                await asyncio.sleep(0)

        await asyncio.gather(trigger(1), trigger(2))
        assert channel.queue
        await asyncio.to_thread(read_records, supervisor, 20)
        assert await channel.drained(1, timeout=10) and await channel.drained(2, timeout=10)

    with log_socket() as (runner, supervisor):
        asyncio.run(run(runner, supervisor))
    assert len(seen) == 20
    assert all(tag.startswith(f"t{number}r") for tag, number in seen)


def test_without_a_socket_records_are_written_at_once() -> None:
    written: list[str] = []

    async def run() -> None:
        channel = LogChannel(asyncio.get_running_loop(), None, lambda waited: None)
        read_end, write_end = os.pipe()
        try:
            channel.submit(object(), 10**9, writer(write_end, "now", []))
            written.append(os.read(read_end, 3).decode())
        finally:
            os.close(read_end)
            os.close(write_end)
        assert not channel.queue

    asyncio.run(run())
    assert written == ["now"]


def test_the_channel_is_structlogs_socket_and_nothing_else() -> None:
    """Airflow's trigger runner points structlog's BytesLogger at its log socket: that socket is
    found; a pipe (or a file, a terminal) is not a channel to watch."""
    saved = structlog.get_config()
    runner, supervisor = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    read_end, write_end = os.pipe()
    try:
        with os.fdopen(os.dup(runner.fileno()), "wb", buffering=0) as log_io:
            structlog.configure(logger_factory=structlog.BytesLoggerFactory(log_io))
            assert trigger_log_fd() == log_io.fileno()
        with os.fdopen(write_end, "wb", buffering=0) as pipe_io:
            structlog.configure(logger_factory=structlog.BytesLoggerFactory(pipe_io))
            assert trigger_log_fd() is None
        structlog.configure(logger_factory=structlog.PrintLoggerFactory())
        assert trigger_log_fd() is None
    finally:
        structlog.configure(**saved)
        runner.close()
        supervisor.close()
        os.close(read_end)


def test_the_channel_is_found_behind_airflows_own_logging_setup() -> None:
    """As the trigger runner sets up its logging (Airflow's ``configure_logging`` over the log
    socket its supervisor passed): in a process of its own, its logging is global."""
    program = """
import os, socket
from airflow.sdk.log import configure_logging
from airflow_mpi.compat import trigger_log_fd
runner, supervisor = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
log_io = os.fdopen(os.dup(runner.fileno()), "wb", buffering=0)
configure_logging(json_output=True, output=log_io, sending_to_supervisor=True)
fd = trigger_log_fd()
print(os.path.samestat(os.fstat(fd), os.fstat(runner.fileno())) if fd is not None else None)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().splitlines()[-1:] == ["True"], done.stdout + done.stderr


def test_an_airflow_release_it_was_not_checked_on_gets_records_written_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's log socket is found through structlog's private file: on a release outside
    the checked range the channel is not used (records are written at once, as Airflow's logging
    does), and every record still reaches the log, in order."""
    saved = structlog.get_config()
    runner, supervisor = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    monkeypatch.setattr(compat, "LOG_SOCKET_CHECKED", False)
    try:
        with os.fdopen(os.dup(runner.fileno()), "wb", buffering=0) as log_io:
            structlog.configure(logger_factory=structlog.BytesLoggerFactory(log_io))
            assert trigger_log_fd() is None

            async def run() -> list[str]:
                written: list[str] = []
                channel = LogChannel.find(asyncio.get_running_loop(), lambda waited: None)
                assert channel.fd is None
                for i in range(3):
                    channel.submit(object(), 10**9, lambda i=i: written.append(f"line {i}"))  # no room: still at once
                return written

            assert asyncio.run(run()) == ["line 0", "line 1", "line 2"]
    finally:
        structlog.configure(**saved)
        runner.close()
        supervisor.close()
