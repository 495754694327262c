"""Through Airflow (``dag.test()``) on the real control plane: unmapped and mapped tasks, waiting
and deferred, and both example DAGs to their accuracy bar."""

from __future__ import annotations

from typing import Any

import pytest

from tests.airflow_helpers import task_states, xcom
from tests.cluster.cluster import Cluster
from tests.cluster.conftest import install_connections, job_objects

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def mapped_results(dag_run: Any, task_id: str) -> list[Any]:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(
            XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id, task_ids=task_id, key="return_value")
        ).all()
        return sorted((row.map_index, row.value["result"]) for row in rows)


def test_unmapped_and_mapped_tasks_waiting_and_deferred(
    dagbag: Any, cluster: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_connections(monkeypatch, cluster.kubeconfig, namespace, mpi_conn_id="mpi_real")
    dag_run = dagbag.get_dag("mpi_test_real").test()
    assert set(task_states(dag_run).values()) == {"success"}, task_states(dag_run)
    for task_id in ("waiting", "deferred"):
        assert xcom(dag_run, task_id)["result"] == {"sum": 6, "size": 3}, task_id
    for task_id in ("waiting_mapped", "deferred_mapped"):
        assert mapped_results(dag_run, task_id) == [(0, {"sum": 6, "size": 3}), (1, {"sum": 3, "size": 2})]
    assert job_objects(cluster.api(), namespace) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dag_id", "final_task"),
    [("mpi_training_pipeline", "evaluate"), ("mpi_training_taskflow", "evaluate")],
    ids=["operator", "taskflow"],
)
def test_the_example_dags_reach_their_accuracy(
    dagbag: Any, cluster: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch, dag_id: str, final_task: str
) -> None:
    install_connections(monkeypatch, cluster.kubeconfig, namespace, mpi_conn_id="mpi_default")
    dag_run = dagbag.get_dag(dag_id).test()
    assert set(task_states(dag_run).values()) == {"success"}, task_states(dag_run)
    assert xcom(dag_run, final_task) >= 0.85
    assert job_objects(cluster.api(), namespace) == []
