"""The trigger's records of the master's lines: a job's lines held up to ``HOLD`` and written as
one record (marked through its last line), warnings at once after what was held, and each record
in the context of the trigger (Airflow routes a record to its task's log by context variables)."""

from __future__ import annotations

import asyncio

from structlog.contextvars import bind_contextvars, merge_contextvars
from structlog.testing import capture_logs

from airflow_mpi.observe.output import MAX_RECORD_LINES
from airflow_mpi.triggers.logfollow import build_mark
from airflow_mpi.triggers.logwriter import HOLD, MasterRecords


class Reader:
    """Stands for the master output's count of lines read."""

    def __init__(self) -> None:
        self.lines = 0

    def read(self, text: str) -> str:
        self.lines += text.count("\n") + 1
        return text


def test_lines_within_the_hold_are_one_record_marked_through_the_last() -> None:
    reader = Reader()

    async def trigger(trigger_id: int) -> None:
        bind_contextvars(trigger_id=trigger_id)  # as Airflow's runner binds a trigger's ids
        records = MasterRecords(lambda: reader.lines)
        for i in range(5):
            records.info(reader.read(f"[1,0]<stdout>:line {i}"))
            await asyncio.sleep(0.01)
        await asyncio.sleep(HOLD + 0.2)  # the hold's timer writes them

    with capture_logs(processors=[merge_contextvars]) as logs:
        asyncio.run(trigger(7))
    assert [(log["event"], log["logger"], log["trigger_id"]) for log in logs] == [
        ("\n".join(f"[1,0]<stdout>:line {i}" for i in range(5)), build_mark(5), 7)
    ]


def test_a_warning_goes_out_at_once_after_the_lines_held_before_it() -> None:
    reader = Reader()

    async def trigger() -> None:
        records = MasterRecords(lambda: reader.lines)
        records.info(reader.read("[1,0]<stdout>:AIRFLOW_MPI_RESULT nope"))
        records.warning("airflow-mpi: WARNING: the result line is not JSON")
        records.info(reader.read("[1,0]<stdout>:after"))
        records.flush()  # as the trigger does before it fires

    with capture_logs() as logs:
        asyncio.run(trigger())
    assert [(log["log_level"], log["event"], log["logger"]) for log in logs] == [
        ("info", "[1,0]<stdout>:AIRFLOW_MPI_RESULT nope", build_mark(1)),
        ("warning", "airflow-mpi: WARNING: the result line is not JSON", build_mark(1)),
        ("info", "[1,0]<stdout>:after", build_mark(2)),
    ]


def test_a_flood_is_written_as_soon_as_a_record_is_full() -> None:
    reader = Reader()
    batch = "\n".join(f"[1,0]<stdout>:{i}" for i in range(MAX_RECORD_LINES))

    async def trigger() -> list[int]:
        records = MasterRecords(lambda: reader.lines)
        with capture_logs() as logs:
            records.info(reader.read(batch))
            written_at_once = len(logs)
            records.flush()
        return [written_at_once, len(logs)]

    assert asyncio.run(trigger()) == [1, 1]  # nothing held, nothing left to write


def test_nothing_held_writes_nothing() -> None:
    async def trigger() -> None:
        MasterRecords(lambda: 0).flush()

    with capture_logs() as logs:
        asyncio.run(trigger())
    assert logs == []
