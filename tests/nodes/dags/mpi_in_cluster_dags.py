"""The in-cluster tests' own DAGs (tests/nodes/test_airflow_in_cluster.py), beside the example
DAGs in the deployment's DAGs folder: a job that prints numbered lines from every rank for as
long as a run asks (the long job across a token rotation, a triggerer deleted under it), waiting
or deferrable as the run asks; and the smallest job (a Role missing a verb fails before it)."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, Param

from airflow_mpi.operators.mpi import MPIJobOperator

IMAGE = os.environ.get("MPI_DEMO_IMAGE", "airflow-mpi/train:0.1")
START = datetime(2026, 1, 1)
# Every rank prints "rank <r> line <i>" once a second, rank 0 its result last.
LINES = (
    "import json, os, time\n"
    "rank, n = os.environ['RANK'], int(os.environ['SECONDS_TO_PRINT'])\n"
    "for i in range(n):\n"
    "    print(f'rank {rank} line {i:05d}', flush=True)\n"
    "    time.sleep(1)\n"
    "if rank == '0':\n"
    "    print('AIRFLOW_MPI_RESULT ' + json.dumps({'lines': n}), flush=True)\n"
)


def wait_as_the_run_asks(context) -> None:  # type: ignore[no-untyped-def]
    """The run's ``deferrable`` param picks where the task waits (as the example DAG does)."""
    context["task"].deferrable = bool(context["params"]["deferrable"])


with DAG(
    "mpi_lines",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=4,
    params={
        "seconds": Param(60, type="integer", minimum=1),
        # Each rank takes a whole core and the Nodes have two each: 0 lets jobs run side by side.
        "workers": Param(1, type="integer", minimum=0, maximum=2),
        "deferrable": Param(False, type="boolean"),
    },
):
    MPIJobOperator(
        task_id="train",
        job={
            "name": "lines",
            "image": IMAGE,
            "command": ["python", "-c", LINES],
            "workers": {"replicas": "{{ params.workers }}", "cpu": 1, "memory": "256Mi"},
            "master": {"cpu": 1, "memory": "256Mi"},
            "env": {"SECONDS_TO_PRINT": "{{ params.seconds }}"},
            "startup_timeout": 300,
            "timeout": "{{ params.seconds + 900 }}",
        },
        deferrable=False,
        pre_execute=wait_as_the_run_asks,
        retries=0,
    )

with DAG("mpi_smallest", schedule=None, start_date=START, catchup=False, max_active_runs=1):
    MPIJobOperator(
        task_id="train",
        job={
            "name": "small",
            "image": IMAGE,
            "command": ["python", "-c", "print('hello')"],
            "workers": {"replicas": 1, "cpu": 1, "memory": "256Mi"},
            "master": {"cpu": 1, "memory": "256Mi"},
            "startup_timeout": 120,
            "timeout": 300,
        },
        retries=0,
    )
