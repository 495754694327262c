"""The live log's shown mark on the job's Lease (``triggers.logshown``), over real HTTP against the
API double with the async client the triggerer uses: a trigger reads the mark and takes it over;
each record goes out after the mark counts it, at most one write a second; a second trigger that
takes the mark over and keeps it alive makes the first one stop showing lines (none shown twice);
a mark that is tampered with (a count no trigger writes, a holder no trigger is, one that never
writes again) is said once and hides no line; without the Lease or the verb the lines are still
shown, with one warning."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import pytest

from airflow_mpi.kinds.manifests import LOG_LEASE
from airflow_mpi.observe.shown import LINES_ANNOTATION, TRY_ANNOTATION, ShownMark, lines_to_skip, parse_lease_mark
from airflow_mpi.triggers.logfollow import build_mark, count_log_lines
from airflow_mpi.triggers.logshown import ShownLines
from airflow_mpi.triggers.logwriter import MasterRecords
from tests.airflow_helpers import task_states
from tests.doubles.kube_double import LEASES, KubeDouble, PodScript
from tests.k8s.conftest import Scripts, job_objects

LEASE = "job-1-log"
OTHER = "elsewhere:1:0badc0de"  # a trigger's name, of no trigger here
log = logging.getLogger("test-shown")


@pytest.fixture
def lease(double: KubeDouble) -> str:
    group, version, _, kind = LOG_LEASE
    double.create(LEASES, "default", {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": {"name": LEASE}})
    return LEASE


class Written:
    """Stands for the records' structlog logger: what reached the task log, with its source."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def info(self, text: str, logger: str = "") -> None:
        self.entries.append({"event": text, "logger": logger})

    warning = info


class Warnings:
    """Stands for the trigger's log: the reports."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def warning(self, text: str, *args: Any) -> None:
        self.texts.append(text % args)

    info = warning


def records_for(lines_read: Any, written: Written, **options: Any) -> MasterRecords:
    records = MasterRecords(lines_read, **options)
    records.logger = written
    return records


def stored(double: KubeDouble) -> dict[str, Any]:
    found = double.get(LEASES, "default", LEASE)
    assert found is not None
    return found


def tamper(double: KubeDouble, count: str, holder: str = OTHER, try_text: str = "1") -> None:
    def change(obj: dict[str, Any]) -> None:
        obj["metadata"].setdefault("annotations", {}).update({LINES_ANNOTATION: count, TRY_ANNOTATION: try_text})
        obj.setdefault("spec", {})["holderIdentity"] = holder

    double.update_object(LEASES, "default", LEASE, change)


async def with_client(double: KubeDouble, body: Any) -> Any:
    from kubernetes_asyncio import client

    configuration = client.Configuration()
    configuration.host = double.url
    async with client.ApiClient(configuration) as api_client:
        return await body(api_client)


def shown_lines(written: Written) -> list[str]:
    return [line for entry in written.entries for line in str(entry["event"]).split("\n") if "<stdout>" in line]


def test_the_mark_is_claimed_then_counts_each_record_before_it_is_written(double: KubeDouble, lease: str) -> None:
    order: list[str] = []
    written = Written()

    async def body(api_client: Any) -> tuple[int, int]:
        mark = ShownLines(api_client, "default", lease, 1, write_interval=0.01)
        before = await mark.claim(log)
        lines = [0]
        records = records_for(lambda: lines[0], written, hold=0.01, shown=mark)
        real_mark = mark.mark

        async def spied(count: int, **options: Any) -> bool:
            order.append(f"mark {count}")
            return await real_mark(count, **options)

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
    found = parse_lease_mark(stored(double))
    assert found.mark is not None and found.mark.lines == 3 and found.mark.try_number == 1
    assert stored(double)["spec"]["holderIdentity"] == found.holder
    assert double.request_count("PUT", "/configmaps") == 0  # the pods' ConfigMap is never written


def test_the_mark_is_written_at_most_once_a_second_however_many_records(double: KubeDouble, lease: str) -> None:
    """A job printing 1,000 lines a second for 10,000 lines: records every 0.25 s, one write a
    second counting them all (with the ConfigMap mark, a write per record: 40 for this job, and
    about 2,000 for 10,000 lines at a training log's 20 lines a second)."""
    written = Written()

    async def body(api_client: Any) -> tuple[int, float]:
        mark = ShownLines(api_client, "default", lease, 1)
        await mark.claim(log)
        lines = [0]
        records = records_for(lambda: lines[0], written, shown=mark)
        started = time.monotonic()
        while lines[0] < 10_000:
            for _ in range(20):
                lines[0] += 1
                records.info(f"[1,0]<stdout>:line {lines[0]}")
            await asyncio.sleep(0.02)
        await records.written(30)
        took = time.monotonic() - started
        return mark.writes, took

    writes, took = asyncio.run(with_client(double, body))
    puts = double.request_count("PUT", "/leases/")
    assert puts == writes
    assert shown_lines(written) == [f"[1,0]<stdout>:line {i}" for i in range(1, 10_001)]
    assert writes <= took / 1.0 + 2, (writes, took)  # the claim, then one a second at most
    assert parse_lease_mark(stored(double)).mark == ShownMark(10_000, parse_lease_mark(stored(double)).holder, 1)
    print(f"10,000 lines in {took:.1f} s: {writes} mark writes")


def test_a_trigger_started_again_goes_on_after_the_marked_lines(double: KubeDouble, lease: str) -> None:
    async def body(api_client: Any) -> tuple[int, str, str]:
        first = ShownLines(api_client, "default", lease, 1)
        await first.claim(log)
        await first.mark(42)
        second = ShownLines(api_client, "default", lease, 1)
        claimed = await second.claim(log)
        return claimed, first.owner, second.owner

    shown, first, second = asyncio.run(with_client(double, body))
    assert shown == 42 and first != second
    found = parse_lease_mark(stored(double))
    assert found.mark is not None and found.mark.owner == second and found.mark.lines == 42
    assert stored(double)["spec"]["leaseTransitions"] == 1
    assert lines_to_skip(found.mark, 10) == 42 and lines_to_skip(found.mark, 50) == 50 and lines_to_skip(None, 7) == 7


def test_a_trigger_whose_mark_a_live_trigger_took_over_shows_nothing_more(double: KubeDouble, lease: str) -> None:
    """Two triggerers run the same trigger for a while (Airflow's handover): the one that claimed
    last shows the lines, and counts them; the other drops what the new holder counts, never
    showing a line twice."""
    written = Written()

    async def body(api_client: Any) -> tuple[bool, bool, int]:
        old = ShownLines(api_client, "default", lease, 1, write_interval=0.01, lease_seconds=5)
        await old.claim(log)
        lines = [0]
        records = records_for(lambda: lines[0], written, hold=0.01, shown=old)
        lines[0] = 5
        records.info("[1,0]<stdout>:before the takeover")
        await records.written(5)
        new = ShownLines(api_client, "default", lease, 1)
        await new.claim(log)
        lines[0] = 6
        records.info("[1,0]<stdout>:after the takeover")
        await asyncio.sleep(0.3)
        await new.mark(6)  # the new holder shows it
        await records.written(10)
        records.write_now()  # as a cancelled trigger does: still nothing of the new holder's
        return old.lost, new.lost, new.lines

    old_lost, new_lost, new_lines = asyncio.run(with_client(double, body))
    events = [str(entry["event"]) for entry in written.entries]
    assert old_lost and not new_lost and new_lines == 6
    assert "[1,0]<stdout>:before the takeover" in events
    assert "[1,0]<stdout>:after the takeover" not in events
    assert "airflow-mpi: another triggerer shows this job's log from here on" in events


def test_a_stopped_trigger_writes_and_marks_what_it_read(double: KubeDouble, lease: str) -> None:
    written = Written()

    async def body(api_client: Any) -> int:
        mark = ShownLines(api_client, "default", lease, 3)
        await mark.claim(log)
        records = records_for(lambda: 9, written, hold=60, shown=mark)  # held: the timer never fires here
        records.info("[1,0]<stdout>:held when the triggerer stopped")
        await records.stop(5)
        return mark.lines

    lines = asyncio.run(with_client(double, body))
    assert lines == 9
    assert written.entries == [{"event": "[1,0]<stdout>:held when the triggerer stopped", "logger": build_mark(9)}]
    found = parse_lease_mark(stored(double)).mark
    assert found is not None and (found.lines, found.try_number) == (9, 3)


def test_a_trigger_stopped_after_a_takeover_leaves_the_new_holder_its_lines(double: KubeDouble, lease: str) -> None:
    """Airflow cancels the old trigger once the new one runs: what the old one read and had not
    written is the new holder's to show (it reads the log from its claimed count)."""
    written = Written()

    async def body(api_client: Any) -> tuple[bool, int]:
        old = ShownLines(api_client, "default", lease, 1, write_interval=0.01)
        await old.claim(log)
        lines = [3]
        records = records_for(lambda: lines[0], written, hold=0.01, shown=old)
        records.info("[1,0]<stdout>:one\n[1,0]<stdout>:two\n[1,0]<stdout>:three")
        await records.written(5)
        new = ShownLines(api_client, "default", lease, 1)
        claimed = await new.claim(log)
        lines[0] = 4
        records.info("[1,0]<stdout>:four")
        await records.stop(5)
        return old.lost, claimed

    lost, claimed = asyncio.run(with_client(double, body))
    assert lost and claimed == 3
    assert shown_lines(written) == ["[1,0]<stdout>:one", "[1,0]<stdout>:two", "[1,0]<stdout>:three"]


def test_without_the_lease_the_lines_are_shown_with_one_warning(double: KubeDouble) -> None:
    warnings = Warnings()
    written = Written()

    async def body(api_client: Any) -> tuple[int, bool]:
        mark = ShownLines(api_client, "default", "no-such-lease", 1)
        shown = await mark.claim(warnings)
        records = records_for(lambda: 1, written, hold=0.01, shown=mark)
        records.info("[1,0]<stdout>:still shown")
        await records.written(5)
        return shown, mark.off

    shown, off = asyncio.run(with_client(double, body))
    assert shown == 0 and off
    assert [e["event"] for e in written.entries] == ["[1,0]<stdout>:still shown"]
    assert len(warnings.texts) == 1 and "HTTP 404" in warnings.texts[0] and "update on leases" in warnings.texts[0]


def test_without_update_on_leases_the_lines_are_shown_with_one_warning(double: KubeDouble, lease: str) -> None:
    double.deny("update", LEASES)
    warnings = Warnings()
    written = Written()

    async def body(api_client: Any) -> bool:
        mark = ShownLines(api_client, "default", lease, 1, write_interval=0.01)
        await mark.claim(warnings)
        records = records_for(lambda: 2, written, hold=0.01, shown=mark)
        records.info("[1,0]<stdout>:one\n[1,0]<stdout>:two")
        await records.written(5)
        return mark.off

    assert asyncio.run(with_client(double, body))
    assert shown_lines(written) == ["[1,0]<stdout>:one", "[1,0]<stdout>:two"]
    assert len(warnings.texts) == 1 and "HTTP 403" in warnings.texts[0]


@pytest.mark.parametrize(
    ("count", "holder", "try_text", "said"),
    [
        ("Infinity", OTHER, "1", "line count 'Infinity' is not a whole number"),
        ("NaN", OTHER, "1", "line count 'NaN' is not a whole number"),
        ("-1", OTHER, "1", "line count '-1' is not a whole number"),
        ("1e9", OTHER, "1", "line count '1e9' is not a whole number"),
        ("9" * 40, OTHER, "1", "is not a whole number"),
        ('{"lines": 3}', OTHER, "1", "is not a whole number"),
        ("3", "mallory", "1", "holder 'mallory' is not an airflow-mpi trigger"),
        ("3", "", "1", "holder '' is not an airflow-mpi trigger"),
        ("3", OTHER, "one", "try 'one' is not a try number"),
    ],
)
def test_a_mark_no_trigger_writes_is_said_once_and_hides_no_line(
    double: KubeDouble, lease: str, count: str, holder: str, try_text: str, said: str
) -> None:
    tamper(double, count, holder, try_text)
    warnings = Warnings()
    written = Written()

    async def body(api_client: Any) -> int:
        mark = ShownLines(api_client, "default", lease, 1, write_interval=0.01)
        claimed = await mark.claim(warnings)
        lines = [0]
        records = records_for(lambda: lines[0], written, hold=0.01, shown=mark)
        for i in range(4):
            lines[0] += 1
            records.info(f"[1,0]<stdout>:line {i}")
            await asyncio.sleep(0.03)
        await records.written(5)
        return claimed

    assert asyncio.run(with_client(double, body)) == 0
    assert shown_lines(written) == [f"[1,0]<stdout>:line {i}" for i in range(4)]
    assert len(warnings.texts) == 1 and said in warnings.texts[0], warnings.texts
    found = parse_lease_mark(stored(double)).mark
    assert found is not None and found.lines == 4  # written back as a trigger writes it


def test_a_foreign_holder_written_mid_run_that_counts_no_line_hides_none(double: KubeDouble, lease: str) -> None:
    """Someone with update on Leases names another holder (a trigger's name, or not): this trigger
    leaves the lines to it only while it counts them; it does not count a line read a Lease's
    duration ago, so this one says so once, takes the mark back and shows on."""
    warnings = Warnings()
    written = Written()

    async def body(api_client: Any) -> bool:
        mark = ShownLines(api_client, "default", lease, 1, write_interval=0.01, lease_seconds=1.0)
        await mark.claim(warnings)
        lines = [0]
        records = records_for(lambda: lines[0], written, hold=0.01, shown=mark)
        for i in range(6):
            if i == 2:
                await records.written(5)
                tamper(double, "2", OTHER)
            if i == 3:
                await asyncio.sleep(0.3)
                tamper(double, "2", OTHER)  # written again, still not counting what the log has
            if i == 4:
                await records.written(5)
                tamper(double, "4", "not a trigger")
            lines[0] += 1
            records.info(f"[1,0]<stdout>:line {i}")
            await asyncio.sleep(0.03)
        await records.written(10)
        return mark.lost

    assert asyncio.run(with_client(double, body)) is False
    assert shown_lines(written) == [f"[1,0]<stdout>:line {i}" for i in range(6)]
    assert len(warnings.texts) == 2, warnings.texts
    assert "which has not counted lines this trigger read 1 s ago: no live trigger of this job" in warnings.texts[0]
    assert "'not a trigger', which is not an airflow-mpi trigger" in warnings.texts[1]


def test_a_claim_that_meets_a_newer_mark_counts_from_it(double: KubeDouble, lease: str) -> None:
    """The trigger that is taken over marks on between the new one's read and its write: the claim
    conflicts, reads again, and counts from the newer mark (never back to what it read first)."""

    async def body(api_client: Any) -> tuple[int, int]:
        old = ShownLines(api_client, "default", lease, 1)
        await old.claim(log)
        await old.mark(10)
        new = ShownLines(api_client, "default", lease, 1)
        real_replace = new._replace
        raced = []

        async def replace_after_the_old_one_marked(body: dict[str, Any]) -> dict[str, Any]:
            if not raced:  # the old trigger writes first: our write conflicts
                raced.append(True)
                await old.mark(25)
            return await real_replace(body)

        new._replace = replace_after_the_old_one_marked  # type: ignore[method-assign]
        claimed = await new.claim(log)
        return claimed, new.lines

    shown, lines = asyncio.run(with_client(double, body))
    assert (shown, lines) == (25, 25)
    found = parse_lease_mark(stored(double)).mark
    assert found is not None and found.lines == 25


def test_a_log_is_counted_no_further_than_asked(double: KubeDouble, scripts: Scripts) -> None:
    scripts.on("counted", PodScript(lines=lambda: iter([f"[1,0]<stdout>:{i}" for i in range(50)]), exit_code=0))
    pod = {"metadata": {"name": "counted"}, "spec": {"containers": [{"name": "mpi", "image": "x"}]}}
    double.create("pods", "default", pod)
    deadline = time.monotonic() + 10
    while (double.get("pods", "default", "counted") or {}).get("status", {}).get("phase") != "Succeeded":
        assert time.monotonic() < deadline
        time.sleep(0.05)

    async def body(api_client: Any) -> tuple[int, int, int]:
        return (
            await count_log_lines(api_client, "default", "counted", 10**9, 10),
            await count_log_lines(api_client, "default", "counted", 20, 10),
            await count_log_lines(api_client, "default", "no-such-pod", 5, 10),
        )

    whole, some, none = asyncio.run(with_client(double, body))
    assert whole == 50 and 20 <= some <= 50 and none == 0


@pytest.mark.parametrize(
    ("count", "said"),
    [
        ("1000000", "it counts 1000000 line(s), but the master's log holds"),
        ("Infinity", "line count 'Infinity' is not a whole number"),
    ],
)
@pytest.mark.usefixtures("connections")
def test_a_deferred_job_whose_mark_was_preset_shows_every_line_and_says_so_once(
    dagbag: Any, double: KubeDouble, scripts: Scripts, capfd: pytest.CaptureFixture[str], count: str, said: str
) -> None:
    """The Lease is tampered with as soon as the operator creates it: a count beyond what the log
    holds (or no count at all) is not believed, and the task log still shows every line once."""
    lines = [f"[1,0]<stdout>:line {i:03d}" for i in range(20)] + ['[1,0]<stdout>:AIRFLOW_MPI_RESULT {"ok": 1}']

    def paced() -> Any:
        for line in lines:
            time.sleep(0.02)
            yield line

    def preset(event: str, plural: str, obj: dict[str, Any]) -> None:
        if event == "ADDED" and plural == LEASES:

            def change(lease: dict[str, Any]) -> None:
                lease["metadata"].setdefault("annotations", {}).update({LINES_ANNOTATION: count, TRY_ANNOTATION: "1"})
                lease.setdefault("spec", {})["holderIdentity"] = OTHER

            double.update_object(LEASES, obj["metadata"]["namespace"], obj["metadata"]["name"], change)

    double.listeners.append(preset)
    scripts.on("-master-", PodScript(lines=paced, exit_code=0))
    dag_run = dagbag.get_dag("mpi_test_k8s_deferred").test()
    out = capfd.readouterr().out
    assert task_states(dag_run) == {"train": "success"}, out[-3000:]
    assert re.findall(r"<stdout>:line (\d{3})", out) == [f"{i:03d}" for i in range(20)], out[-3000:]
    assert out.count(said) == 1, out[-3000:]
    assert job_objects(double) == []
