"""The in-cluster Airflow deployment's manifests (deploy/airflow/, rendered by
tests/cluster/airflow.py): valid for the Kubernetes schema, the chart's layout, short-lived
projected tokens, no administrator credential, and the pages' own objects and commands."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.cluster import airflow
from tests.documented import documented_manifests

VALUES = airflow.Values(
    airflow_image="localhost/airflow-mpi-airflow:dev",
    postgres_image="localhost/airflow-mpi-postgres:15",
    train_image="localhost/airflow-mpi-train:dev",
    dags="/srv/dags",
    data_root="/var/tmp/cluster/airflow",
    admin_password="admin-secret",
    db_password="db-secret",
    fernet_key="ZmVybmV0LWtleS1mb3ItdGVzdHMtb25seS0zMmJ5dGU=",
    jwt_secret="jwt-secret",
    api_secret_key="api-secret",
)
OBJECTS = airflow.manifests(VALUES)


def by(kind: str, name: str) -> dict[str, Any]:
    found = [o for o in OBJECTS if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} objects"
    return found[0]


def pod_template() -> dict[str, Any]:
    return yaml.safe_load(by("ConfigMap", "airflow-pod-template")["data"]["pod_template.yaml"])


def airflow_pods() -> dict[str, dict[str, Any]]:
    """Every pod spec of the Airflow image, by its workload (the task pods' template included)."""
    pods = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in OBJECTS
        if o["kind"] in ("Deployment", "StatefulSet", "Job")
        and o["spec"]["template"]["spec"]["containers"][0]["image"] == VALUES.airflow_image
    }
    pods["task pod"] = pod_template()["spec"]
    return pods


@pytest.mark.parametrize("version", ["1.33.0"])
def test_every_object_passes_strict_schema(version: str) -> None:
    for obj in [*OBJECTS, pod_template()]:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_charts_components_each_under_its_own_service_account() -> None:
    accounts = {o["metadata"]["name"] for o in OBJECTS if o["kind"] == "ServiceAccount"}
    assert {"airflow-scheduler", "airflow-api-server", "airflow-dag-processor", "airflow-triggerer",
            "airflow-worker"} <= accounts  # fmt: skip
    assert all(o["automountServiceAccountToken"] is False for o in OBJECTS if o["kind"] == "ServiceAccount")
    pods = airflow_pods()
    assert {name: pod["serviceAccountName"] for name, pod in pods.items()} == {
        "airflow-api-server": "airflow-api-server",
        "airflow-scheduler": "airflow-scheduler",
        "airflow-dag-processor": "airflow-dag-processor",
        "airflow-triggerer": "airflow-triggerer",
        "airflow-migrate": "airflow-migrate",
        "airflow-connections": "airflow-worker",
        "task pod": "airflow-worker",
    }
    assert by("StatefulSet", "airflow-triggerer")["spec"]["replicas"] == 2
    env = by("ConfigMap", "airflow-env")["data"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "KubernetesExecutor"
    assert env["AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE"] == "airflow"
    assert (
        env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]
        == "http://airflow-api-server.airflow.svc.cluster.local:8080/execution/"
    )
    assert env["AIRFLOW__API__WORKERS"] == "1"


def test_each_pod_has_a_rotated_projected_token_and_no_other_credential() -> None:
    for name, pod in airflow_pods().items():
        assert pod["automountServiceAccountToken"] is False, name
        volumes = {v["name"]: v for v in pod["volumes"]}
        sources = volumes["kube-api-access"]["projected"]["sources"]
        assert sources[0] == {"serviceAccountToken": {"path": "token", "expirationSeconds": 600}}, name
        mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["/var/run/secrets/kubernetes.io/serviceaccount"]["name"] == "kube-api-access", name
        # The DAGs are the only host path, read-only; the only Secret is Airflow's own.
        assert [v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v] == ["/srv/dags"], name
        assert mounts["/opt/airflow/dags"]["readOnly"] is True, name
        secret_volumes = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
        assert set(secret_volumes) <= {"airflow-secrets"}, name
        for container in pod["containers"]:
            refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e}
            assert refs == {"airflow-secrets"}, name
            assert not any("KUBECONFIG" in e["name"] for e in container["env"]), name


def test_task_pods_get_the_data_claim_and_the_example_dags_settings() -> None:
    spec = pod_template()["spec"]
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v
    }
    assert claims[mounts["/data"]] == "training-data"
    assert claims[mounts["/opt/airflow/logs"]] == "airflow-logs"
    assert spec["containers"][0]["name"] == "base"
    env = by("ConfigMap", "airflow-env")["data"]
    assert {k: v for k, v in env.items() if k.startswith("MPI_DEMO_")} == {
        "MPI_DEMO_IMAGE": "localhost/airflow-mpi-train:dev",
        "MPI_DEMO_SCRIPT": "/app/train_digits.py",
        "MPI_DEMO_DATA": "/data",
        "MPI_DEMO_PVC": "training-data",
    }
    for name, pod in airflow_pods().items():
        assert pod["containers"][0]["envFrom"] == [{"configMapRef": {"name": "airflow-env"}}], name


def test_the_training_namespace_gets_the_pages_objects_as_written() -> None:
    for kind in ("Role", "RoleBinding"):
        assert [o for o in OBJECTS if o["kind"] == kind and o["metadata"]["namespace"] == "training"] == \
            documented_manifests(kind)  # fmt: skip
    bindings = {o["roleRef"]["name"]: o["subjects"] for o in OBJECTS if o["kind"] == "RoleBinding"
                and o["metadata"]["namespace"] == "training"}  # fmt: skip
    assert bindings == {
        "airflow-mpi-worker": [{"kind": "ServiceAccount", "name": "airflow-worker", "namespace": "airflow"}],
        "airflow-mpi-triggerer": [{"kind": "ServiceAccount", "name": "airflow-triggerer", "namespace": "airflow"}],
    }
    claims = [o for o in OBJECTS if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"] == "training-data"]
    claim = next(c for c in claims if c["metadata"]["namespace"] == "training")
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}}
    volume = by("PersistentVolume", "training-training-data")
    assert volume["spec"]["claimRef"] == {"namespace": "training", "name": "training-data"}
    assert volume["spec"]["accessModes"] == ["ReadWriteMany"]


def test_the_connections_are_made_by_the_walkthroughs_own_commands() -> None:
    script = by("ConfigMap", "airflow-walkthrough-connections")["data"]["connections.sh"]
    page = airflow.WALKTHROUGH_PAGE.read_text()
    assert script in page
    assert "airflow connections add kubernetes_default" in script
    assert "airflow connections add mpi_default" in script
    assert "airflow connections test mpi_default" in script


def test_a_page_naming_another_namespace_is_refused() -> None:
    rbac = airflow.RBAC_PAGE.read_text().replace("namespace: training}", "namespace: jobs}", 1)
    with pytest.raises(ValueError, match="is in 'jobs': the jobs run in 'training'"):
        airflow.render(VALUES, {}, rbac, airflow.WALKTHROUGH_PAGE.read_text())


def test_secrets_are_fresh_and_the_fernet_key_is_valid() -> None:
    from cryptography.fernet import Fernet

    first, second = airflow.generated_secrets(), airflow.generated_secrets()
    assert all(first[k] != second[k] for k in first)
    Fernet(first["fernet_key"].encode())  # raises on a malformed key
    secret = by("Secret", "airflow-secrets")["stringData"]
    assert secret["passwords.json"] == '{"admin": "admin-secret"}'
    assert "db-secret@airflow-postgres.airflow.svc.cluster.local:5432/airflow" in secret["sql-alchemy-conn"]
