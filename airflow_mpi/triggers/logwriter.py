"""The master's lines into the task log from the trigger: few records, each soon.

Airflow's trigger runner writes each log record to its supervisor over a socket, synchronously;
the supervisor decodes it and writes it to the task try's log file. Both cost per record, and
when the supervisor falls behind the runner's write blocks the event loop, with every trigger on
it: measured with Airflow's own triggerer (``bench/real_triggerer_logs.py --loop-stats``), steps
of 0.2-0.5 s spent in that write with 2 ms of CPU, 100 jobs printing 20 lines a second each, one
record a line. A thread of its own for the writes did not help: every write hands the GIL back
and forth with the busy loop, and the lines lagged 13 s.

So a job's lines are held for at most ``HOLD`` seconds and written as one record: a job printing
20 lines a second makes 4 records a second, not 20. A warning goes out at once, after the lines
before it. A write that waits off the CPU tells the log budget the channel is behind
(``LogBudget.wrote``): every job's rate halves, so a flood slows and the others keep their pace.
Each record is marked with how far the master's log has been read through its last line
(``logfollow.build_mark``), so a trigger started again goes on after what the log holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from airflow_mpi.observe.output import MAX_RECORD_LINES

HOLD = 0.25  # seconds a line may wait for the next ones (the live log's 2 s allows it)


class MasterRecords:
    """The master's lines as records of the task try's log (structlog: its fields reach the
    log file; stdlib logging's ``extra`` does not, in Airflow 3's triggerer)."""

    def __init__(self, lines_read: Callable[[], int], hold: float = HOLD) -> None:
        import structlog

        from airflow_mpi.triggers.logfollow import MASTER_LOGGER

        self.lines_read = lines_read
        self.hold = hold
        self.logger = structlog.get_logger(logger_name=MASTER_LOGGER)
        self._held: list[str] = []
        self._held_lines = 0
        self._mark = 0  # lines read through the last line held
        self._timer: asyncio.TimerHandle | None = None

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
        self._timed(self.logger.warning, text, self.lines_read())

    def flush(self) -> None:
        """The held lines as one record, now (before the trigger fires, and on its timer)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held:
            text, self._held, self._held_lines = "\n".join(self._held), [], 0
            self._timed(self.logger.info, text, self._mark)

    def _timed(self, call: Callable[..., Any], text: str, mark: int) -> None:
        """Write, telling the log budget how long the write waited (its time off the CPU: a
        large record's own work is no sign of a channel that is behind)."""
        from airflow_mpi.triggers.logfollow import budget_for_loop

        started, cpu = time.monotonic(), time.thread_time()
        call(text, logger=_mark(mark))
        budget_for_loop().wrote((time.monotonic() - started) - (time.thread_time() - cpu))


def _mark(lines: int) -> Any:
    from airflow_mpi.triggers.logfollow import build_mark

    return build_mark(lines)
