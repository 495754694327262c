"""A deferred job's log under real Airflow processes (scheduler, dag-processor, triggerer and
api-server; LocalExecutor; a fresh home and SQLite database), its pods scripted by the API double
that this test serves over HTTP: the master's lines are readable through the REST API's task log
endpoint while the task is deferred; the triggerer is SIGKILLed mid-run and started again; the
final log holds every line exactly once, in order, and the task succeeds with the job's result."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def master_lines() -> Iterator[str]:
    for i in range(LINES):
        time.sleep(EVERY)
        yield f"[1,0]<stdout>:line {i:03d}"
    yield "[1,0]<stdout>:AIRFLOW_MPI_RESULT " + json.dumps({"lines": LINES})


class Airflow:
    """Airflow's processes on a fresh home; ends them (and only them) by PID."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home, self.env = home, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.api = f"http://127.0.0.1:{env['AIRFLOW__API__PORT']}"

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        out = open(self.home / f"{name}.out", "ab")  # noqa: SIM115 (the process keeps it)
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow", *args], env=self.env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.procs[name] = proc
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL a process and its children (a triggerer runs its triggers in a child)."""
        proc = self.procs.pop(name)
        for pid in [*descendants(proc.pid), proc.pid]:
            with_missing(lambda pid=pid: os.kill(pid, signal.SIGKILL))
        proc.wait(10)

    def stop(self) -> None:
        for name, proc in list(self.procs.items()):
            pids = [*descendants(proc.pid), proc.pid]
            with_missing(lambda proc=proc: proc.terminate())
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
            for pid in pids:
                with_missing(lambda pid=pid: os.kill(pid, signal.SIGKILL))
            with_missing(lambda proc=proc: proc.wait(5))
            del self.procs[name]

    def get(self, path: str) -> Any:
        request = urllib.request.Request(self.api + path, headers={"Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def post(self, path: str, body: dict[str, Any]) -> Any:
        data = json.dumps(body).encode()
        request = urllib.request.Request(self.api + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        data = json.dumps(body).encode()
        request = urllib.request.Request(
            self.api + path, data=data, method="PATCH", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def tail(self, name: str, size: int = 3000) -> str:
        path = self.home / f"{name}.out"
        return path.read_bytes()[-size:].decode("utf-8", "replace") if path.exists() else ""


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        for child in children:
            found += [child, *descendants(child)]
    return found


def with_missing(call: Any) -> None:
    try:
        call()
    except (ProcessLookupError, subprocess.TimeoutExpired, OSError):
        pass


@pytest.fixture
def airflow(double: KubeDouble, tmp_path: Path) -> Iterator[Airflow]:
    home = tmp_path / "home"
    (home / "dags").mkdir(parents=True)
    (home / "dags" / "live_log_dag.py").write_text(textwrap.dedent(DAG_FILE))
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW__")}
    env.update(
        AIRFLOW_HOME=str(home),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__EXECUTOR="LocalExecutor",
        AIRFLOW__CORE__PARALLELISM="4",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
        AIRFLOW__API__PORT=str(free_port()),
        AIRFLOW__API__SECRET_KEY="live-log-test",
        AIRFLOW__API_AUTH__JWT_SECRET="live-log-test-jwt-secret-0123456789",
        AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
        AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
        AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
        AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL="5",
        AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="1",
        AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC="1",
        AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD="4",
    )
    env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = f"http://127.0.0.1:{env['AIRFLOW__API__PORT']}/execution/"
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True)
    processes = Airflow(home, env)
    try:
        processes.start("api-server", "api-server", "--port", env["AIRFLOW__API__PORT"])
        processes.start("dag-processor", "dag-processor")
        processes.start("scheduler", "scheduler")
        processes.start("triggerer", "triggerer")
        yield processes
    finally:
        processes.stop()


def wait_for(what: str, check: Any, timeout: float, airflow: Airflow) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
        except Exception:
            got = None
        if got:
            return got
        time.sleep(0.5)
    logs = "\n".join(f"--- {name}\n{airflow.tail(name)}" for name in ("scheduler", "triggerer", "api-server"))
    raise AssertionError(f"{what}: not within {timeout}s\n{logs}")


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
