"""The master's lines into the task log, written off the triggerer's event loop.

Airflow's trigger runner writes each log record to its supervisor over a socket, synchronously,
and the supervisor turns it into the task try's log file. When the supervisor falls behind (a
hundred jobs printing, one flooding), that write blocks, and with it every trigger of the
triggerer: measured with Airflow's own triggerer, steps of 0.2-0.5 s spent in the socket write
with 2 ms of CPU (``bench/real_triggerer_logs.py --loop-stats``). Here one thread per process
does the writes, in order, each in the context of the trigger that queued it (Airflow routes a
record to its task's log by context variables). A log follow queues without blocking and
awaits ``room()`` between reads: while too much waits, its lines lag in the pod's log and the
loop goes on. A trigger awaits ``written()`` before it fires, so the resumed task's count of
lines shown is what its log holds.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import os
import threading
from collections.abc import Callable
from typing import Any

# A call to make: in this context, this callable, these arguments.
_Record = tuple[contextvars.Context, Callable[..., Any], tuple[Any, ...], dict[str, Any]]

QUEUED_RECORDS = 4096  # records waiting for the thread before the follows wait (a few hundred KB)
IDLE_EXIT = 5.0  # seconds the thread waits for work before it ends (the next write starts one)
NOTIFY_EVERY = 256  # records written between wake-ups of waiting follows, whatever the backlog


class LogWriter:
    """A FIFO of log calls, made by one thread; awaitable room and completion."""

    def __init__(self, limit: int = QUEUED_RECORDS) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._records: collections.deque[_Record] = collections.deque()
        self._queued = 0  # records ever queued (a record's number)
        self._written = 0  # records ever written (or dropped by a failing call)
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._thread: threading.Thread | None = None

    def write(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
        """Queue ``call(*args, **kwargs)`` in the caller's context; its number, for ``written``."""
        context = contextvars.copy_context()
        with self._lock:
            self._queued += 1
            self._records.append((context, call, args, kwargs))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="airflow-mpi-log-writer", daemon=True)
                self._thread.start()
            self._work.notify()
            return self._queued

    @property
    def backlog(self) -> int:
        return self._queued - self._written

    async def room(self) -> None:
        """Until fewer than ``limit`` records wait."""
        await self._until(lambda: self._queued - self._written < self.limit)

    async def written(self, number: int | None = None) -> None:
        """Until record ``number`` (default: every record queued so far) is written."""
        target = self._queued if number is None else number
        await self._until(lambda: self._written >= target)

    async def _until(self, done: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if done():
                    return
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, waiter))
            await waiter

    def _run(self) -> None:
        since_notify = 0
        while True:
            with self._lock:
                while not self._records:
                    if not self._work.wait(timeout=IDLE_EXIT) and not self._records:
                        self._thread = None
                        return
                context, call, args, kwargs = self._records.popleft()
            with contextlib.suppress(Exception):  # as logging does: a record that fails is not fatal
                context.run(call, *args, **kwargs)
            since_notify += 1
            with self._lock:
                self._written += 1
                backlog = self._queued - self._written
                if self._waiters and (backlog < self.limit // 2 or since_notify >= NOTIFY_EVERY):
                    waiters, self._waiters = self._waiters, []
                    since_notify = 0
                else:
                    waiters = []
            for loop, waiter in waiters:
                with contextlib.suppress(RuntimeError):  # its loop has closed
                    loop.call_soon_threadsafe(_wake, waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


_WRITER = LogWriter()


def log_writer() -> LogWriter:
    """This process's writer (a triggerer runs one event loop; each trigger shares it)."""
    return _WRITER


class MasterRecords:
    """The master's lines as records of the task try's log, through the writer. Each is marked
    with how far the master's log has been read (``lines_read()``), as its source
    (``logfollow.build_mark``): a trigger started again reads the marks back. Structlog, whose
    fields reach the log file (stdlib logging's ``extra`` does not, in Airflow 3's triggerer)."""

    def __init__(self, lines_read: Callable[[], int]) -> None:
        import structlog

        from airflow_mpi.triggers.logfollow import MASTER_LOGGER

        self.lines_read = lines_read
        self.logger = structlog.get_logger(logger_name=MASTER_LOGGER)
        self.last = 0  # the writer's number of the last record queued

    def info(self, text: str) -> None:
        self._write(self.logger.info, text)

    def warning(self, text: str) -> None:
        self._write(self.logger.warning, text)

    def _write(self, call: Callable[..., Any], text: str) -> None:
        from airflow_mpi.triggers.logfollow import build_mark

        self.last = log_writer().write(call, text, logger=build_mark(self.lines_read()))

    async def written(self, timeout: float) -> None:
        """Until every record queued is written, or ``timeout`` (a supervisor stuck that long:
        the trigger fires anyway)."""
        if self.last:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await log_writer().written(self.last)


def _new_writer_in_child() -> None:
    """A fork has none of its parent's threads: a writer of its own (Airflow forks the runner)."""
    global _WRITER
    _WRITER = LogWriter()


os.register_at_fork(after_in_child=_new_writer_in_child)
