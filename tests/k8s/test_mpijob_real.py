"""A real MPI job (mpi4py over real sshd and mpiexec in sandboxed pods) on the MPIJob backend:
the double's mpi-operator makes the pods from our templates, the real kubelet runs them, and the
launch script on the launcher finds the workers by the controller's names, in host mode and from
the controller's own ``/etc/mpi/hostfile``. It creates network namespaces: run it under the
integration lock."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_mpi.backends.mpijob import MPIJobBackend
from airflow_mpi.mpijob import MPIJOB_PATHS, OPERATOR_SSH_MOUNT
from airflow_mpi.naming import RunIdentity
from airflow_mpi.runner import JobRunner
from airflow_mpi.spec import MPIJobSpec
from airflow_mpi.testing.kube_double import KubeDouble
from airflow_mpi.testing.mpijob_controller import MPIJobController
from tests.k8s.conftest import api_client_for, unique

LEFT_KINDS = ("pods", "services", "secrets", "configmaps", "jobs.batch", "mpijobs.kubeflow.org")
PROGRAM = (
    "from mpi4py import MPI; import json, socket; c = MPI.COMM_WORLD; s = c.allreduce(c.rank + 1)\n"
    "hosts = c.gather(socket.gethostname())\n"
    "if c.rank == 0: print('AIRFLOW_MPI_RESULT ' + json.dumps({'sum': s, 'size': c.size, 'hosts': sorted(hosts)}))"
)


@pytest.fixture
def mount_points() -> Iterator[None]:
    """The real kubelet makes its pods' mount points on this machine: remove the ones it made."""
    wanted = [Path(MPIJOB_PATHS.config_dir), Path(OPERATOR_SSH_MOUNT), Path("/etc/mpi")]
    made = [path for path in wanted if not path.exists()]
    yield
    for path in reversed(made):
        with contextlib.suppress(OSError):
            path.rmdir()


@pytest.mark.parametrize("hosts_mode", ["host", "hostfile"])
def test_a_real_job_runs_as_an_mpijob(real_double: KubeDouble, mount_points: None, hosts_mode: str) -> None:
    # The operator's --cluster-domain: its hostfile names are then <pod>.<job>.<ns>.svc.cluster.local,
    # which the real kubelet's hosts files resolve.
    controller = MPIJobController(real_double, cluster_domain="cluster.local")
    try:
        backend = MPIJobBackend(api_client=api_client_for(real_double), namespace="default")
        spec = MPIJobSpec.from_dict(
            {
                "name": "mjreal",
                "image": "registry.example/airflow-mpi-train:0.1",
                "command": [sys.executable, "-c", PROGRAM],
                "workers": {"replicas": 2},
                "hosts_mode": hosts_mode,
                "startup_timeout": 60,
                "timeout": 120,
            }
        )
        plan = backend.render_plan(spec, RunIdentity("mdag", "train", unique("real")))
        log: list[str] = []
        result = JobRunner(backend, plan, log.append).run()
        job = plan.job_name
        assert result.exit_code == 0, log
        # Every rank ran where the plan says: the launcher by its host name, the workers by theirs.
        expected = sorted([f"{job}-launcher", f"{job}-worker-0", f"{job}-worker-1"])
        assert result.result == {"sum": 6, "size": 3, "hosts": expected}, log
        if hosts_mode == "hostfile":
            assert any(f"MPI_HOSTS={job}-launcher.{job}.default.svc.cluster.local:1," in line for line in log), log
        left = [f"{k}/{o['metadata']['name']}" for k in LEFT_KINDS for o in real_double.list_objects(k, "default")]
        assert left == []
    finally:
        controller.stop()


TASKFLOW_FUNCTION = [
    "def train(scale):\n",
    "    from mpi4py import MPI\n",
    "    comm = MPI.COMM_WORLD\n",
    "    return {'sum': comm.allreduce((comm.rank + 1) * scale), 'size': comm.size}\n",
]


def test_a_taskflow_function_runs_as_an_mpijob(real_double: KubeDouble, mount_points: None) -> None:
    """@task.mpi's command names no path: the runner is found in our config directory, which the
    MPIJob backend mounts off the controller's /etc/mpi."""
    from airflow_mpi.taskflow import FunctionCall, build_taskflow_files, function_source, runner_command

    controller = MPIJobController(real_double, cluster_domain="cluster.local")
    try:
        backend = MPIJobBackend(api_client=api_client_for(real_double), namespace="default")
        call = FunctionCall(function_source("train", TASKFLOW_FUNCTION, 1, "/dags/tf.py"), [10], {}, ["scale"])
        spec = MPIJobSpec.from_dict(
            {
                "name": "mjtf",
                "image": "registry.example/airflow-mpi-train:0.1",
                "command": runner_command(sys.executable),
                "files": build_taskflow_files(call),
                "workers": {"replicas": 1},
                "startup_timeout": 60,
                "timeout": 120,
            }
        )
        plan = backend.render_plan(spec, RunIdentity("mdag", "train", unique("tf")))
        assert plan.paths.config_dir != "/etc/mpi"
        log: list[str] = []
        result = JobRunner(backend, plan, log.append).run()
        assert result.exit_code == 0 and result.result == {"sum": 30, "size": 2}, log
    finally:
        controller.stop()
