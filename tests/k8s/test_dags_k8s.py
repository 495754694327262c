"""End to end through Airflow, the Kubernetes backend and the API double whose kubelet runs the
pods for real (sandboxes with real sshd, mpiexec, mpi4py and DeepSpeed)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_mpi.testing.kube_double import KubeDouble
from tests.airflow_helpers import task_states, xcom
from tests.k8s.conftest import install_connections, job_objects


def test_deferrable_and_waiting_modes_pass_the_same_job(dagbag: Any, real_double: KubeDouble) -> None:
    dag_run = dagbag.get_dag("mpi_test_k8s").test()
    assert task_states(dag_run) == {"waiting": "success", "deferred": "success"}
    for task_id in ("waiting", "deferred"):
        result = xcom(dag_run, task_id)
        assert result["result"] == {"sum": 6, "size": 3}, task_id
        assert result["np"] == 3
    assert job_objects(real_double) == []


@pytest.mark.slow
def test_example_dag_on_kubernetes(dagbag: Any, real_double: KubeDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    install_connections(monkeypatch, real_double, mpi_conn_id="mpi_default")
    dag_run = dagbag.get_dag("mpi_training_pipeline").test()
    assert task_states(dag_run) == {"preprocess": "success", "train": "success", "evaluate": "success"}
    assert xcom(dag_run, "evaluate") >= 0.85
    assert real_double.request_count("POST", "/pods") == 3
    assert job_objects(real_double) == []
