"""The in-cluster tests' own DAGs (tests/nodes/test_airflow_in_cluster.py), beside the example
DAGs in the deployment's DAGs folder: a job that prints numbered lines from every rank for as
long as a run asks (the long job across a token rotation, a triggerer deleted under it), waiting
or deferrable as the run asks; and the smallest job once for every verb of the workers' Role,
each under a ServiceAccount whose Role lacks that verb (the task fails before creating it)."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, Param
from kubernetes.client import models as k8s

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

# The workers' Role's verbs as docs/guides/rbac.md grants them (the test checks this is the page's
# list): a task for each, in a pod under a ServiceAccount whose Role lacks that one verb, so every
# case runs at once. The job is the smallest; each task fails before creating it.
WORKER_VERBS = [
    *[("", "pods", verb) for verb in ("create", "get", "list", "watch", "delete")],
    ("", "pods/log", "get"),
    *[("", resource, verb) for resource in ("services", "secrets", "configmaps")
      for verb in ("create", "get", "list", "delete")],
    *[("coordination.k8s.io", "leases", verb) for verb in ("create", "get", "delete")],
    *[("", "events", verb) for verb in ("get", "list", "watch")],
]  # fmt: skip


def account_without(resource: str, verb: str) -> str:
    """The ServiceAccount (and its Role) that has every verb of the workers' Role but this one."""
    return f"no-{verb}-{resource.replace('/', '-')}"


# Six task pods at a time: each starts a Python with Airflow, beside the long jobs' followed logs.
with DAG("mpi_role_checks", schedule=None, start_date=START, catchup=False, max_active_runs=1, max_active_tasks=6):
    for _, resource, verb in WORKER_VERBS:
        account = account_without(resource, verb)
        MPIJobOperator(
            task_id=account.replace("-", "_"),
            job={
                "name": "small",
                "image": IMAGE,
                "command": ["python", "-c", "print('hello')"],
                "workers": {"replicas": 1, "cpu": 1, "memory": "256Mi"},
                "master": {"cpu": 1, "memory": "256Mi"},
                "startup_timeout": 120,
                "timeout": 300,
            },
            executor_config={
                "pod_override": k8s.V1Pod(
                    spec=k8s.V1PodSpec(service_account_name=account, containers=[k8s.V1Container(name="base")])
                )
            },
            retries=0,
        )
