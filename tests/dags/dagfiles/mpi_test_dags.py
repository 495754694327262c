"""DAGs the tests run with dag.test(): a failing job, a templated job, the sshd sensor."""

from __future__ import annotations

import sys

import pendulum
from airflow.sdk import DAG

from airflow_mpi.operators.mpi import MPIJobOperator
from airflow_mpi.sensors.sshd import SshdReadySensor

PY = sys.executable
START = pendulum.datetime(2026, 1, 1, tz="UTC")

with DAG("mpi_test_fail", schedule=None, start_date=START, catchup=False):
    MPIJobOperator(
        task_id="train",
        retries=0,
        job={
            "name": "failing",
            "command": [
                PY,
                "-c",
                "import os, sys; print('rank', os.environ['RANK'], 'up'); sys.exit(3 * (os.environ['RANK'] == '1'))",
            ],
            "workers": {"replicas": 2},
        },
    )

with DAG("mpi_test_templated", schedule=None, start_date=START, catchup=False, params={"workers": 1, "word": "hello"}):
    MPIJobOperator(
        task_id="train",
        job={
            "name": "templated",
            "command": [
                "bash",
                "-c",
                'echo AIRFLOW_MPI_RESULT \'{"word": "{{ params.word }}", "size": \'$WORLD_SIZE\'}\'',
            ],
            "workers": {"replicas": "{{ params.workers }}"},
        },
    )

with DAG("mpi_test_sensor", schedule=None, start_date=START, catchup=False):
    SshdReadySensor(
        task_id="wait_for_sshd",
        job_name="{{ dag_run.conf['job_name'] }}",
        startup_timeout=4,
        poke_interval=0.5,
        retries=0,
    )
