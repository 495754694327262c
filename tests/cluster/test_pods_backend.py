"""The plain pods backend on the real control plane: the real apiserver (validation, admission,
watch, the log proxy to the node), the real scheduler (binding, resources), the real garbage
collector (teardown through owner references); real sshd, mpiexec and mpi4py in the pods."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import JobFailed, JobTimeout, SshdNotReady
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.runner.job import JobResult, JobRunner
from airflow_mpi.spec import MPIJobSpec
from tests.cluster.cluster import MISSING_IMAGE, Cluster
from tests.cluster.conftest import Log, api_client, job_objects, when_logged

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

LINES_PER_RANK = 200
PROGRAM = (
    "from mpi4py import MPI; import json, socket, sys; c = MPI.COMM_WORLD\n"
    f"for i in range({LINES_PER_RANK}): print(f'rank {{c.rank}} line {{i:04d}}', flush=True)\n"
    "s = c.allreduce(c.rank + 1); hosts = c.gather(socket.gethostname())\n"
    "if c.rank == 0: print('AIRFLOW_MPI_RESULT ' + json.dumps({'sum': s, 'size': c.size, 'hosts': sorted(hosts)}))\n"
)


def make_plan(workers: int | dict[str, Any] = 2, **fields: Any) -> JobPlan:
    data: dict[str, Any] = {
        "name": "real",
        "image": "registry.example/airflow-mpi-train:0.1",
        "command": [sys.executable, "-c", PROGRAM],
        "workers": workers if isinstance(workers, dict) else {"replicas": workers},
        "startup_timeout": 60,
        "timeout": 120,
    }
    data.update(fields)
    return render_plan(MPIJobSpec.from_dict(data), RunIdentity("realdag", "train", f"run-{time.monotonic_ns()}"))


def backend_for(cluster: Cluster, namespace: str) -> KubernetesBackend:
    return KubernetesBackend(api_client=api_client(cluster.kubeconfig), namespace=namespace)


def run(backend: KubernetesBackend, plan: JobPlan, log: Log) -> JobResult:
    return JobRunner(backend, plan, log).run()


def test_a_job_runs_with_every_line_once_and_leaves_nothing(cluster: Cluster, namespace: str) -> None:
    backend = backend_for(cluster, namespace)
    plan = make_plan(workers=2)
    log = Log()
    result = run(backend, plan, log)
    job = plan.job_name
    assert result.exit_code == 0, log
    assert result.result == {
        "sum": 6,
        "size": 3,
        "hosts": sorted([f"{job}-master-0", f"{job}-worker-0", f"{job}-worker-1"]),
    }
    for rank in range(3):
        lines = [line for line in log if f"rank {rank} line " in line]
        expected = [f"rank {rank} line {i:04d}" for i in range(LINES_PER_RANK)]
        assert [line.split("]", 1)[-1].split(":", 1)[-1].strip() if "]" in line else line for line in lines] == expected
    assert backend.leftovers(job) == []
    assert job_objects(cluster.api(), namespace) == []
    # The scheduler spread the pods over the Nodes by itself; each ran on the Node it was bound to.
    assert cluster.running_pods() == []


def test_a_failing_rank_is_named(cluster: Cluster, namespace: str) -> None:
    program = "from mpi4py import MPI; import sys\nif MPI.COMM_WORLD.rank == 1: sys.exit(3)\nMPI.COMM_WORLD.Barrier()\n"
    plan = make_plan(workers=2, command=[sys.executable, "-m", "mpi4py", "-c", program])
    log = Log()
    with pytest.raises(JobFailed) as caught:
        run(backend_for(cluster, namespace), plan, log)
    assert (caught.value.rank, caught.value.exit_code) == (1, 3), log
    assert f"rank 1 on pod {plan.job_name}-worker-0 exited with code 3" in str(caught.value)
    assert job_objects(cluster.api(), namespace) == []


def test_more_gpus_than_any_node_has_is_named_unschedulable(cluster: Cluster, namespace: str) -> None:
    plan = make_plan({"replicas": 1, "gpus": 8}, startup_timeout=8)
    started = time.monotonic()
    with pytest.raises(SshdNotReady) as caught:
        run(backend_for(cluster, namespace), plan, Log())
    assert 8 <= time.monotonic() - started < 8 + 15
    text = str(caught.value)
    assert "Unschedulable" in text and "Insufficient nvidia.com/gpu" in text, text
    assert job_objects(cluster.api(), namespace) == []


def test_an_image_that_cannot_be_pulled_fails_fast(cluster: Cluster, namespace: str) -> None:
    plan = make_plan(workers=1, image=MISSING_IMAGE, startup_timeout=60)
    started = time.monotonic()
    with pytest.raises(JobFailed) as caught:
        run(backend_for(cluster, namespace), plan, Log())
    assert time.monotonic() - started < 20
    assert "ErrImagePull" in str(caught.value) or "ImagePullBackOff" in str(caught.value), caught.value
    assert job_objects(cluster.api(), namespace) == []


def test_an_evicted_worker_ends_the_job(cluster: Cluster, namespace: str) -> None:
    program = "from mpi4py import MPI; import time\nprint('training', flush=True)\ntime.sleep(600)\n"
    plan = make_plan(workers=2, command=[sys.executable, "-c", program])
    log = Log()
    victim = f"{plan.job_name}-worker-1"
    evictor = when_logged(log, "training", lambda: cluster.evict(namespace, victim))
    started = time.monotonic()
    with pytest.raises(JobFailed) as caught:
        run(backend_for(cluster, namespace), plan, log)
    evictor.join()
    assert time.monotonic() - started < 60
    assert caught.value.pod == victim and "Evicted" in str(caught.value), caught.value
    assert job_objects(cluster.api(), namespace) == []


def test_the_timeout_ends_the_job(cluster: Cluster, namespace: str) -> None:
    program = "import time\nprint('forever', flush=True)\ntime.sleep(600)\n"
    plan = make_plan(workers=1, command=[sys.executable, "-c", program], timeout=5)
    started = time.monotonic()
    with pytest.raises(JobTimeout):
        run(backend_for(cluster, namespace), plan, Log())
    assert time.monotonic() - started < 5 + 30
    assert job_objects(cluster.api(), namespace) == []


def test_the_clusters_nccl_ib_variables_reach_every_rank(cluster: Cluster, namespace: str) -> None:
    """A connection's ``nccl_ib_env`` (the backend's ``platform_env``) through the real API
    server: every rank, master and workers, sees the variables."""
    nccl = {"NCCL_IB_HCA": "mlx5", "NCCL_IB_GID_INDEX": "3"}
    backend = KubernetesBackend(api_client=api_client(cluster.kubeconfig), namespace=namespace, platform_env=nccl)
    program = (
        "from mpi4py import MPI; import json, os; c = MPI.COMM_WORLD\n"
        "seen = c.gather({k: v for k, v in os.environ.items() if k.startswith('NCCL_IB_')})\n"
        "if c.rank == 0: print('AIRFLOW_MPI_RESULT ' + json.dumps(seen))\n"
    )
    spec = make_plan(2, command=[sys.executable, "-c", program]).spec
    plan = backend.render_plan(spec, RunIdentity("realdag", "train", f"r-{time.monotonic_ns()}"))
    log = Log()
    result = run(backend, plan, log)
    assert result.result == [nccl, nccl, nccl], log
    assert job_objects(cluster.api(), namespace) == []
