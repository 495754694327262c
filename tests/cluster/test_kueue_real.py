"""The product's Kueue paths with the real Kueue (built from its module, run with its own CRDs,
ClusterRole and webhooks): a plain-pod group (``gang: kueue``), an MPIJob (Kueue's MPIJob
integration) and a TrainJob (its TrainJob integration, with the real Trainer and JobSet) wait in
a LocalQueue whose ClusterQueue has no quota, start when the quota is
raised, and fail on ``scheduling.queue_timeout`` while held; nothing of theirs is left, Kueue's
Workload included."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import JobFailed, JobTimeout
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import MPIJobSpec
from tests.cluster.cluster import Cluster
from tests.cluster.conftest import CORE_LEFT, Log, api_client, objects_left, when_logged
from tests.cluster.controlplane import wait_for
from tests.cluster.kubeapi import KubeApi, Obj

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
QUEUE = "training"
WORKERS = 2  # + the master: 3 pods of 1 CPU each
LEFT = (*CORE_LEFT, "/apis/batch/v1/namespaces/{ns}/jobs", "/apis/kubeflow.org/v2beta1/namespaces/{ns}/mpijobs",
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs",
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainingruntimes",
        "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets",
        KUEUE + "/namespaces/{ns}/workloads")  # fmt: skip
PROGRAM = (
    "from mpi4py import MPI; import json; c = MPI.COMM_WORLD; s = c.allreduce(c.rank + 1)\n"
    "if c.rank == 0: print('AIRFLOW_MPI_RESULT ' + json.dumps({'sum': s, 'size': c.size}))"
)
WAITS = "waits for admission"


# The controllers' kinds Kueue queues by their label: the controller to start, the top object's
# path, whether Kueue's webhook suspended it, how the kind says it waits.
QUEUED_KINDS = {
    "mpijob": ("mpi-operator", "/apis/kubeflow.org/v2beta1/namespaces/{ns}/mpijobs/{name}",
               lambda top: top["spec"]["runPolicy"]["suspend"], "MPIJob"),
    "trainjob": ("trainer", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}",
                 lambda top: top["spec"]["suspend"], "TrainJob"),
}  # fmt: skip


class Queues:
    """A ResourceFlavor and a ClusterQueue named after the test's namespace (cluster-scoped) and
    the LocalQueue ``training`` in it; the ClusterQueue's CPU quota starts at ``cpu``."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self.api, self.namespace, self.name = api, namespace, namespace

    def resource_groups(self, cpu: str) -> list[Obj]:
        resources = [{"name": "cpu", "nominalQuota": cpu}, {"name": "memory", "nominalQuota": "64Gi"}]
        return [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": self.name, "resources": resources}]}]

    def create(self, cpu: str) -> None:
        meta = {"name": self.name}
        self.api.create(f"{KUEUE}/resourceflavors", {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                                                     "metadata": meta})  # fmt: skip
        self.api.create(f"{KUEUE}/clusterqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": meta,
            "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
                     "resourceGroups": self.resource_groups(cpu)}})  # fmt: skip
        self.api.create(f"{KUEUE}/namespaces/{self.namespace}/localqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": QUEUE},
            "spec": {"clusterQueue": self.name}})  # fmt: skip
        for path in (f"{KUEUE}/clusterqueues/{self.name}", f"{KUEUE}/namespaces/{self.namespace}/localqueues/{QUEUE}"):
            self.api.wait(f"{path} active", lambda path=path: condition(self.api.get(path), "Active") == "True", 30)

    def set_cpu(self, cpu: str) -> None:
        self.api.patch(f"{KUEUE}/clusterqueues/{self.name}", {"spec": {"resourceGroups": self.resource_groups(cpu)}},
                       kind="merge-patch")  # fmt: skip

    def delete(self) -> None:
        paths = (f"{KUEUE}/namespaces/{self.namespace}/localqueues/{QUEUE}", f"{KUEUE}/clusterqueues/{self.name}",
                 f"{KUEUE}/resourceflavors/{self.name}")  # fmt: skip
        for path in paths:  # each in turn: Kueue keeps a finalizer on what is still in use
            self.api.delete(path)
            self.api.wait(f"{path} deleted", lambda path=path: self.api.get_or_none(path) is None, 60)


@pytest.fixture
def queues(cluster: Cluster, namespace: str) -> Iterator[Queues]:
    cluster.controller("kueue")
    queues = Queues(cluster.api(), namespace)
    queues.create(cpu="0")
    yield queues
    queues.delete()


@pytest.fixture(params=list(QUEUED_KINDS))
def queued_kind(request: pytest.FixtureRequest, cluster: Cluster) -> str:
    """Each controller's kind Kueue integrates, with its controller running."""
    cluster.controller(QUEUED_KINDS[request.param][0])
    return str(request.param)


def condition(obj: Obj | None, kind: str) -> str | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return None


def left(api: KubeApi, namespace: str) -> list[str]:
    return objects_left(api, namespace, LEFT)


def workloads(api: KubeApi, namespace: str) -> list[Obj]:
    return list(api.get(f"{KUEUE}/namespaces/{namespace}/workloads")["items"])


@contextlib.contextmanager
def workloads_seen(api: KubeApi, namespace: str) -> Iterator[set[str]]:
    """The names of the Workloads Kueue made in ``namespace`` while the block runs (polled)."""
    seen: set[str] = set()
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            with contextlib.suppress(Exception):
                seen.update(w["metadata"]["name"] for w in workloads(api, namespace))
            done.wait(0.2)

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join()


def pods(api: KubeApi, namespace: str) -> list[Obj]:
    return list(api.get(f"/api/v1/namespaces/{namespace}/pods")["items"])


def spec_data(**fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "kqreal",
        "image": "registry.example/airflow-mpi-train:0.1",
        "command": [sys.executable, "-c", PROGRAM],
        "workers": {"replicas": WORKERS},
        "startup_timeout": 90,
        "timeout": 120,
    }
    data.update(fields)
    return data


def make(backend: Any, **fields: Any) -> tuple[Any, Any]:
    spec, identity = MPIJobSpec.from_dict(spec_data(**fields)), RunIdentity("kdag", "train", f"r-{time.monotonic_ns()}")
    plan = backend.render_plan(spec, identity)
    return backend, plan


def pods_backend(cluster: Cluster, namespace: str, **fields: Any) -> tuple[KubernetesBackend, Any]:
    return make(KubernetesBackend(api_client=api_client(cluster.kubeconfig), namespace=namespace), **fields)


def kind_backend(cluster: Cluster, namespace: str, kind: str, **fields: Any) -> tuple[KubernetesBackend, Any]:
    return make(KubernetesBackend(kind=kind, api_client=api_client(cluster.kubeconfig), namespace=namespace), **fields)


def raise_quota_once_held(queues: Queues, look: Callable[[], dict[str, Any]]) -> Callable[[], None]:
    """Once the job says it waits: check it is still held a while later (``look`` records what
    Kueue did), then give the ClusterQueue room for it."""
    seen: dict[str, Any] = {}

    def act() -> None:
        time.sleep(2)
        seen.update(look())
        queues.set_cpu("4")

    act.seen = seen  # type: ignore[attr-defined]
    return act


def test_a_pod_group_waits_for_quota_then_runs(cluster: Cluster, namespace: str, queues: Queues) -> None:
    api = cluster.api()
    backend, plan = pods_backend(cluster, namespace, scheduling={"gang": "kueue", "queue": QUEUE})

    def look() -> dict[str, Any]:
        return {"workloads": workloads(api, namespace), "pods": pods(api, namespace)}

    act = raise_quota_once_held(queues, look)
    log = Log()
    thread = when_logged(log, WAITS, act)
    result = JobRunner(backend, plan, log).run()
    thread.join()
    seen = act.seen  # type: ignore[attr-defined]
    assert result.exit_code == 0 and result.result == {"sum": 6, "size": WORKERS + 1}, log
    assert any(WAITS in line and "scheduling gates" in line for line in log), log
    # Held by Kueue: every pod gated, one Workload named after the group, with no quota reserved.
    assert len(seen["pods"]) == WORKERS + 1, seen["pods"]
    for pod in seen["pods"]:
        assert {"name": "kueue.x-k8s.io/admission"} in pod["spec"].get("schedulingGates", []), pod["metadata"]["name"]
    (workload,) = seen["workloads"]
    assert workload["metadata"]["name"] == plan.job_name
    assert condition(workload, "QuotaReserved") != "True" and condition(workload, "Admitted") != "True", workload
    assert left(api, namespace) == []


def test_a_pod_group_past_queue_timeout_fails(cluster: Cluster, namespace: str, queues: Queues) -> None:
    api = cluster.api()
    backend, plan = pods_backend(cluster, namespace, scheduling={"gang": "kueue", "queue": QUEUE, "queue_timeout": 5})
    log = Log()
    started = time.monotonic()
    with workloads_seen(api, namespace) as seen, pytest.raises(JobTimeout, match="queue_timeout") as caught:
        JobRunner(backend, plan, log).run()
    assert time.monotonic() - started < 5 + 40
    assert plan.job_name in str(caught.value) and any(WAITS in line for line in log), log
    assert seen == {plan.job_name}  # Kueue held the group in its Workload, which is gone too
    assert left(api, namespace) == []


def test_a_failing_rank_in_an_admitted_pod_group_is_named(cluster: Cluster, namespace: str, queues: Queues) -> None:
    """A failed member ends the group (``retriable-in-group: false``): Kueue lets go of its pods
    once the product deletes the Workload."""
    queues.set_cpu("4")
    program = "from mpi4py import MPI; import sys\nif MPI.COMM_WORLD.rank == 2: sys.exit(3)\nMPI.COMM_WORLD.Barrier()\n"
    backend, plan = pods_backend(
        cluster,
        namespace,
        scheduling={"gang": "kueue", "queue": QUEUE},
        command=[sys.executable, "-m", "mpi4py", "-c", program],
    )
    log = Log()
    with pytest.raises(JobFailed) as caught:
        JobRunner(backend, plan, log).run()
    assert (caught.value.rank, caught.value.exit_code) == (2, 3), log
    assert left(cluster.api(), namespace) == []


def test_a_controllers_job_waits_for_quota_then_runs(
    cluster: Cluster, namespace: str, queues: Queues, queued_kind: str
) -> None:
    _, path, suspended_by_kueue, label = QUEUED_KINDS[queued_kind]
    api = cluster.api()
    backend, plan = kind_backend(cluster, namespace, queued_kind, scheduling={"queue": QUEUE})

    def look() -> dict[str, Any]:
        top = api.get(path.format(ns=namespace, name=plan.job_name))
        return {"top": top, "workloads": workloads(api, namespace), "pods": pods(api, namespace)}

    act = raise_quota_once_held(queues, look)
    log = Log()
    suspended = f"queued: {label} suspended in queue '{QUEUE}' until it is admitted"
    thread = when_logged(log, suspended, act)
    result = JobRunner(backend, plan, log).run()
    thread.join()
    seen = act.seen  # type: ignore[attr-defined]
    assert result.exit_code == 0 and result.result == {"sum": 6, "size": WORKERS + 1}, log
    assert any(WAITS in line and suspended in line for line in log), log
    # Held by Kueue: the top object suspended by its webhook, no pods, its Workload without quota.
    assert suspended_by_kueue(seen["top"]) is True, seen["top"]
    assert seen["pods"] == []
    (workload,) = seen["workloads"]
    assert workload["metadata"]["ownerReferences"][0]["name"] == plan.job_name
    assert condition(workload, "QuotaReserved") != "True" and condition(workload, "Admitted") != "True", workload
    # Kueue may make the top object's Workload again while the top object is being deleted; the
    # garbage collector takes that one once the top object is gone.
    wait_for("nothing of the job left", lambda: left(api, namespace) == [], 30)


def test_a_controllers_job_past_queue_timeout_fails(
    cluster: Cluster, namespace: str, queues: Queues, queued_kind: str
) -> None:
    api = cluster.api()
    backend, plan = kind_backend(cluster, namespace, queued_kind, scheduling={"queue": QUEUE, "queue_timeout": 5})
    log = Log()
    started = time.monotonic()
    with workloads_seen(api, namespace) as seen, pytest.raises(JobTimeout, match="queue_timeout") as caught:
        JobRunner(backend, plan, log).run()
    assert time.monotonic() - started < 5 + 40
    assert plan.job_name in str(caught.value) and any(WAITS in line for line in log), log
    # Kueue held it in a Workload of its own (named after the top object), which is gone too.
    assert len(seen) == 1 and next(iter(seen)).startswith(f"{queued_kind}-{plan.job_name}-"), seen
    assert left(api, namespace) == []
