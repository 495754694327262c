"""The getting-started DAG's Kubernetes variant on the real control plane, with the changes the
Kubernetes walkthrough names: its data on a PersistentVolumeClaim (bound by the real
controller-manager to a hostPath PersistentVolume) that the Airflow worker and every pod mount at
the same path, and ``mpi_default`` pointing at the cluster. The script is the checkout's (the
node agent runs pods as the host's processes, not images: the image's own copy at
``/app/train_digits.py`` needs real nodes). Preprocess, 3-rank DeepSpeed, evaluate; nothing left."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.airflow_helpers import task_states, xcom
from tests.cluster.cluster import REPO, Cluster
from tests.cluster.conftest import install_connections, job_objects
from tests.dags.test_docs_dag import dag_block, saved_in_the_dags_folder

pytestmark = [pytest.mark.cluster, pytest.mark.integration, pytest.mark.slow]
CLAIM = "training-data"


def kubernetes_variant(source: str, data: Path) -> str:
    """The walkthrough's changes: DATA on the claim's mount, and the claim as the job's volume."""
    assert 'DATA = "/var/tmp/digits"' in source and '"timeout": 3600,' in source
    source = source.replace('DATA = "/var/tmp/digits"', f'DATA = "{data}"', 1)
    volume = f'{{"name": "data", "persistent_volume_claim": "{CLAIM}", "mount_path": DATA}}'
    return source.replace('"timeout": 3600,', f'"timeout": 3600,\n            "pod": {{"volumes": [{volume}]}},', 1)


@pytest.fixture
def claim(cluster: Cluster, namespace: str) -> Iterator[Path]:
    """A hostPath PersistentVolume and a claim on it in the test's namespace; the directory."""
    api = cluster.api()
    name = f"docs-{namespace}"
    data = Path("/var/tmp/airflow-mpi-tests") / name
    data.mkdir(parents=True, exist_ok=True)
    api.create("/api/v1/persistentvolumes", {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(data)}},
    })  # fmt: skip
    api.create(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": name,
                 "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{CLAIM}"
    api.wait("the claim bound", lambda: api.get(path)["status"].get("phase") == "Bound", 60)
    yield data
    api.delete(path)
    api.delete(f"/api/v1/persistentvolumes/{name}")
    shutil.rmtree(data, ignore_errors=True)


def test_the_documented_dag_trains_on_kubernetes_with_its_data_on_a_claim(
    airflow_db: None, cluster: Cluster, namespace: str, claim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    install_connections(monkeypatch, cluster.kubeconfig, namespace, mpi_conn_id="mpi_default")
    source = kubernetes_variant(dag_block(REPO / "README.md", "## A DAG"), claim)
    with saved_in_the_dags_folder(source) as dag_file:
        bag = DagBag(dag_folder=str(dag_file))
        assert not bag.import_errors, bag.import_errors
        dag_run: Any = bag.get_dag("digits").test()
        assert task_states(dag_run) == {"preprocess": "success", "train": "success", "evaluate": "success"}
        assert xcom(dag_run, "evaluate") >= 0.85
        assert (Path(xcom(dag_run, "preprocess")) / "model.pt").is_file()  # rank 0 wrote it through the claim
        assert job_objects(cluster.api(), namespace) == []
