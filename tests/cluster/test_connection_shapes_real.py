"""Both waits read a ``kubernetes`` connection the same way (``backends.kube_connection``),
against the real kube-apiserver, for each shape a connection takes: a kubeconfig path, a
kubeconfig in the extras, a context chosen in it, a server certificate signed by a CA the
kubeconfig does not hold with ``disable_verify_ssl`` (works) and without it (fails at once, both
ways, naming the fix; a waiting job creates nothing), and ``disable_tcp_keepalive``. Each shape
runs in a process of its own, as each Airflow task does: the waiting path's client (the cncf
provider's ``KubernetesHook``, fed the reading) and the deferred path's (``kubernetes_asyncio``)
each ask the server who they are and list pods; the test compares what each saw and how each
socket to the server was set. The ServiceAccount shape (``in_cluster``, and no connection at
all) is ``test_incluster_real``'s, in a pod's mount namespace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from tests.cluster.cluster import Cluster
from tests.cluster.pki import PKI

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

# Run with the connection ``kube_shape`` set; argv: the API server's port, the namespace. Prints
# one JSON line: for each path, who the server says the client is (or the error and how long it
# took), and SO_KEEPALIVE on each socket the client opened to the server.
PROBE = """
import asyncio, json, os, socket, sys, time
port, namespace = int(sys.argv[1]), sys.argv[2]

def api_sockets():
    found = {}
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.getpeername()[1] == port:
                found[fd] = bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE))
        except OSError:
            pass
        finally:
            sock.close()
    return found

def seen(before, ask):
    started = time.monotonic()
    try:
        answer = {"user": ask()}
    except Exception as error:
        from airflow_mpi.backends.k8s_errors import ApiRequest, explain, is_refusal
        answer = {"error": explain(error, ApiRequest("list", "pods", namespace)), "refusal": is_refusal(error)}
    answer["seconds"] = round(time.monotonic() - started, 2)
    answer["keepalive"] = sorted(set(v for fd, v in api_sockets().items() if fd not in before))
    return answer

def waiting():
    from airflow_mpi.backends.kubernetes import KubernetesBackend
    backend = KubernetesBackend(kubernetes_conn_id="kube_shape")
    backend.objects.core  # the client, loaded: what is timed is the requests
    def ask():
        backend.objects.core.list_namespaced_pod(namespace, _request_timeout=(5, 10))
        return backend.objects.whoami()
    return seen(set(api_sockets()), ask)

async def deferred():
    from kubernetes_asyncio.client import CoreV1Api
    from airflow_mpi.triggers.api_client import import_client, shared_api_client
    from airflow_mpi.triggers.rules_review import _whoami
    before = set(api_sockets())
    await import_client()
    async def ask():
        async with shared_api_client("kube_shape") as client:
            await CoreV1Api(client).list_namespaced_pod(namespace, _request_timeout=(5, 10))
            user = await _whoami(client, 10)
            return user, {fd: v for fd, v in api_sockets().items() if fd not in before}
    started = time.monotonic()
    try:
        user, sockets = await ask()
        answer = {"user": user, "keepalive": sorted(set(sockets.values()))}
    except Exception as error:
        from airflow_mpi.backends.k8s_errors import ApiRequest, explain, is_refusal
        answer = {"error": explain(error, ApiRequest("list", "pods", namespace)), "refusal": is_refusal(error),
                  "keepalive": []}
    answer["seconds"] = round(time.monotonic() - started, 2)
    return answer

print("SEEN " + json.dumps({"waiting": waiting(), "deferred": asyncio.run(deferred())}), flush=True)
"""

ADMIN = "airflow-mpi-admin"  # the user name the cluster's admin certificate carries


def admin_kubeconfig(cluster: Cluster) -> dict[str, Any]:
    return dict(yaml.safe_load(cluster.kubeconfig.read_text()))


def with_context_elsewhere(config: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``config`` plus a cluster nobody listens on, made the current context; the real context's name."""
    real = config["current-context"]
    config = json.loads(json.dumps(config))
    config["clusters"].append({"name": "nowhere", "cluster": {"server": "https://127.0.0.1:9"}})
    config["contexts"].append(
        {"name": "nowhere", "context": {"cluster": "nowhere", "user": config["users"][0]["name"]}}
    )
    config["current-context"] = "nowhere"
    return config, real


def with_other_ca(config: dict[str, Any], root: Path) -> dict[str, Any]:
    """``config`` trusting another CA than the one that signed the API server's certificate."""
    config = json.loads(json.dumps(config))
    other = PKI(root / "other-ca")
    for entry in config["clusters"]:
        entry["cluster"].pop("certificate-authority-data", None)
        entry["cluster"]["certificate-authority"] = str(other.ca.cert)
    return config


def probe(cluster: Cluster, namespace: str, extras: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "AIRFLOW_CONN_KUBE_SHAPE": json.dumps({"conn_type": "kubernetes", "extra": extras})}
    env.pop("KUBECONFIG", None)
    port = urlparse(admin_kubeconfig(cluster)["clusters"][0]["cluster"]["server"]).port
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(port), namespace],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("SEEN ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    return dict(json.loads(lines[-1].removeprefix("SEEN ")))


def test_each_working_shape_is_read_alike_by_both_waits(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    config = admin_kubeconfig(cluster)
    elsewhere, real_context = with_context_elsewhere(config)
    shapes = {
        "kube_config_path": {"kube_config_path": str(cluster.kubeconfig)},
        "kube_config": {"kube_config": json.dumps(config)},
        "cluster_context": {"kube_config": yaml.safe_dump(elsewhere), "cluster_context": real_context},
        "other CA, verification off": {
            "kube_config": json.dumps(with_other_ca(config, tmp_path)),
            "disable_verify_ssl": True,
        },
        "keepalive off": {"kube_config_path": str(cluster.kubeconfig), "disable_tcp_keepalive": "true"},
    }
    seen = {name: probe(cluster, namespace, extras) for name, extras in shapes.items()}
    for name, both in seen.items():
        for path, answer in both.items():
            assert answer.get("user") == ADMIN, (name, path, answer)
            assert answer["keepalive"] == [name != "keepalive off"], (name, path, answer)


def test_an_untrusted_certificate_fails_both_waits_at_once_naming_the_fix(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    extras = {"kube_config": json.dumps(with_other_ca(admin_kubeconfig(cluster), tmp_path))}
    seen = probe(cluster, namespace, extras)
    for path, answer in seen.items():
        assert answer["refusal"] is True, (path, answer)
        assert answer["seconds"] < 10, (path, answer)  # not retried until api_timeout (120 s)
        assert "presented a certificate the Kubernetes connection does not trust" in answer["error"], answer
        assert "disable_verify_ssl" in answer["error"] and "certificate-authority-data" in answer["error"]


# A waiting job on such a connection: refused before anything is created, the message naming the fix.
WAITING_JOB = """
import json, sys, time
from airflow_mpi.hooks.mpi import MPIJobHook
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.runner.retries import plan_for
from airflow_mpi.spec import MPIJobSpec
backend = MPIJobHook("mpi_shape").get_backend()
spec = MPIJobSpec.from_dict({"name": "ca", "image": "registry.example/airflow-mpi-train:0.1",
                             "command": ["true"], "workers": {"replicas": 1}, "pod": {"namespace": sys.argv[1]}})
started = time.monotonic()
try:
    JobRunner(backend, plan_for(backend, spec, RunIdentity("cadag", "train", "r1")), print).run()
    print("RESULT ran")
except Exception as error:
    print("RESULT " + json.dumps({"error": str(error), "type": type(error).__name__,
                                  "seconds": round(time.monotonic() - started, 2)}))
"""


def test_a_waiting_job_on_an_untrusted_certificate_creates_nothing(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    extras = {"kube_config": json.dumps(with_other_ca(admin_kubeconfig(cluster), tmp_path))}
    env = {**os.environ, "AIRFLOW_CONN_KUBE_SHAPE": json.dumps({"conn_type": "kubernetes", "extra": extras})}
    env["AIRFLOW_CONN_MPI_SHAPE"] = json.dumps(
        {"conn_type": "mpi", "extra": {"backend": "kubernetes", "kubernetes_conn_id": "kube_shape"}}
    )
    env.pop("KUBECONFIG", None)
    done = subprocess.run([sys.executable, "-c", WAITING_JOB, namespace], env=env, capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert "presented a certificate the Kubernetes connection does not trust" in result["error"], result
    assert result["seconds"] < 15, result
    api = cluster.api()
    assert [o["metadata"]["name"] for o in api.get(f"/api/v1/namespaces/{namespace}/secrets")["items"]] == []
