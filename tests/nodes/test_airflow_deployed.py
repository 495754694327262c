"""Airflow deployed in the real cluster as users deploy it (tests/cluster/airflow.py): it is up,
its api-server logs the admin in with the generated password, every component has the provider,
the walkthrough's connections exist, and no pod holds a credential but its own projected,
short-lived ServiceAccount token."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

from tests.cluster.airflow import AirflowDeployment, api_token


def test_the_api_server_logs_the_admin_in(airflow: AirflowDeployment) -> None:
    token = airflow.token()
    request = urllib.request.Request(f"{airflow.url}/api/v2/version", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert json.loads(response.read())["version"].startswith("3.")
    with pytest.raises(urllib.error.HTTPError) as refused:
        api_token(airflow.url, airflow.user, airflow.password + "-wrong")
    assert refused.value.code == 401


def test_every_component_is_up_with_the_provider(airflow: AirflowDeployment) -> None:
    assert [len(airflow.pods(c)) for c in ("api-server", "scheduler", "dag-processor", "triggerer")] == [1, 1, 1, 2]
    code, output = airflow.exec("scheduler", ["airflow", "providers", "list"])
    assert code == 0, output
    assert "airflow-mpi" in output
    code, output = airflow.exec("api-server", ["airflow", "connections", "list", "-o", "json"])
    assert code == 0, output
    ids = {c["conn_id"] for c in json.loads(output[output.index("[") :])}
    assert {"kubernetes_default", "mpi_default"} <= ids


def _claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_each_component_holds_only_its_own_short_lived_token(airflow: AirflowDeployment) -> None:
    accounts = {"api-server": "airflow-api-server", "scheduler": "airflow-scheduler",
                "dag-processor": "airflow-dag-processor", "triggerer": "airflow-triggerer"}  # fmt: skip
    for component, account in accounts.items():
        code, token = airflow.exec(component, ["cat", "/var/run/secrets/kubernetes.io/serviceaccount/token"])
        assert code == 0, token
        claims = _claims(token.strip())
        assert claims["sub"] == f"system:serviceaccount:airflow:{account}", component
        # Issued for 10 minutes and not extended by the apiserver: the kubelet must rotate it.
        assert claims["exp"] - claims["iat"] == 600, component


def test_no_pod_mounts_an_administrator_credential(airflow: AirflowDeployment) -> None:
    pki = str(airflow.cluster.plane.pki_dir)
    pods = airflow.api().get(f"/api/v1/namespaces/{airflow.namespace}/pods")["items"]
    assert len(pods) >= 6
    for pod in pods:
        name, spec = pod["metadata"]["name"], pod["spec"]
        assert spec.get("automountServiceAccountToken") is False, name
        for volume in spec["volumes"]:
            if "hostPath" in volume:
                assert volume["hostPath"]["path"] == airflow.values.dags, (name, volume)
                assert not pki.startswith(volume["hostPath"]["path"].rstrip("/") + "/"), (name, volume)
            if "secret" in volume:
                assert volume["secret"]["secretName"] == "airflow-secrets", (name, volume)
            if "projected" in volume:
                tokens = [s for s in volume["projected"]["sources"] if "serviceAccountToken" in s]
                assert tokens == [{"serviceAccountToken": {"path": "token", "expirationSeconds": 600}}], name
                assert not any("secret" in s for s in volume["projected"]["sources"]), name
        for container in spec["containers"] + spec.get("initContainers", []):
            names = {e["name"] for e in container.get("env", [])}
            assert not names & {"KUBECONFIG", "KUBE_CONFIG"}, name
            refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", [])
                    if "secretKeyRef" in e.get("valueFrom", {})}  # fmt: skip
            assert refs <= {"airflow-secrets"}, name
