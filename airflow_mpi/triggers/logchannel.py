"""The trigger runner's log socket, written without blocking the event loop.

Airflow's trigger runner writes every log record to its supervisor over a Unix socket,
synchronously: when the supervisor stops reading for a while (it spends most of its CPU on the
trigger table in the database), the socket fills, the write blocks, and with it the event loop
and every trigger on it. Airflow's triggerer then warns that the loop was blocked. Measured with
Airflow's own triggerer (``bench/real_triggerer_logs.py``), the triggerer on a CPU of its own:
up to 6.5 s blocked in 20 s, 100 jobs printing 20 lines a second each.

So the master's records of every job in the loop go through one ``LogChannel``: a record is
written only when the socket has room for it (``TIOCOUTQ`` against ``SO_SNDBUF``: the write
then returns at once); otherwise it waits in one FIFO, across jobs, and the loop is told
(``add_writer``, epoll) when the supervisor has read, then writes what fits. No job waits longer
than the records ahead of it, and no polling: the channel drains as fast as the supervisor reads.
While records wait, the jobs' follows read no further (``caught_up``): their lines wait in the
pods' logs, and the CPU the reads would take is left to the supervisor, as the blocking write
did, without stopping the loop. A record that waited tells the log budget the channel is behind
(``LogBudget.wrote``): the jobs' rates halve and a flood slows. Bounded: past
``MAX_QUEUED_BYTES`` the channel writes as before, waiting for the supervisor.

Where the records do not go to such a socket (``dag.test()``, a triggerer logging to a file or a
pipe), ``LogChannel.find`` returns a channel that writes at once, as Airflow's logging does.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import contextvars
import fcntl
import os
import socket
import termios
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from airflow_mpi.triggers.timeouts import timeout_after

MAX_QUEUED_BYTES = 8 * 1024 * 1024  # records held for the socket before writes wait again
SKB_OVERHEAD = 1024  # what the kernel charges a socket's send buffer per write, beyond the bytes
SKB_BYTES = 32 * 1024  # the most one socket buffer of a Unix stream write holds
RESUME_STEP = 0.0005  # seconds between the follows that read on once the channel caught up


def record_bytes(text: str) -> int:
    """What a record of ``text`` costs on the socket, JSON-encoded with its fields (an
    over-estimate: a write the estimate lets through must not block)."""
    size = len(text.encode()) * 5 // 4 + 512
    return size + SKB_OVERHEAD * (1 + size // SKB_BYTES)


@dataclass
class _Record:
    owner: object  # the job whose record it is (its records stay in order: one FIFO)
    size: int
    write: Callable[[], None]
    queued_at: float = field(default_factory=time.monotonic)
    # The trigger's context: Airflow routes a record to its task's log by the context variables
    # bound in the trigger's task, and a queued record is written from the loop's callback.
    context: contextvars.Context = field(default_factory=contextvars.copy_context)

    def write_out(self) -> None:
        self.context.run(self.write)


class LogChannel:
    """One per event loop: writes records now when the socket has room, else in arrival order
    once the supervisor has read. ``fd`` None: write at once (not a socket we can watch)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int | None, on_waited: Callable[[float], None]) -> None:
        self.loop, self.fd, self.on_waited = loop, fd, on_waited
        self.send_buffer = _send_buffer(fd) if fd is not None else 0
        self.queue: deque[_Record] = deque()
        self.queued_bytes = 0
        self.watching = False  # registered with the loop for the socket's room
        self.forced = 0  # records written past MAX_QUEUED_BYTES (waiting for the supervisor)
        self._pending: dict[int, int] = {}  # id(owner) -> its records queued
        self._drained: dict[int, asyncio.Event] = {}  # id(owner) -> set once none of its is queued
        self._empty = asyncio.Event()  # set while nothing is queued
        self._empty.set()
        self._waiting = 0  # follows waiting in ``caught_up``

    @classmethod
    def find(cls, loop: asyncio.AbstractEventLoop, on_waited: Callable[[float], None]) -> LogChannel:
        """The channel of the socket structlog writes to in this process, if it is one."""
        from airflow_mpi.compat import trigger_log_fd

        return cls(loop, trigger_log_fd(), on_waited)

    def submit(self, owner: object, size: int, write: Callable[[], None]) -> None:
        """Write now if nothing is queued and the socket has room; else queue it."""
        if self.fd is None:
            write()
            return
        if not self.queue and self._room() >= size:
            write()
            return
        self.queue.append(_Record(owner, size, write))
        self.queued_bytes += size
        self._pending[id(owner)] = self._pending.get(id(owner), 0) + 1
        self._empty.clear()
        self._drained.setdefault(id(owner), asyncio.Event()).clear()
        if self.queued_bytes > MAX_QUEUED_BYTES:
            self.forced += 1
            self._pump(force=True)
        else:
            self._watch()

    async def caught_up(self) -> None:
        """Return once nothing is queued: a job's follow waits here before it reads on, so while
        the supervisor is behind the lines wait in the pod's log, not in memory, and the CPU the
        reads would take is left to the supervisor (what the blocking write did, without the loop)."""
        if self._empty.is_set():
            return
        place, self._waiting = self._waiting, self._waiting + 1
        try:
            await self._empty.wait()
        finally:
            self._waiting -= 1
        await asyncio.sleep(place * RESUME_STEP)  # woken together, the follows read on one by one

    async def drained(self, owner: object, timeout: float) -> bool:
        """Wait until none of ``owner``'s records is queued (up to ``timeout``); False if some
        still are."""
        event = self._drained.get(id(owner))
        if event is None or event.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            async with timeout_after(timeout):
                await event.wait()
        return event.is_set()

    def write_now(self, owner: object) -> None:
        """Write ``owner``'s queued records at once, waiting for the supervisor if need be (the
        trigger ends: what it read must be in the log before it is gone)."""
        if not self._pending.get(id(owner)):
            return
        mine = [record for record in self.queue if record.owner is owner]
        self.queue = deque(record for record in self.queue if record.owner is not owner)
        try:
            for record in mine:
                self._taken(record)
                record.write_out()
        finally:
            self._settle()

    def _pump(self, *, woken: bool = False, force: bool = False) -> None:
        """Write queued records while they fit. ``woken``: the loop said the socket is writable
        (the kernel says so once three quarters of its buffer are free), so the first record goes
        whatever its size (one larger than that room waits only for the rest, and is never held
        for ever). ``force``: past the bound, write until within it, waiting for the supervisor."""
        now = time.monotonic()
        waited = 0.0
        try:
            while self.queue:
                record = self.queue[0]
                must = woken or (force and self.queued_bytes > MAX_QUEUED_BYTES)
                if not must and self._room() < record.size:
                    break
                woken = False
                self._taken(self.queue.popleft())
                waited = max(waited, now - record.queued_at)
                record.write_out()
        finally:
            if waited:
                self.on_waited(waited)
            self._settle()

    def _taken(self, record: _Record) -> None:
        """``record`` is out of the queue (written next)."""
        self.queued_bytes -= record.size
        key = id(record.owner)
        self._pending[key] -= 1
        if not self._pending[key]:
            del self._pending[key]

    def _on_writable(self) -> None:
        self._pump(woken=True)

    def _watch(self) -> None:
        if not self.watching and self.fd is not None:
            self.loop.add_writer(self.fd, self._on_writable)
            self.watching = True

    def _settle(self) -> None:
        """Stop watching once nothing is queued; wake who waits for an owner's records."""
        for key in [key for key in self._drained if key not in self._pending]:
            self._drained.pop(key).set()
        if self.queue:
            self._watch()
            return
        self._empty.set()
        if self.watching and self.fd is not None:
            self.loop.remove_writer(self.fd)
            self.watching = False

    def _room(self) -> int:
        """Bytes the socket's send buffer takes before a write would wait."""
        assert self.fd is not None
        unread = array.array("i", [0])
        try:
            fcntl.ioctl(self.fd, termios.TIOCOUTQ, unread, True)
        except OSError:
            return 1 << 30  # cannot tell: write (as Airflow's logging would)
        return self.send_buffer - unread[0]


def _send_buffer(fd: int) -> int:
    """The socket's send buffer as the kernel counts it (what ``TIOCOUTQ`` is measured against)."""
    probe = socket.socket(fileno=os.dup(fd))
    try:
        return int(probe.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
    finally:
        probe.close()


_CHANNELS: dict[int, LogChannel] = {}  # per event loop (id): a triggerer runs one


def channel_for_loop(on_waited: Callable[[float], None]) -> LogChannel:
    """The running loop's channel (``on_waited``: told how long records waited, when they did)."""
    loop = asyncio.get_running_loop()
    channel = _CHANNELS.get(id(loop))
    if channel is None or channel.loop is not loop:
        _CHANNELS.clear()  # an earlier loop (tests run several) is gone
        channel = _CHANNELS[id(loop)] = LogChannel.find(loop, on_waited)
    return channel
