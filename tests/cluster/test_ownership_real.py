"""Two Airflow deployments (staging and production) with the same DAG, task and run id run their
jobs in one namespace of the real control plane at the same time, and both finish: each job's
name and owner labels hold its deployment, so neither creates over, deletes or adopts the other."""

from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_mpi.operators.mpi import MPIJobOperator
from tests.cluster.cluster import Cluster
from tests.cluster.conftest import install_connections, job_objects

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def spec(steps: int) -> dict[str, Any]:
    program = (
        "import os, time, json\n"
        "if os.environ['OMPI_COMM_WORLD_RANK'] == '0':\n"
        f"    for i in range({steps}): print(f'step {{i:03d}}', flush=True); time.sleep(0.1)\n"
        f"    print('AIRFLOW_MPI_RESULT ' + json.dumps({{'steps': {steps}}}))\n"
    )
    return {
        "name": "owned",
        "image": "registry.example/airflow-mpi-train:0.1",
        "command": [sys.executable, "-c", program],
        "workers": {"replicas": 1},
        "startup_timeout": 90,
        "timeout": 120,
    }


def test_two_deployments_with_the_same_run_ids_in_one_namespace_both_finish(
    cluster: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_connections(monkeypatch, cluster.kubeconfig, namespace)
    api = cluster.api()
    ti = SimpleNamespace(dag_id="etl", task_id="train", run_id="scheduled__2026-12-05T00:00:00+00:00", try_number=1)
    results: dict[str, Any] = {}

    def services() -> dict[str, str]:
        items = cluster.api().get(f"/api/v1/namespaces/{namespace}/services")["items"]
        return {o["metadata"]["labels"].get("airflow-mpi.io/deployment", ""): o["metadata"]["name"] for o in items}

    def staging() -> None:
        operator = MPIJobOperator(task_id="train", job=spec(150), mpi_conn_id="mpi_k8s")
        results["staging"] = operator.execute({"ti": ti})  # type: ignore[arg-type]

    monkeypatch.setenv("AIRFLOW__MPI__DEPLOYMENT", "staging")
    first = threading.Thread(target=staging)
    first.start()
    deadline = time.monotonic() + 120
    while "staging" not in services() and time.monotonic() < deadline:
        time.sleep(0.2)
    monkeypatch.setenv("AIRFLOW__MPI__DEPLOYMENT", "production")
    seen: list[dict[str, str]] = []

    def watch() -> None:
        while first.is_alive() and len(seen) < 600:
            seen.append(services())
            time.sleep(0.3)

    watcher = threading.Thread(target=watch)
    watcher.start()
    production = MPIJobOperator(task_id="train", job=spec(20), mpi_conn_id="mpi_k8s")
    results["production"] = production.execute({"ti": ti})  # type: ignore[arg-type]
    first.join(180)
    watcher.join(30)
    assert any(set(found) == {"staging", "production"} for found in seen), seen  # both at once
    assert results["production"]["result"] == {"steps": 20}
    assert results["staging"]["result"] == {"steps": 150}
    assert results["staging"]["job_name"] != results["production"]["job_name"]
    assert job_objects(api, namespace) == []
