"""The real-node tier: the real control plane (tests/cluster) with 3 real Nodes, each a kubelet
with its own containerd and runc (tests/cluster/nodes.py), kube-proxy and CoreDNS, running pods
of the training image built from docker/Dockerfile (tests/cluster/image.py, `make image`).
Nothing here is judged by code of ours between ``execute()`` and a rank's process.

Without the node binaries or the images the tier is skipped with one line saying how to make
them; under CI (or AIRFLOW_MPI_REQUIRE_CLUSTER=1) it fails instead.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.airflow import AirflowDeployment
from tests.cluster.cluster import REPO, Cluster, built
from tests.cluster.conftest import _required, job_objects
from tests.cluster.controlplane import wait_for

HOW_TO_BUILD = (
    "the real-node tier needs the node binaries (`make cluster-build`: kubelet, containerd, CNI plugins, "
    "CoreDNS, crictl; Debian's runc) and the images (`make image`: buildah and mmdebstrap)"
)


def node_images() -> list[Path] | None:
    """The archives of the pause, base and training images, or None where one is not built."""
    from tests.cluster import image

    archives = image.cached_archives()
    return list(archives.values()) if archives else None


@pytest.fixture(scope="package")
def cluster() -> Iterator[Cluster]:
    from tests.cluster.nodes import host_state, node_tools_built
    from tests.leaks import node_processes

    images = node_images()
    if not (built() and node_tools_built() and images):
        if _required():
            pytest.fail(HOW_TO_BUILD)
        pytest.skip(HOW_TO_BUILD)
    before = host_state()
    root = Path("/var/tmp/airflow-mpi-tests")
    root.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="nodes-", dir=root)), images=images)
    cluster.start()
    try:
        yield cluster
        assert cluster.real is not None
        # The kubelets' own garbage collection empties each runtime of deleted pods' sandboxes
        # and containers (every minute): nothing of any job may stay in a Node's runtime.
        wait_for("every Node's runtime empty", lambda: cluster.real.runtime_objects() == [], 150)
    finally:
        cluster.stop()
    after = host_state()
    assert {k: v for k, v in after.items() if before[k] != v} == {}, "the Nodes left something on the host"
    assert not node_processes(), f"leaked in a Node's containers: {node_processes()}"


@pytest.fixture(scope="package")
def airflow(cluster: Cluster) -> Iterator[AirflowDeployment]:
    """Airflow deployed in the cluster as users deploy it (tests/cluster/airflow.py), its DAGs
    folder the repository's dags/ with the tier's own DAGs (tests/nodes/dags/) in a subfolder;
    removed at the end, nothing of it left behind."""
    from tests.cluster import airflow as deployment
    from tests.cluster import image

    if not image.airflow_archives():
        how = "the in-cluster Airflow needs its images: `make airflow-image`"
        if _required():
            pytest.fail(how)
        pytest.skip(how)
    dags = Path(tempfile.mkdtemp(prefix="dags-", dir="/var/tmp/airflow-mpi-tests"))
    dags.chmod(0o755)  # the Airflow image's user reads it
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "dags", dags, dirs_exist_ok=True, ignore=skip)
    shutil.copytree(REPO / "tests" / "nodes" / "dags", dags / "tier", ignore=skip)
    try:
        deployed = deployment.deploy(cluster, dags)
        try:
            yield deployed
        finally:
            deployment.undeploy(deployed)
    finally:
        shutil.rmtree(dags, ignore_errors=True)
    with contextlib.suppress(TimeoutError):  # the assertion below says what is left
        wait_for("Airflow's pods stopped on every Node", lambda: not pods_of(cluster, deployed.namespace), 60)
    assert not pods_of(cluster, deployed.namespace), f"Airflow's pods still up: {pods_of(cluster, deployed.namespace)}"


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace of the test's own; after the test nothing of any job may be left in it, and no
    pod sandbox of it in any Node's runtime."""
    name = f"n-{uuid.uuid4().hex[:8]}"
    cluster.create_namespace(name)
    yield name
    with contextlib.suppress(TimeoutError):  # the assertion below says what is left
        wait_for(f"{name}'s pods stopped on every Node", lambda: not pods_of(cluster, name), 60)
    assert not pods_of(cluster, name), f"pod sandboxes of {name} still up: {pods_of(cluster, name)}"
    left = job_objects(cluster.api(), name)
    cluster.delete_namespace(name, wait=0)
    assert left == [], f"left in {name}: {left}"


def pods_of(cluster: Cluster, namespace: str) -> list[str]:
    """The pod sandboxes of ``namespace`` still up on any Node."""
    return [pod for pod in cluster.running_pods() if pod.startswith(f"{namespace}/")]
