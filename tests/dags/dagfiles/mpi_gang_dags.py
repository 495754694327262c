"""DAGs of gang-scheduled jobs the tests run with dag.test() against the API double: the Volcano
Job backend and the Kubernetes backend with each gang setting, waiting and deferred."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_mpi.operators.mpi import MPIJobOperator

START = pendulum.datetime(2026, 1, 1, tz="UTC")


def gang_job(name: str, scheduling: dict[str, object]) -> dict[str, object]:
    return {
        "name": name,
        "image": "registry.example/train:1",
        "command": ["python", "/app/t.py"],
        "master": {"gpus": 1},
        "workers": {"replicas": 1, "gpus": 1},
        "startup_timeout": 30,
        "timeout": 60,
        "scheduling": scheduling,
    }


with DAG("mpi_test_gang", schedule=None, start_date=START, catchup=False):
    for deferrable in (False, True):
        mode = "deferred" if deferrable else "waiting"
        MPIJobOperator(
            task_id=f"volcano_backend_{mode}",
            job=gang_job("vc", {"queue": "training"}),
            mpi_conn_id="mpi_volcano",
            deferrable=deferrable,
            retries=0,
        )
        for gang, queue in (("volcano", "training"), ("coscheduling", None), ("kueue", "training")):
            MPIJobOperator(
                task_id=f"{gang}_gang_{mode}",
                job=gang_job(gang[:5], {"gang": gang, **({"queue": queue} if queue else {})}),
                mpi_conn_id="mpi_k8s",
                deferrable=deferrable,
                retries=0,
            )
