"""The live log's shown mark on the job's ConfigMap (``triggers.logshown``), over real HTTP against
the API double with the async client the triggerer uses: a trigger reads the mark and takes it
over; each record goes out after the mark counts it; a second trigger that takes the mark over
makes the first one stop showing lines (none shown twice); without the ConfigMap or the verb the
lines are still shown, with one warning."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from airflow_mpi.observe.shown import SHOWN_ANNOTATION, ShownMark, lines_to_skip, parse_shown_mark
from airflow_mpi.triggers.logfollow import build_mark
from airflow_mpi.triggers.logshown import ShownLines
from airflow_mpi.triggers.logwriter import MasterRecords
from tests.doubles.kube_double import KubeDouble

CONFIG_MAP = "job-1-config"
log = logging.getLogger("test-shown")


@pytest.fixture
def config_map(double: KubeDouble) -> str:
    double.create("configmaps", "default", {"metadata": {"name": CONFIG_MAP}, "data": {"launch.sh": "#!/bin/sh\n"}})
    return CONFIG_MAP


class Written:
    """Stands for the records' structlog logger: what reached the task log, with its source."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def info(self, text: str, logger: str = "") -> None:
        self.entries.append({"event": text, "logger": logger})

    warning = info


def records_for(lines_read: Any, written: Written, **options: Any) -> MasterRecords:
    records = MasterRecords(lines_read, **options)
    records.logger = written
    return records


def annotation(double: KubeDouble) -> ShownMark | None:
    (obj,) = [o for o in double.list_objects("configmaps", "default") if o["metadata"]["name"] == CONFIG_MAP]
    return parse_shown_mark(obj["metadata"].get("annotations"))


async def with_client(double: KubeDouble, body: Any) -> Any:
    from kubernetes_asyncio import client

    configuration = client.Configuration()
    configuration.host = double.url
    async with client.ApiClient(configuration) as api_client:
        return await body(api_client)


def test_the_mark_is_claimed_then_counts_each_record_before_it_is_written(double: KubeDouble, config_map: str) -> None:
    double.create("configmaps", "default", {"metadata": {"name": "other"}, "data": {}})
    order: list[str] = []
    written = Written()

    async def body(api_client: Any) -> tuple[int, int]:
        mark = ShownLines(api_client, "default", config_map, 1)
        before = await mark.claim(log)
        lines = [0]
        records = records_for(lambda: lines[0], written, hold=0.01, shown=mark)
        real_mark = mark.mark

        async def spied(count: int) -> bool:
            order.append(f"mark {count}")
            return await real_mark(count)

        mark.mark = spied  # type: ignore[method-assign]
        for i in range(3):
            lines[0] += 1
            records.info(f"[1,0]<stdout>:line {i}")
            await asyncio.sleep(0.05)
        await records.written(5)
        return before, mark.lines

    before, after = asyncio.run(with_client(double, body))
    assert before == 0 and after == 3
    assert [entry["event"] for entry in written.entries] == [f"[1,0]<stdout>:line {i}" for i in range(3)]
    assert [entry["logger"] for entry in written.entries] == [build_mark(i) for i in (1, 2, 3)]
    assert order == ["mark 1", "mark 2", "mark 3"]
    found = annotation(double)
    assert found is not None and found.lines == 3 and found.try_number == 1
    data = next(o for o in double.list_objects("configmaps", "default") if o["metadata"]["name"] == CONFIG_MAP)["data"]
    assert data == {"launch.sh": "#!/bin/sh\n"}  # only the annotation changed


def test_a_trigger_started_again_goes_on_after_the_marked_lines(double: KubeDouble, config_map: str) -> None:
    async def body(api_client: Any) -> tuple[int, str, str]:
        first = ShownLines(api_client, "default", config_map, 1)
        await first.claim(log)
        await first.mark(42)
        second = ShownLines(api_client, "default", config_map, 1)
        return await second.claim(log), first.owner, second.owner

    shown, first, second = asyncio.run(with_client(double, body))
    assert shown == 42 and first != second
    found = annotation(double)
    assert found is not None and found.owner == second and found.lines == 42
    assert lines_to_skip(found, 10) == 42 and lines_to_skip(found, 50) == 50 and lines_to_skip(None, 7) == 7


def test_a_trigger_whose_mark_was_taken_over_shows_nothing_more(double: KubeDouble, config_map: str) -> None:
    """Two triggerers run the same trigger for a while (Airflow's handover): the one that claimed
    last shows the lines; the other drops what it has not written, never showing a line twice."""

    written = Written()

    async def body(api_client: Any) -> tuple[bool, bool, int]:
        old = ShownLines(api_client, "default", config_map, 1)
        await old.claim(log)
        lines = [0]
        records = records_for(lambda: lines[0], written, hold=0.01, shown=old)
        lines[0] = 5
        records.info("[1,0]<stdout>:before the takeover")
        await records.written(5)
        new = ShownLines(api_client, "default", config_map, 1)
        await new.claim(log)
        lines[0] = 6
        records.info("[1,0]<stdout>:after the takeover")
        await records.written(5)
        records.write_now()  # as a cancelled trigger does: still nothing of the new owner's
        return old.lost, new.lost, new.lines

    old_lost, new_lost, new_lines = asyncio.run(with_client(double, body))
    events = [str(entry["event"]) for entry in written.entries]
    assert old_lost and not new_lost and new_lines == 5
    assert "[1,0]<stdout>:before the takeover" in events
    assert "[1,0]<stdout>:after the takeover" not in events
    assert "airflow-mpi: another triggerer shows this job's log from here on" in events


def test_a_stopped_trigger_writes_and_marks_what_it_read(double: KubeDouble, config_map: str) -> None:
    written = Written()

    async def body(api_client: Any) -> int:
        mark = ShownLines(api_client, "default", config_map, 3)
        await mark.claim(log)
        records = records_for(lambda: 9, written, hold=60, shown=mark)  # held: the timer never fires here
        records.info("[1,0]<stdout>:held when the triggerer stopped")
        await records.stop(5)
        return mark.lines

    lines = asyncio.run(with_client(double, body))
    assert lines == 9
    assert written.entries == [{"event": "[1,0]<stdout>:held when the triggerer stopped", "logger": build_mark(9)}]
    found = annotation(double)
    assert found is not None and (found.lines, found.try_number) == (9, 3)


def test_without_the_config_map_the_lines_are_shown_with_one_warning(double: KubeDouble) -> None:
    warnings: list[str] = []
    written = Written()

    class Log:
        def warning(self, text: str, *args: Any) -> None:
            warnings.append(text % args)

    async def body(api_client: Any) -> tuple[int, bool]:
        mark = ShownLines(api_client, "default", "no-such-config", 1)
        shown = await mark.claim(Log())
        records = records_for(lambda: 1, written, hold=0.01, shown=mark)
        records.info("[1,0]<stdout>:still shown")
        await records.written(5)
        return shown, mark.off

    shown, off = asyncio.run(with_client(double, body))
    assert shown == 0 and off
    assert [e["event"] for e in written.entries] == ["[1,0]<stdout>:still shown"]
    assert len(warnings) == 1 and "HTTP 404" in warnings[0] and "update on configmaps" in warnings[0]


def test_a_mark_edited_into_something_else_is_not_read() -> None:
    assert parse_shown_mark({SHOWN_ANNOTATION: "not json"}) is None
    assert parse_shown_mark({SHOWN_ANNOTATION: json.dumps({"lines": -1, "owner": "x", "try": 1})}) is None
    assert parse_shown_mark({SHOWN_ANNOTATION: json.dumps({"lines": 3})}) is None
    assert parse_shown_mark(None) is None
    mark = ShownMark(3, "h:1:ab", 2)
    assert parse_shown_mark({SHOWN_ANNOTATION: mark.render()}) == mark


def test_a_claim_that_meets_a_newer_mark_counts_from_it(double: KubeDouble, config_map: str) -> None:
    """The trigger that is taken over marks on between the new one's read and its write: the claim
    conflicts, reads again, and counts from the newer mark (never back to what it read first)."""

    async def body(api_client: Any) -> tuple[int, int]:
        old = ShownLines(api_client, "default", config_map, 1)
        await old.claim(log)
        await old.mark(10)
        new = ShownLines(api_client, "default", config_map, 1)
        real_replace = new._replace
        raced = []

        async def replace_after_the_old_one_marked() -> dict[str, Any]:
            if not raced:  # the old trigger writes first: our write conflicts
                raced.append(True)
                await old.mark(25)
            return await real_replace()

        new._replace = replace_after_the_old_one_marked  # type: ignore[method-assign]
        return await new.claim(log), new.lines

    shown, lines = asyncio.run(with_client(double, body))
    assert (shown, lines) == (25, 25)
    found = annotation(double)
    assert found is not None and found.lines == 25
