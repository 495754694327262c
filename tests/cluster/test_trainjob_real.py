"""The TrainJob backend with the real Kubeflow Trainer v2.3 controller manager and the real JobSet
controller (both built from their modules, run with their own CRDs and ClusterRoles): Trainer
turns the TrainJob and its runtime into a JobSet, JobSet makes one Indexed Job per role, the real
Job controller makes the pods, the real scheduler binds them and the node agent runs them; the
launch script finds the workers by JobSet's host names."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import JobFailed, JobTimeout
from airflow_mpi.runner.job import JobRunner
from tests.cluster.cluster import Cluster
from tests.cluster.conftest import (
    CORE_LEFT,
    TRAINS_FOREVER,
    Log,
    kill_task_once,
    objects_left,
    real_job,
    when_logged,
)

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

LEFT = (
    *CORE_LEFT,
    "/apis/batch/v1/namespaces/{ns}/jobs",
    "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets",
    "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs",
    "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainingruntimes",
)
PODGROUPS = "/apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups"


@pytest.fixture
def trainer(cluster: Cluster) -> Cluster:
    cluster.controller("trainer")
    return cluster


def left(cluster: Cluster, namespace: str) -> list[str]:
    return objects_left(cluster.api(), namespace, LEFT)


def make(cluster: Cluster, namespace: str, **fields: Any) -> tuple[KubernetesBackend, Any]:
    return real_job(cluster, namespace, "trainjob", **{"name": "tjreal", **fields})


@pytest.mark.parametrize("hosts_mode", ["host", "hostfile"])
def test_a_real_job_runs_as_a_trainjob(trainer: Cluster, namespace: str, hosts_mode: str) -> None:
    backend, plan = make(trainer, namespace, hosts_mode=hosts_mode)
    log = Log()
    result = JobRunner(backend, plan, log).run()
    job = plan.job_name
    assert result.exit_code == 0, log
    assert result.result == {
        "sum": 6,
        "size": 3,
        "hosts": sorted([f"{job}-master-0-0", f"{job}-worker-0-0", f"{job}-worker-0-1"]),
    }, log
    assert left(trainer, namespace) == []


def test_a_failing_rank_is_named(trainer: Cluster, namespace: str) -> None:
    program = "from mpi4py import MPI; import sys\nif MPI.COMM_WORLD.rank == 2: sys.exit(3)\nMPI.COMM_WORLD.Barrier()\n"
    backend, plan = make(trainer, namespace, command=[sys.executable, "-m", "mpi4py", "-c", program])
    log = Log()
    with pytest.raises(JobFailed) as caught:
        JobRunner(backend, plan, log).run()
    assert (caught.value.rank, caught.value.exit_code) == (2, 3), log
    assert left(trainer, namespace) == []


def test_an_evicted_worker_ends_the_job_and_is_named(trainer: Cluster, namespace: str) -> None:
    """The worker's pod is JobSet's (``<host>-<random>``): the failure names it by its host name,
    the plan's, with the pod's own name in the message."""
    backend, plan = make(trainer, namespace, command=[sys.executable, "-c", TRAINS_FOREVER])
    victim = plan.workers[1].name
    api = trainer.api()

    def evict() -> None:
        pods = api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        (pod,) = [p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith(f"{victim}-")]
        trainer.evict(namespace, pod)

    log = Log()
    thread = when_logged(log, "training", evict)
    with pytest.raises(JobFailed) as caught:
        JobRunner(backend, plan, log).run()
    thread.join()
    assert caught.value.pod == victim and "Evicted" in str(caught.value), caught.value
    assert left(trainer, namespace) == []


def test_the_timeout_ends_the_job(trainer: Cluster, namespace: str) -> None:
    program = "import time\nprint('forever', flush=True)\ntime.sleep(600)\n"
    backend, plan = make(trainer, namespace, command=[sys.executable, "-c", program], timeout=5)
    started = time.monotonic()
    with pytest.raises(JobTimeout):
        JobRunner(backend, plan, Log()).run()
    assert time.monotonic() - started < 5 + 40
    assert left(trainer, namespace) == []


KILLED_SPEC = {"name": "tjkill", "image": "registry.example/airflow-mpi-train:0.1",
               "command": [sys.executable, "-c", TRAINS_FOREVER], "workers": {"replicas": 2},
               "startup_timeout": 90, "timeout": 600}  # fmt: skip


def running_pods(cluster: Cluster, namespace: str) -> list[str]:
    pods = cluster.api().get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    return [p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Running"]


def test_a_killed_waiting_task_deletes_the_trainjob_and_everything_it_made(
    trainer: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.cluster.conftest import install_connections

    install_connections(monkeypatch, trainer.kubeconfig, namespace, mpi_conn_id="mpi_trainjob", backend="trainjob")
    code, output = kill_task_once(KILLED_SPEC, "mpi_trainjob", lambda: len(running_pods(trainer, namespace)) == 3)
    assert code == 143, output[-3000:]
    assert left(trainer, namespace) == [], output[-3000:]


def test_a_killed_deferred_task_deletes_the_trainjob_and_everything_it_made(
    trainer: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task was killed while deferred: Airflow calls the trigger's on_kill, which deletes the
    TrainJob and its runtime; the garbage collector takes the JobSet, its Jobs and pods, and our
    Secret and ConfigMap."""
    import asyncio
    from types import SimpleNamespace

    from airflow.sdk.exceptions import TaskDeferred

    from airflow_mpi.operators.mpi import MPIJobOperator
    from tests.cluster.conftest import install_connections
    from tests.cluster.controlplane import wait_for

    install_connections(monkeypatch, trainer.kubeconfig, namespace, mpi_conn_id="mpi_trainjob", backend="trainjob")
    operator = MPIJobOperator(task_id="train", job=KILLED_SPEC, mpi_conn_id="mpi_trainjob", deferrable=True)
    ti = SimpleNamespace(dag_id="tjdag", task_id="train", run_id=f"run-{time.monotonic_ns()}", map_index=-1,
                         try_number=1)  # fmt: skip
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute({"ti": ti})  # type: ignore[arg-type]
    trigger = deferred.value.trigger
    wait_for("the job's three pods running", lambda: len(running_pods(trainer, namespace)) == 3, 120)
    asyncio.run(trigger.on_kill())
    wait_for("nothing of the job left", lambda: left(trainer, namespace) == [], 90)


def test_a_volcano_gang_is_the_runtimes_pod_group_policy_under_real_volcano(trainer: Cluster, namespace: str) -> None:
    """``gang: volcano``: Trainer makes the PodGroup of all 1 + N pods from the runtime's
    ``podGroupPolicy``, the real vc-scheduler binds the pods once the whole group fits."""
    from tests.cluster.controlplane import wait_for

    trainer.controller("volcano")
    api = trainer.api()
    groups: list[dict[str, Any]] = []

    def look() -> None:
        groups.extend(api.get(f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{namespace}/podgroups")["items"])

    backend, plan = make(trainer, namespace, scheduling={"gang": "volcano"})
    log = Log()
    thread = when_logged(log, "starting mpiexec", look)
    result = JobRunner(backend, plan, log).run()
    thread.join()
    assert result.exit_code == 0 and result.result["size"] == 3, log
    (group,) = groups
    assert group["metadata"]["name"] == plan.job_name and group["spec"]["minMember"] == 3, group
    assert left(trainer, namespace) == []
    # Trainer's PodGroup is the TrainJob's: the garbage collector takes it after it.
    wait_for("the PodGroup gone", lambda: objects_left(api, namespace, (PODGROUPS,)) == [], 30)
