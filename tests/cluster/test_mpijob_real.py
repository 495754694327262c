"""The MPIJob backend with the real mpi-operator (built from its module, run with its own CRD
and ClusterRole): it makes the launcher Job and worker pods from our templates, the real
scheduler binds them, the node agent runs them; the launch script finds the workers by the
operator's names, in host mode and from the operator's own hostfile."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import JobFailed, JobTimeout
from airflow_mpi.runner.job import JobRunner
from tests.cluster.cluster import Cluster
from tests.cluster.conftest import CORE_LEFT, TRAINS_FOREVER, Log, objects_left, real_job, run_evicting_a_worker

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

LEFT = (*CORE_LEFT, "/apis/batch/v1/namespaces/{ns}/jobs", "/apis/kubeflow.org/v2beta1/namespaces/{ns}/mpijobs")


@pytest.fixture
def operator(cluster: Cluster) -> Cluster:
    cluster.controller("mpi-operator")
    return cluster


def left(cluster: Cluster, namespace: str) -> list[str]:
    return objects_left(cluster.api(), namespace, LEFT)


def make(cluster: Cluster, namespace: str, **fields: Any) -> tuple[KubernetesBackend, Any]:
    return real_job(cluster, namespace, "mpijob", **{"name": "mjreal", **fields})


@pytest.mark.parametrize("hosts_mode", ["host", "hostfile"])
def test_a_real_job_runs_as_an_mpijob(operator: Cluster, namespace: str, hosts_mode: str) -> None:
    backend, plan = make(operator, namespace, hosts_mode=hosts_mode)
    log = Log()
    result = JobRunner(backend, plan, log).run()
    job = plan.job_name
    assert result.exit_code == 0, log
    assert result.result == {
        "sum": 6,
        "size": 3,
        "hosts": sorted([f"{job}-launcher", f"{job}-worker-0", f"{job}-worker-1"]),
    }, log
    if hosts_mode == "hostfile":
        # The operator's own hostfile: <pod>.<job>.<namespace>.svc.cluster.local.
        assert any(f"{job}-worker-0.{job}.{namespace}.svc.cluster.local" in line for line in log), log
    assert left(operator, namespace) == []


def test_a_failing_rank_is_named(operator: Cluster, namespace: str) -> None:
    program = "from mpi4py import MPI; import sys\nif MPI.COMM_WORLD.rank == 2: sys.exit(3)\nMPI.COMM_WORLD.Barrier()\n"
    backend, plan = make(operator, namespace, command=[sys.executable, "-m", "mpi4py", "-c", program])
    log = Log()
    with pytest.raises(JobFailed) as caught:
        JobRunner(backend, plan, log).run()
    assert (caught.value.rank, caught.value.exit_code) == (2, 3), log
    assert left(operator, namespace) == []


def test_an_evicted_worker_ends_the_job(operator: Cluster, namespace: str) -> None:
    backend, plan = make(operator, namespace, command=[sys.executable, "-c", TRAINS_FOREVER])
    failure, victim = run_evicting_a_worker(operator, namespace, backend, plan)
    assert failure.pod == victim and "Evicted" in str(failure), failure
    assert left(operator, namespace) == []


def test_the_timeout_ends_the_job(operator: Cluster, namespace: str) -> None:
    program = "import time\nprint('forever', flush=True)\ntime.sleep(600)\n"
    backend, plan = make(operator, namespace, command=[sys.executable, "-c", program], timeout=5)
    started = time.monotonic()
    with pytest.raises(JobTimeout):
        JobRunner(backend, plan, Log()).run()
    assert time.monotonic() - started < 5 + 40
    assert left(operator, namespace) == []


TASKFLOW_FUNCTION = [
    "def train(scale):\n",
    "    from mpi4py import MPI\n",
    "    comm = MPI.COMM_WORLD\n",
    "    return {'sum': comm.allreduce((comm.rank + 1) * scale), 'size': comm.size}\n",
]


def test_a_taskflow_function_runs_as_an_mpijob(operator: Cluster, namespace: str) -> None:
    """@task.mpi's command names no path: the runner is found in our config directory, which the
    MPIJob backend mounts off the operator's /etc/mpi."""
    from airflow_mpi.decorators.taskflow import FunctionCall, build_taskflow_files, function_source, runner_command

    call = FunctionCall(function_source("train", TASKFLOW_FUNCTION, 1, "/dags/tf.py"), [10], {}, ["scale"])
    backend, plan = make(
        operator,
        namespace,
        name="mjtf",
        command=runner_command(sys.executable),
        files=build_taskflow_files(call),
        workers={"replicas": 1},
    )
    assert plan.paths.config_dir != "/etc/mpi"
    log = Log()
    result = JobRunner(backend, plan, log).run()
    assert result.exit_code == 0 and result.result == {"sum": 30, "size": 2}, log
    assert left(operator, namespace) == []
