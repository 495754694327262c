"""The failure cases the deferred path must report exactly as the waiting path does, each on every
job kind (plain pods, a Volcano Job, an MPIJob), waiting and deferred; run with dag.test() against
the API double and its controllers by tests/k8s/test_deferred_every_kind.py, which gives each
case's pods their behaviour by the case name that starts the job's name."""

from __future__ import annotations

import json
import os
from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_mpi.operators.mpi import MPIJobOperator

START = pendulum.datetime(2026, 1, 1, tz="UTC")
KINDS = {"pods": "mpi_pods", "volcano": "mpi_volcano", "mpijob": "mpi_mpijob"}
# case -> what its job asks for (the pods' behaviour is the test's)
CASES: dict[str, dict[str, Any]] = {
    "rank": {},  # a rank exits with 3 (on Volcano, its policy then deletes the other pods)
    "evict": {},  # a worker is evicted while the job trains
    "tmout": {"timeout": 3},  # the master runs past the job's timeout
    "queue": {  # asks for more GPUs than the node has: queued until queue_timeout
        "master": {"gpus": 4},
        "workers": {"replicas": 2, "gpus": 4},
        "scheduling": {"gang": "volcano", "queue_timeout": 3},
    },
}
MPIJOB_CASES: dict[str, dict[str, Any]] = {
    "queue": {"scheduling": {"queue": "training", "queue_timeout": 3}},  # Kueue holds the MPIJob suspended
    "deadl": {},  # the launcher Job's deadline (the test sets it) deletes the launcher
}


def record_failure(context: Any) -> None:
    """One JSON line per failed task: its id and its error's message."""
    path = os.environ.get("AIRFLOW_MPI_FAILURE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"task": context["ti"].task_id, "error": str(context["exception"])}) + "\n")


def job(case: str, kind: str, mode: str) -> dict[str, Any]:
    return {
        "name": f"{case}{kind[:3]}{mode[0]}",
        "image": "registry.example/train:1",
        "command": ["python", "/app/train.py"],
        "workers": {"replicas": 2},
        "startup_timeout": 20,
        "timeout": 30,
        **CASES.get(case, {}),
        **(MPIJOB_CASES.get(case, {}) if kind == "mpijob" else {}),
    }


with DAG("mpi_test_every_kind", schedule=None, start_date=START, catchup=False):
    for kind, conn_id in KINDS.items():
        for case in dict.fromkeys([*CASES, *(MPIJOB_CASES if kind == "mpijob" else ())]):
            for deferrable in (False, True):
                mode = "deferred" if deferrable else "waiting"
                MPIJobOperator(
                    task_id=f"{case}_{kind}_{mode}",
                    job=job(case, kind, mode),
                    mpi_conn_id=conn_id,
                    deferrable=deferrable,
                    retries=0,
                    on_failure_callback=record_failure,
                )
