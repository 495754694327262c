"""Unmapped and mapped tasks end to end through Airflow (``dag.test()``), the Kubernetes backend
and the strict API double, waiting in the worker and deferred to the triggerer: every object is
accepted, labelled with the task's map index only when it is mapped, and removed at the end."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_mpi.job.naming import LABEL_MAP_INDEX, LABEL_TASK_ID
from tests.doubles.apivalidation import validate_object
from tests.doubles.kube_double import KubeDouble
from tests.k8s.conftest import job_objects

pytestmark = pytest.mark.usefixtures("connections")
PLURAL = {"Service": "services", "Secret": "secrets", "ConfigMap": "configmaps", "Pod": "pods"}


def task_instances(dag_run: Any) -> dict[tuple[str, int], tuple[str, Any]]:
    """(task id, map index) -> (state, returned value) of every task instance of the run."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        found = {}
        for ti in dag_run.get_task_instances(session=session):
            rows = session.scalars(
                XComModel.get_many(
                    run_id=dag_run.run_id,
                    dag_ids=dag_run.dag_id,
                    task_ids=ti.task_id,
                    map_indexes=ti.map_index,
                    key="return_value",
                )
            ).all()
            found[(ti.task_id, ti.map_index)] = (str(ti.state), rows[0].value if rows else None)
        return found


def test_unmapped_and_mapped_tasks_run_waiting_and_deferred(dagbag: Any, double: KubeDouble) -> None:
    dag_run = dagbag.get_dag("mpi_test_k8s_mapped").test()
    instances = task_instances(dag_run)
    expected = {
        ("waiting", -1),
        ("deferred", -1),
        ("waiting_mapped", 0),
        ("waiting_mapped", 1),
        ("deferred_mapped", 0),
        ("deferred_mapped", 1),
    }
    assert set(instances) == expected
    assert {key: state for key, (state, _) in instances.items()} == dict.fromkeys(expected, "success")
    results = {key: value for key, (_, value) in instances.items()}
    assert all(value["exit_code"] == 0 and value["lines"] >= 1 for value in results.values()), results
    assert results[("waiting_mapped", 1)]["np"] == 3 and results[("deferred_mapped", 0)]["np"] == 2
    assert len({value["job_name"] for value in results.values()}) == 6  # one job per task instance
    services = [body for body in double.created if body.get("kind") == "Service"]
    labelled = {
        (b["metadata"]["labels"][LABEL_TASK_ID], b["metadata"]["labels"].get(LABEL_MAP_INDEX)) for b in services
    }
    assert labelled == {
        ("waiting", None),
        ("deferred", None),
        ("waiting_mapped", "0"),
        ("waiting_mapped", "1"),
        ("deferred_mapped", "0"),
        ("deferred_mapped", "1"),
    }
    bodies = [body for body in double.created if body.get("kind") in PLURAL]
    # Service, Secret and ConfigMap per job; pods in each mode: 2 unmapped, 2 + 3 mapped (1 and 2 workers)
    assert len(bodies) == 6 * 3 + 2 * (2 + 2 + 3)
    assert all(validate_object(PLURAL[body["kind"]], body) == [] for body in bodies)
    assert job_objects(double) == []
