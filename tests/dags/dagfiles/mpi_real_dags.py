"""DAGs for the real-cluster tier (tests/cluster): a real mpi4py job on the Kubernetes backend,
unmapped and mapped, waiting and deferred, through the connection ``mpi_real``."""

from __future__ import annotations

import sys

import pendulum
from airflow.sdk import DAG

from airflow_mpi.operators.mpi import MPIJobOperator

START = pendulum.datetime(2026, 1, 1, tz="UTC")
REAL_JOB = {
    "name": "real-e2e",
    "image": "registry.example/airflow-mpi-train:0.1",
    "command": [
        sys.executable,
        "-c",
        "from mpi4py import MPI; import json; c = MPI.COMM_WORLD; s = c.allreduce(c.rank + 1)\n"
        "print('rank', c.rank, 'of', c.size)\n"
        "if c.rank == 0: print('AIRFLOW_MPI_RESULT ' + json.dumps({'sum': s, 'size': c.size}))",
    ],
    "workers": {"replicas": 2},
    "startup_timeout": 90,
    "timeout": 120,
}

with DAG("mpi_test_real", schedule=None, start_date=START, catchup=False):
    for deferrable in (False, True):
        mode = "deferred" if deferrable else "waiting"
        MPIJobOperator(task_id=mode, job=REAL_JOB, mpi_conn_id="mpi_real", deferrable=deferrable, retries=0)
        MPIJobOperator.partial(
            task_id=f"{mode}_mapped", mpi_conn_id="mpi_real", deferrable=deferrable, retries=0
        ).expand(job=[REAL_JOB, {**REAL_JOB, "workers": {"replicas": 1}}])

# The deferred path on the controllers' kinds (tests/cluster/test_deferred_kinds_real.py): the
# trigger reads the pods as each kind does and follows the master's log (an MPIJob's: the launcher
# Job's own pod; a TrainJob's: its master Job's), through the connections ``mpi_real_<kind>``.
LIVE_JOB = {
    **REAL_JOB,
    "command": [
        *REAL_JOB["command"][:2],
        REAL_JOB["command"][2] + "\nimport sys, time; sys.stdout.flush(); time.sleep(4)",
    ],
}
FAILING_RANK = [sys.executable, "-m", "mpi4py", "-c",
                "from mpi4py import MPI; import sys\nif MPI.COMM_WORLD.rank == 2: sys.exit(3)\nMPI.COMM_WORLD.Barrier()\n"]  # fmt: skip

with DAG("mpi_test_real_kinds", schedule=None, start_date=START, catchup=False):
    for kind in ("volcano", "mpijob", "trainjob"):
        MPIJobOperator(task_id=f"{kind}_ok", job={**LIVE_JOB, "name": f"{kind[:3]}ok"},
                       mpi_conn_id=f"mpi_real_{kind}", deferrable=True, retries=0)  # fmt: skip
        MPIJobOperator(task_id=f"{kind}_rank", job={**REAL_JOB, "name": f"{kind[:3]}rank", "command": FAILING_RANK},
                       mpi_conn_id=f"mpi_real_{kind}", deferrable=True, retries=0)  # fmt: skip

# Deferred failures on real Nodes (tests/nodes/test_deferred_nodes.py): the training image's own
# Python, through the connection ``mpi_nodes``; each task ends failed, with its cause named.
NODE_JOB = {"name": "ndef", "image": "localhost/airflow-mpi-train:dev", "workers": {"replicas": 2},
            "startup_timeout": 90, "timeout": 120}  # fmt: skip
MEMORY_HOG = (
    "from mpi4py import MPI; c = MPI.COMM_WORLD\n"
    "if c.rank == 2:\n    hog = []\n    while True: hog.append(bytearray(16 << 20))\n"
    "c.Barrier()\n"
)
# Rank 1 stops itself (SIGSTOP) at its fourth step: the others wait in allreduce_step, silent.
STOPPED_RANK = (
    "import os, signal, time\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
    "def allreduce_step(step):\n    return c.allreduce(step)\n"
    "for step in range(1000):\n    print(f'step {step} rank {c.rank}', flush=True)\n"
    "    if c.rank == 1 and step == 3:\n        os.kill(os.getpid(), signal.SIGSTOP)\n"
    "    allreduce_step(step)\n    time.sleep(0.3)\n"
)

with DAG("mpi_test_nodes_deferred", schedule=None, start_date=START, catchup=False):
    for task_id, job in (
        ("rank_exit", {**NODE_JOB, "command": ["python", *FAILING_RANK[1:]]}),
        ("oom", {**NODE_JOB, "command": ["python", "-c", MEMORY_HOG], "workers": {"replicas": 2, "memory": "256Mi"}}),
        ("timeout", {**NODE_JOB, "command": ["python", "-c", "import time; time.sleep(600)"], "timeout": 20}),
        ("hang", {**NODE_JOB, "command": ["python", "-c", STOPPED_RANK], "progress_timeout": 15, "timeout": 300}),
    ):
        MPIJobOperator(task_id=task_id, job={**job, "name": f"ndef-{task_id.replace('_', '')}"},
                       mpi_conn_id="mpi_nodes", deferrable=True, retries=0)  # fmt: skip
