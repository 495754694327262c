"""The real-cluster tier: the real kube-apiserver, kube-controller-manager, kube-scheduler and
etcd, built from upstream source (tests/cluster/build.py), with the node agent running the pods
for real. One cluster for the tests of this directory (package scope: its network bridge must not
outlive them, the other tiers' leak checks would see it).

Without the binaries the tier is skipped with one line saying how to build them; under CI (or
AIRFLOW_MPI_REQUIRE_CLUSTER=1) it is required and fails instead.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.cluster import Cluster, built
from tests.cluster.kubeapi import KubeApi

JOB_KINDS = ("pods", "services", "secrets", "configmaps")
HOW_TO_BUILD = (
    "the real-cluster tier needs kube-apiserver, kube-controller-manager, kube-scheduler and etcd built "
    "from source: run `make cluster-build` (Go and the Go module proxy; ~30 min once, cached in "
    "~/.cache/airflow-mpi/k8s)"
)


def _required() -> bool:
    return os.environ.get("CI") == "true" or os.environ.get("AIRFLOW_MPI_REQUIRE_CLUSTER") == "1"


@pytest.fixture(scope="package")
def cluster() -> Iterator[Cluster]:
    from airflow_mpi.backends.local import check_prerequisites
    from tests.leaks import ours

    missing = check_prerequisites()
    if not built() or missing:
        reason = HOW_TO_BUILD if not built() else "needs " + "; ".join(missing)
        if _required():
            pytest.fail(reason)
        pytest.skip(reason)
    root = Path("/var/tmp/airflow-mpi-tests")
    root.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="cluster-", dir=root)))
    cluster.start()
    try:
        yield cluster
        assert cluster.running_pods() == [], "pods still running on the node agent"
    finally:
        cluster.stop()
    assert not ours(), f"leaked: {ours()}"


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace of the test's own; after the test nothing of any job may be left in it."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.create_namespace(name)
    yield name
    left = job_objects(cluster.api(), name)
    cluster.delete_namespace(name, wait=0)  # the namespace controller finishes it in the background
    assert left == [], f"left in {name}: {left}"


def job_objects(api: KubeApi, namespace: str) -> list[str]:
    found = []
    for plural in JOB_KINDS:
        for obj in api.get(f"/api/v1/namespaces/{namespace}/{plural}")["items"]:
            if "airflow-mpi.io/job" in (obj["metadata"].get("labels") or {}):
                found.append(f"{plural}/{obj['metadata']['name']}")
    return found


CORE_LEFT = tuple(f"/api/v1/namespaces/{{ns}}/{plural}" for plural in JOB_KINDS)
# A rank that trains until it is stopped, saying so first (when to evict or time out).
TRAINS_FOREVER = "import time\nprint('training', flush=True)\ntime.sleep(600)\n"


def objects_left(api: KubeApi, namespace: str, paths: tuple[str, ...]) -> list[str]:
    """Whatever is still in ``namespace`` under each ``paths`` (``{ns}`` filled in), but the
    root CA ConfigMap every namespace gets."""
    return [
        f"{path.rsplit('/', 1)[-1]}/{obj['metadata']['name']}"
        for path in paths
        for obj in api.get(path.format(ns=namespace))["items"]
        if obj["metadata"]["name"] != "kube-root-ca.crt"
    ]


def run_evicting_a_worker(cluster: Any, namespace: str, backend: Any, plan: Any) -> tuple[Any, str]:
    """Run the job (its command: ``TRAINS_FOREVER``) and have the node evict worker 1 once it
    trains; the job's failure and the evicted pod's name."""
    from airflow_mpi.exceptions import JobFailed
    from airflow_mpi.runner.job import JobRunner

    log = Log()
    victim = f"{plan.job_name}-worker-1"
    thread = when_logged(log, "training", lambda: cluster.evict(namespace, victim))
    with pytest.raises(JobFailed) as caught:
        JobRunner(backend, plan, log).run()
    thread.join()
    return caught.value, victim


def api_client(kubeconfig: Path) -> Any:
    """A kubernetes client configured as the backend configures its own."""
    from kubernetes import client, config

    from airflow_mpi.backends.kubernetes import configure_client

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configure_client(configuration, 28))


def install_connections(monkeypatch: pytest.MonkeyPatch, kubeconfig: Path, namespace: str,
                        mpi_conn_id: str = "mpi_k8s", **extra: Any) -> None:  # fmt: skip
    """Airflow connections to the cluster: ``mpi_conn_id`` (mpi, kubernetes backend) ->
    ``kube_real`` (the cncf provider's kubernetes connection with the kubeconfig)."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_KUBE_REAL",
        json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig), "namespace": namespace}}),
    )
    extra = {"backend": "kubernetes", "kubernetes_conn_id": "kube_real", "namespace": namespace, **extra}
    monkeypatch.setenv(f"AIRFLOW_CONN_{mpi_conn_id.upper()}", json.dumps({"conn_type": "mpi", "extra": extra}))


class Log(list[str]):
    """A job's log records, line by line (what ``JobRunner`` emits)."""

    def __call__(self, text: str) -> None:
        self.extend(text.splitlines())


def when_logged(log: list[str], text: str, action: Callable[[], object], timeout: float = 90) -> threading.Thread:
    """Run ``action`` in a thread once a line of ``log`` contains ``text`` (or after ``timeout``)."""

    def wait_then_act() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not any(text in line for line in log):
            time.sleep(0.05)
        action()

    thread = threading.Thread(target=wait_then_act)
    thread.start()
    return thread
