"""DAGs for @task.mpi and mapped sweeps, run by the tests with dag.test(): on the local backend
(``mpi_default``) and through the Kubernetes double (``mpi_k8s``)."""

from __future__ import annotations

import sys

import pendulum
from airflow.sdk import DAG, task

from airflow_mpi.operators.mpi import MPIJobOperator

PY = sys.executable
START = pendulum.datetime(2026, 1, 1, tz="UTC")
K8S = {"image": "registry.example/airflow-mpi-train:0.1", "startup_timeout": 60, "timeout": 120}


with DAG("mpi_test_taskflow", schedule=None, start_date=START, catchup=False, params={"word": "hello"}):

    @task
    def make_scale() -> float:
        return 2.0

    @task.mpi(workers={"replicas": 2}, python=PY, retries=0)
    def allreduce(scale: float, word: str) -> dict:  # type: ignore[type-arg]
        import socket

        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        total = comm.allreduce((comm.rank + 1) * scale)
        print("rank", comm.rank, "of", comm.size, "on", socket.gethostname())
        return {"sum": total, "size": comm.size, "word": word, "rank": comm.rank}

    allreduce(make_scale(), word="{{ params.word }}")

with DAG("mpi_test_taskflow_failures", schedule=None, start_date=START, catchup=False):

    @task.mpi(workers={"replicas": 1}, python=PY, retries=0)
    def rank_raises() -> None:
        import os

        if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
            raise ValueError("bad batch on rank 1")

    @task.mpi(python=PY, retries=0)
    def returns_a_set() -> set:  # type: ignore[type-arg]
        return {1, 2}

    @task.mpi(python=PY, retries=0)
    def takes_too_much(blob: str) -> int:
        return len(blob)

    @task.mpi(workers={"replicas": 1}, python=PY, retries=0, timeout=120)
    def raises_in_collective() -> None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        if comm.rank == 1:
            raise RuntimeError("rank 1 gives up")
        comm.barrier()  # rank 0 would wait here forever: the runner's MPI_Abort ends it

    rank_raises()
    raises_in_collective()
    returns_a_set()
    takes_too_much("x" * 1_200_000)

# Mapped sweeps on the local backend: three jobs of one task, one per learning rate.
with DAG("mpi_test_taskflow_mapped", schedule=None, start_date=START, catchup=False):

    @task.mpi(workers={"replicas": 1}, python=PY, retries=0)
    def sweep(lr: float) -> dict:  # type: ignore[type-arg]
        import os
        import socket

        job = socket.gethostname().rsplit("-", 2)[0]  # rank 0 runs on <job>-master-0
        return {"lr": lr, "job": job, "np": int(os.environ["OMPI_COMM_WORLD_SIZE"])}

    sweep.expand(lr=[0.1, 0.01, 0.001])

with DAG("mpi_test_taskflow_single", schedule=None, start_date=START, catchup=False):

    @task.mpi(workers={"replicas": 1}, python=PY, retries=0)
    def single(lr: float) -> dict:  # type: ignore[type-arg]
        import os
        import socket

        job = socket.gethostname().rsplit("-", 2)[0]  # rank 0 runs on <job>-master-0
        return {"lr": lr, "job": job, "np": int(os.environ["OMPI_COMM_WORLD_SIZE"])}

    single(0.1)

# Through the Kubernetes double with its real kubelet: @task.mpi waiting and deferred, and the
# three ways to map an MPI task (expand on the operator, expand_kwargs, expand on @task.mpi).
PRINT_JOB = {
    **K8S,
    "command": [PY, "-c", "import os, json; print('AIRFLOW_MPI_RESULT ' + json.dumps(os.environ['X']))"],
    "workers": {"replicas": 1},
}

with DAG("mpi_test_taskflow_k8s", schedule=None, start_date=START, catchup=False, params={"word": "hi"}):
    for deferrable in (False, True):
        mode = "deferred" if deferrable else "waiting"

        @task.mpi(task_id=mode, workers={"replicas": 2}, python=PY, mpi_conn_id="mpi_k8s", deferrable=deferrable, **K8S)
        def k8s_allreduce(scale: float, word: str) -> dict:  # type: ignore[type-arg]
            import socket

            from mpi4py import MPI

            comm = MPI.COMM_WORLD
            total = comm.allreduce((comm.rank + 1) * scale)
            print("rank", comm.rank, "of", comm.size, "on", socket.gethostname())
            return {"sum": total, "size": comm.size, "word": word, "rank": comm.rank}

        k8s_allreduce(1.5, "{{ params.word }}")

with DAG("mpi_test_mapped_k8s", schedule=None, start_date=START, catchup=False):
    MPIJobOperator.partial(task_id="expand_job", mpi_conn_id="mpi_k8s", retries=0).expand(
        job=[{**PRINT_JOB, "name": "sweep", "env": {"X": str(i)}} for i in range(3)]
    )
    MPIJobOperator.partial(task_id="expand_kwargs", mpi_conn_id="mpi_k8s", retries=0).expand_kwargs(
        [{"job": {**PRINT_JOB, "name": "kw", "env": {"X": f"kw{i}"}}} for i in range(3)]
    )

    @task.mpi(workers={"replicas": 1}, python=PY, mpi_conn_id="mpi_k8s", retries=0, **K8S)
    def k8s_sweep(lr: float) -> dict:  # type: ignore[type-arg]
        import os
        import socket

        job = socket.gethostname().rsplit("-", 2)[0]  # rank 0 runs on <job>-master-0
        return {"lr": lr, "job": job, "np": int(os.environ["OMPI_COMM_WORLD_SIZE"])}

    k8s_sweep.expand(lr=[0.1, 0.01, 0.001])

with DAG("mpi_test_taskflow_k8s_too_big", schedule=None, start_date=START, catchup=False):

    @task.mpi(python=PY, mpi_conn_id="mpi_k8s", retries=0, **K8S)
    def k8s_too_big(blob: str) -> int:
        return len(blob)

    k8s_too_big("x" * 1_200_000)

# The "MPI job" link of @task.mpi tasks, through the Kubernetes double with scripted pods (the
# function never runs there: the link is about the job, not its result): unmapped and mapped,
# waiting and deferred.
with DAG("mpi_test_k8s_decorated_links", schedule=None, start_date=START, catchup=False):
    for deferrable in (False, True):
        mode = "deferred" if deferrable else "waiting"

        @task.mpi(task_id=mode, name="linked", mpi_conn_id="mpi_k8s", deferrable=deferrable, retries=0, **K8S)
        def linked(lr: float) -> None:
            print(lr)

        linked(0.1)
        linked.override(task_id=f"{mode}_mapped").expand(lr=[0.1, 0.01])
