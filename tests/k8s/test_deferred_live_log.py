"""A deferred job's log under real Airflow processes (scheduler, dag-processor, two triggerers and
api-server; LocalExecutor; a fresh home and SQLite database), its pods scripted by the API double
that this test serves over HTTP: the master's lines are readable through the REST API's task log
endpoint while the task is deferred; the triggerer running the trigger is SIGKILLed mid-run, or
paused past Airflow's health check and let go on (Airflow then drops the trigger from it and
calls its ``on_kill``), and the other one, which shares the database but not the log folder
(another machine's, or a rescheduled pod's), takes the trigger over: the two triggerers' logs and
the resumed task's hold every line exactly once, in order, and the task succeeds with the job's
result. A deferred task marked failed through the API: the triggerer's ``on_kill`` deletes the job.
"""

from __future__ import annotations

import json
import re
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.airflow_processes import Airflow, airflow_processes, free_port, wait_for
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.k8s.conftest import Scripts, job_objects

DAG_ID = "mpi_live_log"
LINES = 250
EVERY = 0.1  # seconds between two lines of the master: 25 s of output, past a pause of ~8 s
HELD_BACK = 20  # the master's last lines, printed once the test has lost its triggerer
REPO = Path(__file__).resolve().parents[2]

DAG_FILE = f'''
from datetime import datetime
from airflow.sdk import DAG
from airflow_mpi.operators.mpi import MPIJobOperator

with DAG("{DAG_ID}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    MPIJobOperator(
        task_id="train",
        job={{"name": "live", "image": "registry.example/train:1", "command": ["python", "/app/t.py"],
             "workers": {{"replicas": 1}}, "startup_timeout": 60, "timeout": 300}},
        mpi_conn_id="mpi_k8s",
        deferrable=True,
        retries=0,
    )
'''


def master_lines(released: threading.Event | None = None) -> Iterator[str]:
    """The master's output; with ``released``, its last ``HELD_BACK`` lines wait for it (the
    test's triggerer is lost before the job ends however slow the machine is)."""
    for i in range(LINES):
        if i == LINES - HELD_BACK and released is not None:
            released.wait(300)
        time.sleep(EVERY)
        yield f"[1,0]<stdout>:line {i:03d}"
    yield "[1,0]<stdout>:AIRFLOW_MPI_RESULT " + json.dumps({"lines": LINES})


@pytest.fixture
def airflow(double: KubeDouble, tmp_path: Path) -> Iterator[Airflow]:
    with airflow_processes(tmp_path / "home", {"live_log_dag.py": textwrap.dedent(DAG_FILE)}) as processes:
        yield processes


def trigger_logs(folders: dict[str, Path]) -> dict[str, Path]:
    """The triggerers whose folder holds the task's trigger log (name -> file)."""
    found = {}
    for name, folder in folders.items():
        files = sorted(folder.rglob(f"dag_id={DAG_ID}/**/*.trigger.*.log"))
        if files:
            found[name] = files[-1]
    return found


LEFT_TO_IT = "no longer runs the trigger, and the task is deferred"


def said_by(airflow: Airflow, folders: dict[str, Path], triggerer: str) -> str:
    """What one triggerer said of the trigger: its trigger log, then its own (where the trigger's
    ``on_kill`` lines go once Airflow has dropped it)."""
    path = trigger_logs(folders).get(triggerer)
    return (read_text(path) if path else "") + airflow.tail(triggerer, 200_000)


def worker_log(folder: Path) -> str:
    """The task try's own log file (what the worker wrote: the resumed task's part)."""
    (path,) = [p for p in folder.rglob(f"dag_id={DAG_ID}/**/attempt=1.log")]
    return read_text(path)


def read_text(path: Path) -> str:
    """What a log file's records say (their ``event``s), one a line; not their other fields (the
    trigger's fired event carries the master's last lines too)."""
    said = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            said.append(str(json.loads(line).get("event", "")))
        except ValueError:
            said.append(line)
    return "\n".join(said)


def log_events(airflow: Airflow, run_id: str) -> list[dict[str, Any]]:
    """The task try's log through the REST API: its records (merged by Airflow from the
    worker's and every triggerer's files)."""
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train/logs/1?full_content=true"
    return list(airflow.get(path)["content"])


def shown_lines(events: list[dict[str, Any]]) -> list[str]:
    text = "\n".join(str(event.get("event", "")) for event in events)
    return re.findall(r"<stdout>:line (\d{3})", text)


def start_run(airflow: Airflow) -> tuple[str, str]:
    """A run of the DAG: its id and its train task's path in the API."""
    wait_for("the DAG parsed", lambda: airflow.get(f"/api/v2/dags/{DAG_ID}"), 120, airflow)
    airflow.patch(f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
    run_id = airflow.post(f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None})["dag_run_id"]
    return run_id, f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train"


@pytest.mark.usefixtures("connections")
@pytest.mark.parametrize("how", ["killed", "paused"])
def test_live_lines_through_the_api_and_exactly_once_across_a_lost_triggerer(
    airflow: Airflow, double: KubeDouble, scripts: Scripts, how: str
) -> None:
    released = threading.Event()
    scripts.on("-master-", PodScript(lines=lambda: master_lines(released), exit_code=0))
    try:
        lose_a_triggerer_mid_job(airflow, double, how, released)
    finally:
        released.set()


def lose_a_triggerer_mid_job(airflow: Airflow, double: KubeDouble, how: str, released: threading.Event) -> None:
    run_id, ti = start_run(airflow)

    # Live: lines of the master while the task is deferred (the job is still printing).
    early = wait_for(
        "lines in the task log while deferred",
        lambda: len(shown_lines(log_events(airflow, run_id))) >= 10 and airflow.get(ti)["state"] == "deferred",
        180,
        airflow,
    )
    assert early
    live = shown_lines(log_events(airflow, run_id))
    assert airflow.get(ti)["state"] == "deferred" and 10 <= len(live) < LINES
    assert live == [f"{i:03d}" for i in range(len(live))]  # in order, none twice

    # A second triggerer beside the first: the same database, a log folder (and log server) of its
    # own. The first dies mid-run; the second takes the trigger over, finds nothing of the first
    # one's log, and goes on after what the job's mark counts.
    folders = {"triggerer": airflow.home / "logs", "triggerer-b": airflow.home / "logs-b"}
    own = {"AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(folders["triggerer-b"]),
           "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port())}  # fmt: skip
    airflow.start("triggerer-b", "triggerer", env=own)
    time.sleep(3)  # started (its heartbeat in the database) before the first one dies
    (first,) = wait_for("the trigger's log file", lambda: trigger_logs(folders), 60, airflow)
    assert first == "triggerer"
    if how == "killed":
        airflow.kill(first)
    else:  # late past the health check: the other takes the trigger, then this one goes on
        paused = airflow.pause(first)
        try:
            wait_for("the other triggerer running the trigger", lambda: len(trigger_logs(folders)) == 2, 60, airflow)
            time.sleep(1)
        finally:
            airflow.resume(paused)
        # Airflow drops the trigger from the resumed one and calls its on_kill: with the job still
        # printing, so the task is deferred on the other triggerer and the job is left to it. (The
        # master holds its last lines until then: a slow machine may take its time to drop it.)
        wait_for(
            "the resumed triggerer leaving the job to the other one",
            lambda: LEFT_TO_IT in said_by(airflow, folders, first),
            180,
            airflow,
        )
    lost_at = len(shown_lines(log_events(airflow, run_id)))
    assert lost_at <= LINES - HELD_BACK, "the master printed lines it holds back"
    released.set()

    state = wait_for(
        "the task to end",
        lambda: (s := airflow.get(ti)["state"]) in ("success", "failed", "upstream_failed") and s,
        240,
        airflow,
    )
    taken_over = trigger_logs(folders)
    second = next(iter(set(taken_over) - {first}), None)
    assert second is not None, f"no other triggerer took the trigger over: {taken_over}"
    worker = worker_log(folders["triggerer"])
    # Each line once, in order: the first triggerer's, then the second's, then the resumed task's.
    texts = [read_text(taken_over[first]), read_text(taken_over[second]), worker]
    lines = [line for text in texts for line in re.findall(r"<stdout>:line (\d{3})", text)]
    assert state == "success", worker[-4000:]
    assert lines == [f"{i:03d}" for i in range(LINES)], [(found[:2], found[-2:], len(found)) for found in (
        re.findall(r"<stdout>:line (\d{3})", text) for text in texts)]  # fmt: skip
    assert all(re.findall(r"<stdout>:line \d{3}", text) for text in texts[:2]), "each triggerer showed lines"
    assert sum(text.count("AIRFLOW_MPI_RESULT") for text in texts) == 1
    # The lines came from the triggers (their records name the master's log as their source),
    # and the second went on after what the job's mark counted.
    records = [json.loads(line) for path in taken_over.values() for line in path.read_text().splitlines()]
    sources = {record.get("logger") for record in records if "<stdout>:line" in str(record.get("event"))}
    assert sources and all(str(source).startswith("airflow_mpi.master:") for source in sources), sources
    assert "going on after them" in texts[1]
    result = airflow.get(f"{ti}/xcomEntries/return_value")["value"]
    result = json.loads(result) if isinstance(result, str) else result
    assert result["result"] == {"lines": LINES}
    if how == "paused":  # Airflow dropped the trigger from the first and called its on_kill
        said = said_by(airflow, folders, first)
        assert LEFT_TO_IT in said and "task killed" not in said, said[-3000:]
    wait_for("the job's objects deleted", lambda: job_objects(double) == [], 30, airflow)


@pytest.mark.usefixtures("connections")
def test_a_deferred_task_marked_failed_has_its_job_deleted_by_the_trigger(
    airflow: Airflow, double: KubeDouble, scripts: Scripts
) -> None:
    scripts.on("-master-", PodScript(lines=master_lines, exit_code=0))
    run_id, ti = start_run(airflow)
    wait_for("the task deferred, its job running",
             lambda: airflow.get(ti)["state"] == "deferred" and shown_lines(log_events(airflow, run_id)), 180, airflow)  # fmt: skip
    assert job_objects(double), "the job's objects, before"
    airflow.patch(ti, {"new_state": "failed"})
    # (within the time the trigger may wait for the task's state, which a loaded machine delays)
    wait_for("the job's objects deleted by the trigger's on_kill", lambda: job_objects(double) == [], 90, airflow)
    assert airflow.get(ti)["state"] == "failed"
    (log,) = trigger_logs({"triggerer": airflow.home / "logs"}).values()
    said = read_text(log) + airflow.tail("triggerer", 200_000)  # (the triggerer's own, once the trigger ended)
    assert "task killed (its state: failed)" in said, said[-3000:]
    assert len(shown_lines(log_events(airflow, run_id))) < LINES, "the job ran to its end: it was not deleted"
