"""A retry after the task process was SIGKILLed, on the real control plane, for each backend
(plain pods, MPIJob under the real mpi-operator, Volcano Job under real Volcano, TrainJob under
the real Trainer and JobSet): the second try
reattaches to the job the first left and its log goes on exactly where the first stopped."""

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
from tests.cluster.cluster import REPO, Cluster
from tests.cluster.conftest import install_connections, job_objects
from tests.k8s.test_retries import FileStore

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

LINES = 80
PROGRAM = (
    "import os, time, json\n"
    "if os.environ['OMPI_COMM_WORLD_RANK'] == '0':\n"
    f"    for i in range({LINES}): print(f'step {{i:03d}}', flush=True); time.sleep(0.1)\n"
    "    print('AIRFLOW_MPI_RESULT ' + json.dumps({'steps': %d}))\n" % LINES
)
SPEC: dict[str, Any] = {
    "name": "retried",
    "image": "registry.example/airflow-mpi-train:0.1",
    "command": [sys.executable, "-c", PROGRAM],
    "workers": {"replicas": 1},
    "startup_timeout": 90,
    "timeout": 120,
}
CHILD = """
import json, sys
from types import SimpleNamespace
sys.path.insert(0, sys.argv[4])
from airflow_mpi.operators.mpi import MPIJobOperator
from tests.k8s.test_retries import FileStore
operator = MPIJobOperator(task_id="train", job=json.loads(sys.argv[1]), mpi_conn_id=sys.argv[5])
ti = SimpleNamespace(dag_id="kdag", task_id="train", run_id=sys.argv[2], map_index=-1, try_number=1)
operator.execute({"ti": ti, "task_state_store": FileStore(sys.argv[3])})
"""


def steps(lines: list[str]) -> list[str]:
    return [line.split("<stdout>:step ", 1)[1][:3] for line in lines if "<stdout>:step " in line]


# The backend and the controller its top object needs (None: core objects only).
BACKENDS = {"kubernetes": None, "mpijob": "mpi-operator", "volcano": "volcano", "trainjob": "trainer"}
TOP_OBJECTS = {"mpijob": "/apis/kubeflow.org/v2beta1/namespaces/{ns}/mpijobs",
               "volcano": "/apis/batch.volcano.sh/v1alpha1/namespaces/{ns}/jobs",
               "trainjob": "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs"}  # fmt: skip


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_retry_after_sigkill_reattaches_and_goes_on_where_the_log_stopped(
    cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    backend: str,
) -> None:
    if BACKENDS[backend]:
        cluster.controller(BACKENDS[backend])
    conn_id = f"mpi_{backend}"
    install_connections(monkeypatch, cluster.kubeconfig, namespace, conn_id, backend=backend)
    api = cluster.api()

    def top_objects() -> list[str]:
        path = TOP_OBJECTS.get(backend)
        return [o["metadata"]["name"] for o in api.get(path.format(ns=namespace))["items"]] if path else []

    run_id, store = f"crash-{time.monotonic_ns()}", tmp_path / "store.json"

    def progress() -> int:
        value = FileStore(str(store)).get("airflow_mpi")
        return int(value["lines"]) if value else 0

    first_out = tmp_path / "first-try.log"
    with first_out.open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(SPEC), run_id, str(store), str(REPO), conn_id],
            env=os.environ.copy(), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 180
    while progress() < 20 and time.monotonic() < deadline:
        assert child.poll() is None, "the first try ended by itself"
        time.sleep(0.05)
    child.kill()  # SIGKILL: a worker that dies takes no finally with it
    child.wait()
    first_steps = steps(first_out.read_text(errors="replace").splitlines())
    assert len(first_steps) >= 10, first_steps
    assert job_objects(api, namespace), "the job lives on without its operator"
    left_by_first = top_objects()
    assert len(left_by_first) == (1 if backend in TOP_OBJECTS else 0), left_by_first

    operator = MPIJobOperator(task_id="train", job=SPEC, mpi_conn_id=conn_id)
    ti = SimpleNamespace(dag_id="kdag", task_id="train", run_id=run_id, map_index=-1, try_number=2)
    capfd.readouterr()
    result = operator.execute({"ti": ti, "task_state_store": FileStore(str(store))})  # type: ignore[arg-type]
    shown = steps(capfd.readouterr().out.splitlines())
    assert result["result"] == {"steps": LINES}
    # It went on from the first try's last saved progress: not from the start, no step skipped,
    # and at most the lines the first try showed after it last saved again.
    assert shown == [f"{i:03d}" for i in range(int(shown[0]), LINES)], shown
    assert 0 < int(shown[0]) <= int(first_steps[-1]) + 1, (first_steps, shown[:3])
    assert job_objects(api, namespace) == [] and top_objects() == []
