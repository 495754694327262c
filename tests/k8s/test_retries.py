"""Retries after the Airflow worker died: reattach to the job the earlier try left (the log goes
on where it stopped, the result is the same) or remove it and start clean; never two jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_mpi.operators.mpi import MPIJobOperator
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.k8s.conftest import Scripts, job_objects, unique

pytestmark = pytest.mark.usefixtures("connections")

LINES = 60
SPEC: dict[str, Any] = {
    "name": "retried",
    "image": "registry.example/train:1",
    "command": ["python", "/app/train.py"],
    "workers": {"replicas": 2},
    "startup_timeout": 30,
}

# The first try: the operator as a task would run it, in its own process, with a task_state_store
# kept in a file (Airflow keeps it in its database across tries).
CHILD = """
import json, sys
from types import SimpleNamespace
from airflow_mpi.operators.mpi import MPIJobOperator
sys.path.insert(0, sys.argv[4])
from test_retries import FileStore
operator = MPIJobOperator(task_id="train", job=json.loads(sys.argv[1]), mpi_conn_id="mpi_k8s")
ti = SimpleNamespace(dag_id="kdag", task_id="train", run_id=sys.argv[2], map_index=int(sys.argv[5]), try_number=1)
operator.execute({"ti": ti, "task_state_store": FileStore(sys.argv[3])})
"""


class FileStore:
    """task_state_store, persisted in a JSON file so two processes (two tries) share it."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def _data(self) -> dict[str, Any]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def get(self, key: str, default: Any = None) -> Any:
        return self._data().get(key, default)

    def set(self, key: str, value: Any) -> None:
        data = self._data()
        data[key] = value
        self._write(data)

    def delete(self, key: str) -> None:
        data = self._data()
        data.pop(key, None)
        self._write(data)

    def _write(self, data: dict[str, Any]) -> None:
        """Write whole or not at all: the test reads the file while the first try writes it."""
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(data))
        partial.replace(self.path)


def slow_lines() -> Any:
    for i in range(LINES):
        yield f"[1,0]<stdout>:step {i:03d}"
        time.sleep(0.05)
    yield '[1,0]<stdout>:AIRFLOW_MPI_RESULT {"steps": 60}'


def first_try_dies(double: KubeDouble, run_id: str, store: Path, until: Any, map_index: int = -1) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(SPEC), run_id, str(store), str(Path(__file__).parent), str(map_index)],
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120  # the child imports Airflow: seconds, or a minute on a loaded machine
    while not until() and time.monotonic() < deadline:
        assert child.poll() is None, "the first try ended by itself"
        time.sleep(0.02)
    child.kill()  # SIGKILL: an Airflow worker that dies takes no finally with it
    child.wait()


def second_try(
    run_id: str, store: Path, capfd: pytest.CaptureFixture[str], map_index: int = -1
) -> tuple[dict[str, Any], list[str]]:
    operator = MPIJobOperator(task_id="train", job=SPEC, mpi_conn_id="mpi_k8s")
    ti = SimpleNamespace(dag_id="kdag", task_id="train", run_id=run_id, map_index=map_index, try_number=2)
    capfd.readouterr()
    result = operator.execute({"ti": ti, "task_state_store": FileStore(str(store))})  # type: ignore[arg-type]
    shown = [
        line.split("<stdout>:", 1)[1].split()[1]
        for line in capfd.readouterr().out.splitlines()
        if "<stdout>:step" in line
    ]
    return result, shown


@pytest.mark.parametrize("map_index", [-1, 3], ids=["unmapped", "mapped"])
def test_crash_then_retry_reattaches_and_goes_on_where_the_log_stopped(
    double: KubeDouble, scripts: Scripts, tmp_path: Path, capfd: pytest.CaptureFixture[str], map_index: int
) -> None:
    scripts.on("-master-", PodScript(lines=slow_lines, exit_code=0))
    run_id, store = unique("crash"), tmp_path / "store.json"

    def progress() -> int:
        value = FileStore(str(store)).get("airflow_mpi")
        return int(value["lines"]) if value else 0

    first_try_dies(double, run_id, store, until=lambda: progress() >= 15, map_index=map_index)
    first_shown = progress()
    assert len(job_objects(double)) == 7  # the job lives on without its operator (its Lease too)
    labels = double.list_objects("services", "default")[0]["metadata"]["labels"]
    assert labels.get("airflow-mpi.io/map-index") == (str(map_index) if map_index >= 0 else None)
    result, shown = second_try(run_id, store, capfd, map_index)
    assert result["result"] == {"steps": 60}  # the same result the first try would have had
    assert result["job_name"].startswith("retried-") and double.request_count("POST", "/services") == 1
    # The log goes on exactly where the first try's stopped (by its last saved progress).
    assert shown == [f"{i:03d}" for i in range(first_shown, LINES)]
    assert job_objects(double) == []


def test_crash_before_the_master_then_retry_starts_clean(
    double: KubeDouble, scripts: Scripts, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The first try dies while it creates the pods (the master with the workers): none is there,
    so the retry removes what it left and starts a job of its own."""
    scripts.on("-worker-", PodScript(start_delay=0.3))
    scripts.on("-master-", PodScript(lines=slow_lines, exit_code=0))
    run_id, store = unique("early"), tmp_path / "store.json"
    double.fail_requests(method="POST", path=r"/namespaces/default/pods$", status=503, count=10_000)  # retried
    first_try_dies(double, run_id, store, until=lambda: double.request_count("POST", "/pods") >= 1)
    double.stop_failing()
    first = {o["metadata"]["name"] for o in double.list_objects("services", "default")}
    assert len(first) == 1
    result, shown = second_try(run_id, store, capfd)
    assert result["result"] == {"steps": 60}
    assert shown == [f"{i:03d}" for i in range(LINES)]
    assert result["job_name"] not in first  # a new job, the old one removed first
    assert double.request_count("POST", "/services") == 2
    assert job_objects(double) == []
