"""The example DAG as a user runs it on a cluster: the image built from docker/Dockerfile, its
training script at /app/train_digits.py, preprocess -> 3-rank DeepSpeed -> evaluate, with the ranks
in containers on three real Nodes. And ``airflow-mpi doctor --image`` on those Nodes: the built
image passes; the bare Debian base is told what it lacks."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.airflow_helpers import task_states, xcom
from tests.cluster.cluster import REPO, Cluster
from tests.cluster.conftest import api_client, install_connections, job_objects
from tests.cluster.image import BASE_IMAGE, TRAIN_IMAGE

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


@pytest.fixture
def demo_data(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The example's data directory, a hostPath every Node (all on this machine) mounts."""
    data = Path("/var/tmp/airflow-mpi-tests") / f"demo-{uuid.uuid4().hex[:8]}"
    data.mkdir(parents=True)
    monkeypatch.setenv("MPI_DEMO_IMAGE", TRAIN_IMAGE)
    monkeypatch.setenv("MPI_DEMO_SCRIPT", "/app/train_digits.py")  # the image's copy (docker/Dockerfile)
    monkeypatch.setenv("MPI_DEMO_DATA", str(data))
    yield data
    shutil.rmtree(data, ignore_errors=True)


def example_dag(dag_id: str) -> Any:
    """The example DAG parsed now, under the environment the test set (the session's DagBag was
    parsed before it)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert not bag.import_errors, bag.import_errors
    return bag.get_dag(dag_id)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "dag_id", "deferrable"),
    [
        ("kubernetes", "mpi_training_pipeline", False),
        ("mpijob", "mpi_training_pipeline", False),
        ("volcano", "mpi_training_pipeline", False),
        ("trainjob", "mpi_training_pipeline", False),
        ("kubernetes", "mpi_training_pipeline", True),
        ("trainjob", "mpi_training_pipeline", True),
        ("kubernetes", "mpi_training_taskflow", False),
    ],
    ids=["pods", "mpijob", "volcano", "trainjob", "pods-deferred", "trainjob-deferred", "taskflow"],
)
def test_the_example_dag_trains_in_the_built_image_on_three_nodes(
    airflow_db: None,
    cluster: Cluster,
    namespace: str,
    demo_data: Path,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    dag_id: str,
    deferrable: bool,
) -> None:
    """Through the real mpi-operator, real Volcano and the real Trainer with JobSet as well: their
    controllers make the pods, the real kubelets run them."""
    if backend != "kubernetes":  # the plain pods backend
        cluster.controller({"mpijob": "mpi-operator", "volcano": "volcano", "trainjob": "trainer"}[backend])
    if deferrable:
        monkeypatch.setenv("MPI_DEMO_DEFERRABLE", "1")
    install_connections(monkeypatch, cluster.kubeconfig, namespace, mpi_conn_id="mpi_default", backend=backend)
    dag_run = example_dag(dag_id).test()
    assert set(task_states(dag_run).values()) == {"success"}, task_states(dag_run)
    assert xcom(dag_run, "evaluate") >= 0.85  # the bar the local backend's run meets too
    assert job_objects(cluster.api(), namespace) == []


def test_doctor_passes_the_built_image_and_names_what_the_base_lacks(cluster: Cluster, namespace: str) -> None:
    from kubernetes import client

    from airflow_mpi.doctor.run import run_image_doctor

    core = client.CoreV1Api(api_client(cluster.kubeconfig))
    good = run_image_doctor(core, TRAIN_IMAGE, namespace, timeout=120)
    assert good.ok, "\n".join(good.output)
    bare = run_image_doctor(core, BASE_IMAGE, namespace, timeout=120)
    assert not bare.ok
    failed = " ".join(f"{r.check}: {r.detail}" for r in bare.results if r.failed)
    assert "sshd" in failed and "mpiexec" in failed, "\n".join(bare.output)
