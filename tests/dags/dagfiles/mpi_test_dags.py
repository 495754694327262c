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

with DAG("mpi_test_k8s_deferred", schedule=None, start_date=START, catchup=False):
    MPIJobOperator(
        task_id="train",
        job={"name": "deferred", "image": "registry.example/train:1", "command": ["python", "/app/t.py"],
             "workers": {"replicas": 2}, "startup_timeout": 30, "timeout": 60},
        mpi_conn_id="mpi_k8s",
        deferrable=True,
        retries=0,
    )  # fmt: skip

# The hang watchdog in both modes on the API double (tests/k8s/test_trigger_log.py): the master's
# output goes quiet; the double answers no exec, so no pod can be asked for stacks.
with DAG("mpi_test_k8s_hang", schedule=None, start_date=START, catchup=False):
    for deferrable in (False, True):
        MPIJobOperator(
            task_id="deferred" if deferrable else "waiting",
            job={"name": f"hang{'d' if deferrable else 'w'}", "image": "registry.example/train:1",
                 "command": ["python", "/app/t.py"], "workers": {"replicas": 2}, "startup_timeout": 30,
                 "timeout": 25, "progress_timeout": 3},
            mpi_conn_id="mpi_k8s",
            deferrable=deferrable,
            retries=0,
        )  # fmt: skip

# An unmapped and a mapped task in both modes, through the Kubernetes backend and the strict API
# double with scripted pods: each task's jobs are labelled for its own map index (or none).
SCRIPTED_JOB = {
    "name": "identity",
    "image": "registry.example/train:1",
    "command": ["python", "/app/t.py"],
    "workers": {"replicas": 1},
    "startup_timeout": 30,
    "timeout": 60,
}

with DAG("mpi_test_k8s_mapped", schedule=None, start_date=START, catchup=False):
    for deferrable in (False, True):
        mode = "deferred" if deferrable else "waiting"
        MPIJobOperator(task_id=mode, job=SCRIPTED_JOB, mpi_conn_id="mpi_k8s", deferrable=deferrable, retries=0)
        MPIJobOperator.partial(
            task_id=f"{mode}_mapped", mpi_conn_id="mpi_k8s", deferrable=deferrable, retries=0
        ).expand(job=[SCRIPTED_JOB, {**SCRIPTED_JOB, "workers": {"replicas": 2}}])

# A job whose master runs until the test has looked at the task's link (the test scripts it).
with DAG("mpi_test_k8s_link_while_running", schedule=None, start_date=START, catchup=False):
    MPIJobOperator(task_id="train", job={**SCRIPTED_JOB, "name": "slow"}, mpi_conn_id="mpi_k8s", retries=0)

# A connection id that does not exist (a typo): the task fails before anything is created.
with DAG("mpi_test_missing_conn", schedule=None, start_date=START, catchup=False):
    MPIJobOperator(task_id="train", retries=0, mpi_conn_id="mpi_tpyo",
                   job={"name": "typo", "command": [PY, "-c", "print('never runs')"]})  # fmt: skip
