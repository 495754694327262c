"""DAGs of jobs run as Kubeflow MPIJobs (the ``mpijob`` backend) that the tests run with
dag.test() against the API double's mpi-operator: waiting in the worker and deferred, in host and
hostfile mode."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_mpi.operators.mpi import MPIJobOperator

START = pendulum.datetime(2026, 1, 1, tz="UTC")


def mpijob(name: str, hosts_mode: str) -> dict[str, object]:
    return {
        "name": name,
        "image": "registry.example/train:1",
        "command": ["python", "/app/t.py"],
        "master": {"cpu": 1},
        "workers": {"replicas": 2, "cpu": 1},
        "hosts_mode": hosts_mode,
        "startup_timeout": 30,
        "timeout": 60,
    }


with DAG("mpi_test_mpijob", schedule=None, start_date=START, catchup=False):
    for deferrable in (False, True):
        for hosts_mode in ("host", "hostfile"):
            mode = "deferred" if deferrable else "waiting"
            MPIJobOperator(
                task_id=f"{hosts_mode}_{mode}",
                job=mpijob(f"mj{hosts_mode[4:] or 'h'}{'d' if deferrable else 'w'}", hosts_mode),
                mpi_conn_id="mpi_mpijob",
                deferrable=deferrable,
                retries=0,
            )
