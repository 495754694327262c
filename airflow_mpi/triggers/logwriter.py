"""The master's lines into the task log from the trigger: few records, each soon.

Airflow's trigger runner writes each log record to its supervisor over a socket; the supervisor
decodes it and writes it to the task try's log file. Both cost per record. So a job's lines are
held for at most ``HOLD`` seconds and written as one record: a job printing 20 lines a second
makes 4 records a second, not 20. A warning goes out at once, after the lines before it.

The records go through the loop's ``LogChannel`` (``logchannel``): written when the socket has
room, queued in one FIFO across jobs when the supervisor is behind, so a slow supervisor never
blocks the event loop; a record that waited tells the log budget (``LogBudget.wrote``), every
job's rate halves, and a flood slows while the others keep their pace. Before the trigger fires,
its records are all written: the resumed task counts them as shown.

Each record names how far the master's log has been read through its last line
(``logfollow.build_mark``). With the job's shown mark (``logshown``), a record goes out only once
the mark counts its lines: a trigger that another triggerer starts again goes on after them. The
mark is written at most once a second: the records that came meanwhile wait, and one write
counts them all (a job printing 20 lines a second: 1 write a second, not 4).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_mpi.observe.output import MAX_RECORD_LINES
from airflow_mpi.triggers.logchannel import LogChannel, channel_for_loop, record_bytes
from airflow_mpi.triggers.timeouts import timeout_after

if TYPE_CHECKING:
    from airflow_mpi.triggers.logshown import ShownLines

HOLD = 0.25  # seconds a line may wait for the next ones (the live log's 2 s allows it)


class MasterRecords:
    """The master's lines as records of the task try's log (structlog: its fields reach the
    log file; stdlib logging's ``extra`` does not, in Airflow 3's triggerer)."""

    def __init__(self, lines_read: Callable[[], int], hold: float = HOLD, shown: ShownLines | None = None) -> None:
        import structlog

        from airflow_mpi.triggers.logfollow import MASTER_LOGGER

        self.lines_read = lines_read
        self.hold = hold
        self.shown = shown  # None: records go out at once (no mark to keep)
        # Waiting for their mark: (write, text, lines read through it, when it was read).
        self._outbox: deque[tuple[Callable[..., Any], str, int, float]] = deque()
        self._gave_way = False  # said that another trigger shows the log
        self._shipping: asyncio.Task[None] | None = None
        self.logger = structlog.get_logger(logger_name=MASTER_LOGGER)
        self._held: list[str] = []
        self._held_lines = 0
        self._mark = 0  # lines read through the last line held
        self._timer: asyncio.TimerHandle | None = None
        self._channel_found: LogChannel | None = None

    def info(self, text: str) -> None:
        """Lines, held until ``hold`` has passed since the first of them (or there are many)."""
        self._held.append(text)
        self._held_lines += text.count("\n") + 1
        self._mark = self.lines_read()
        if self._held_lines >= MAX_RECORD_LINES:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.hold, self.flush)

    def warning(self, text: str) -> None:
        """At once, after the lines held before it."""
        self.flush()
        self._submit(self.logger.warning, text, self.lines_read())

    def flush(self) -> None:
        """The held lines as one record, now (on its timer, at a warning, and at the end)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held:
            text, self._held, self._held_lines = "\n".join(self._held), [], 0
            self._submit(self.logger.info, text, self._mark)

    async def written(self, timeout: float) -> None:
        """Every line so far in the log: held ones sent, queued ones written (waiting for the
        channel up to ``timeout``, then for the supervisor)."""
        self.flush()
        if self._shipping is not None:
            with contextlib.suppress(TimeoutError):
                async with timeout_after(timeout):
                    await asyncio.shield(self._shipping)
        channel = self._channel()
        if not await channel.drained(self, timeout):
            channel.write_now(self)

    async def caught_up(self) -> None:
        """Once the loop's channel has written every job's records (the follow reads on then)."""
        await self._channel().caught_up()

    async def stop(self, timeout: float) -> None:
        """The trigger is cancelled (its triggerer stops, or the trigger moves to another): every
        line read goes in the log and the mark counts it, unless another trigger owns the mark
        by now (it shows them); the mark's write waits up to ``timeout``."""
        self.flush()
        if self._shipping is not None:
            self._shipping.cancel()
        try:
            if self.shown is not None and self._outbox and not self.shown.lost:
                async with timeout_after(timeout):
                    await self.shown.mark(self._outbox[-1][2], read_at=self._outbox[0][3], stopping=True)
        finally:
            self.write_now()

    def write_now(self) -> None:
        """Every line so far in the log at once (no waiting on the loop), unless another trigger
        marks this log now."""
        self.flush()
        if self._shipping is not None:
            self._shipping.cancel()
            self._shipping = None
        outbox, self._outbox = self._outbox, deque()
        if self.shown is None or not self.shown.lost:  # else the mark's holder shows them
            for call, text, mark, _ in outbox:
                self._send(call, text, mark)
        self._channel().write_now(self)

    def _submit(self, call: Callable[..., Any], text: str, mark: int) -> None:
        if self.shown is None:
            self._send(call, text, mark)
            return
        self._outbox.append((call, text, mark, time.monotonic()))
        if self._shipping is None:
            self._shipping = asyncio.get_running_loop().create_task(self._ship())

    async def _ship(self) -> None:
        """The outbox in order: once a write is due, one mark counting every record waiting,
        then those records. While another trigger holds the mark, the records it counts are its
        to show: dropped; the others wait until it counts them too, or the mark is taken back."""
        shown = self.shown
        assert shown is not None
        try:
            while self._outbox:
                await shown.pace()
                counted = self._outbox[-1][2]
                if await shown.mark(counted, read_at=self._outbox[0][3]):
                    while self._outbox and self._outbox[0][2] <= counted:
                        call, text, mark, _ = self._outbox.popleft()
                        self._send(call, text, mark)
                    continue
                while self._outbox and shown.holder_counts(self._outbox[0][2]):
                    self._outbox.popleft()
                if not self._gave_way:
                    self._gave_way = True
                    self.logger.info("airflow-mpi: another triggerer shows this job's log from here on")
        finally:
            self._shipping = None

    def _send(self, call: Callable[..., Any], text: str, mark: int) -> None:
        self._channel().submit(self, record_bytes(text), lambda: call(text, logger=_mark(mark)))

    def _channel(self) -> LogChannel:
        """The loop's channel, looked up once (a trigger's records stay in its one loop)."""
        if self._channel_found is None:
            from airflow_mpi.triggers.logfollow import budget_for_loop

            self._channel_found = channel_for_loop(budget_for_loop().wrote)
        return self._channel_found


def _mark(lines: int) -> Any:
    from airflow_mpi.triggers.logfollow import build_mark

    return build_mark(lines)
