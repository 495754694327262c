"""The browser tier's own DAGs: a job whose rank 1 exits with 3, on the local backend; a
deferrable job on the API double (its master prints for a while)."""

from __future__ import annotations

import sys
from datetime import datetime

from airflow.sdk import DAG

from airflow_mpi.operators.mpi import MPIJobOperator

START = datetime(2026, 1, 1)

with DAG("ui_fail", schedule=None, start_date=START, catchup=False):
    MPIJobOperator(
        task_id="train",
        job={
            "name": "uifail",
            "command": [
                sys.executable,
                "-c",
                "import os, sys; print('rank', os.environ['RANK'], 'up'); sys.exit(3 * (os.environ['RANK'] == '1'))",
            ],
            "workers": {"replicas": 1},
        },
        retries=0,
    )

with DAG("ui_deferred", schedule=None, start_date=START, catchup=False):
    MPIJobOperator(
        task_id="train",
        job={
            "name": "uidefer",
            "image": "registry.example/train:1",
            "command": ["python", "/app/t.py"],
            "workers": {"replicas": 1},
            "startup_timeout": 60,
            "timeout": 300,
        },
        mpi_conn_id="mpi_k8s",
        deferrable=True,
        retries=0,
    )
