"""A deferred job's log under real Airflow processes (scheduler, dag-processor, triggerer and
api-server; LocalExecutor; a fresh home and SQLite database), its pods scripted by the API double
that this test serves over HTTP: the master's lines are readable through the REST API's task log
endpoint while the task is deferred; the triggerer is SIGKILLed mid-run and started again; the
final log holds every line exactly once, in order, and the task succeeds with the job's result."""

from __future__ import annotations

import json
import re
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.airflow_processes import Airflow, airflow_processes, wait_for
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.k8s.conftest import Scripts, job_objects

DAG_ID = "mpi_live_log"
LINES = 120
EVERY = 0.1  # seconds between two lines of the master: 12 s of output
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


def master_lines() -> Iterator[str]:
    for i in range(LINES):
        time.sleep(EVERY)
        yield f"[1,0]<stdout>:line {i:03d}"
    yield "[1,0]<stdout>:AIRFLOW_MPI_RESULT " + json.dumps({"lines": LINES})


@pytest.fixture
def airflow(double: KubeDouble, tmp_path: Path) -> Iterator[Airflow]:
    with airflow_processes(tmp_path / "home", {"live_log_dag.py": textwrap.dedent(DAG_FILE)}) as processes:
        yield processes


def log_events(airflow: Airflow, run_id: str) -> list[dict[str, Any]]:
    """The task try's log through the REST API: its records (merged by Airflow from the
    worker's and every triggerer's files)."""
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train/logs/1?full_content=true"
    return list(airflow.get(path)["content"])


def shown_lines(events: list[dict[str, Any]]) -> list[str]:
    text = "\n".join(str(event.get("event", "")) for event in events)
    return re.findall(r"<stdout>:line (\d{3})", text)


@pytest.mark.usefixtures("connections")
def test_live_lines_through_the_api_and_exactly_once_across_a_killed_triggerer(
    airflow: Airflow, double: KubeDouble, scripts: Scripts
) -> None:
    scripts.on("-master-", PodScript(lines=master_lines, exit_code=0))
    wait_for("the DAG parsed", lambda: airflow.get(f"/api/v2/dags/{DAG_ID}"), 120, airflow)
    airflow.patch(f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
    run_id = airflow.post(f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None})["dag_run_id"]
    ti = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train"

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

    # The triggerer dies mid-run; another one takes the trigger over.
    airflow.kill("triggerer")
    killed_at = len(shown_lines(log_events(airflow, run_id)))
    assert killed_at < LINES - 20, "the job ended before the triggerer was killed: make it print longer"
    time.sleep(2)
    airflow.start("triggerer-2", "triggerer")

    state = wait_for(
        "the task to end",
        lambda: (s := airflow.get(ti)["state"]) in ("success", "failed", "upstream_failed") and s,
        240,
        airflow,
    )
    events = log_events(airflow, run_id)
    text = "\n".join(str(event.get("event", "")) for event in events)
    assert state == "success", text[-4000:]
    assert shown_lines(events) == [f"{i:03d}" for i in range(LINES)], text[-4000:]  # each once, in order
    assert text.count("AIRFLOW_MPI_RESULT") == 1
    # The lines came from the triggers (their records name the master's log as their source),
    # and the second triggerer went on after what the first had written.
    sources = {str(event.get("logger", "")) for event in events if "<stdout>:line" in str(event.get("event", ""))}
    assert sources and all(source.startswith("airflow_mpi.master:") for source in sources), sources
    assert "going on after them" in text
    result = airflow.get(f"{ti}/xcomEntries/return_value")["value"]
    result = json.loads(result) if isinstance(result, str) else result
    assert result["result"] == {"lines": LINES}
    wait_for("the job's objects deleted", lambda: job_objects(double) == [], 30, airflow)
