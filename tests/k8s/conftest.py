"""Fixtures for the Kubernetes backend: the API double on 127.0.0.1 (scripted or real kubelet),
a backend talking to it over real HTTP, and the check that no object of a job is left."""

from __future__ import annotations

import json
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from airflow_mpi.backends.kube_connection import configure_client
from airflow_mpi.backends.kubernetes import KubernetesBackend
from tests.doubles.kube_double import KubeDouble, PodScript, ScriptedKubelet

JOB_KINDS = ("pods", "services", "secrets", "configmaps", "leases.coordination.k8s.io")
STATE_ROOT = Path("/run/airflow-mpi-tests")


class Scripts:
    """Per-test pod behaviour: the first matching (substring of the pod name, script) wins."""

    def __init__(self) -> None:
        self.rules: list[tuple[str, PodScript]] = []

    def on(self, name_part: str, script: PodScript) -> None:
        self.rules.insert(0, (name_part, script))

    def __call__(self, pod: dict[str, Any]) -> PodScript:
        name = pod["metadata"]["name"]
        for part, script in self.rules:
            if part in name:
                return script
        if "-master-" in name:
            return PodScript(lines=lambda: iter(["[1,0]<stdout>:hello"]), exit_code=0)
        return PodScript()


@pytest.fixture
def scripts() -> Scripts:
    return Scripts()


@pytest.fixture
def double(scripts: Scripts) -> Iterator[KubeDouble]:
    kube = KubeDouble(ScriptedKubelet(scripts))
    kube.start()
    yield kube
    kube.stop()


def api_client_for(kube: KubeDouble) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = kube.url
    return client.ApiClient(configure_client(configuration, 28))  # as the backend configures its own


@pytest.fixture
def backend(double: KubeDouble) -> KubernetesBackend:
    return KubernetesBackend(api_client=api_client_for(double), namespace="default")


def job_objects(kube: KubeDouble, job_name: str | None = None) -> list[str]:
    """Objects of a job (or of any job) still in the double."""
    found = []
    for plural in JOB_KINDS:
        for obj in kube.list_objects(plural, "default"):
            labels = obj["metadata"].get("labels") or {}
            if job_name is None or labels.get("airflow-mpi.io/job") == job_name:
                found.append(f"{plural}/{obj['metadata']['name']}")
    return found


def install_connections(
    monkeypatch: pytest.MonkeyPatch, kube: KubeDouble, mpi_conn_id: str = "mpi_k8s", **mpi_extra: Any
) -> None:
    """Airflow connections to the double: ``mpi_conn_id`` (mpi, kubernetes backend, plus
    ``mpi_extra``) -> ``kube_double``."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_KUBE_DOUBLE",
        json.dumps({"conn_type": "kubernetes", "extra": {"kube_config": json.dumps(kube.kubeconfig())}}),
    )
    extra = {"backend": "kubernetes", "kubernetes_conn_id": "kube_double", "namespace": "default", **mpi_extra}
    monkeypatch.setenv(f"AIRFLOW_CONN_{mpi_conn_id.upper()}", json.dumps({"conn_type": "mpi", "extra": extra}))


@pytest.fixture
def connections(double: KubeDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    install_connections(monkeypatch, double)


@pytest.fixture
def real_double(monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeDouble]:
    """The double with a kubelet that runs pods for real (sandboxes: real sshd, mpiexec)."""
    from airflow_mpi.backends.local import check_prerequisites
    from tests.doubles.real_kubelet import RealKubelet
    from tests.leaks import ours

    if check_prerequisites():
        pytest.skip("needs " + "; ".join(check_prerequisites()))
    kubelet = RealKubelet(STATE_ROOT / "kubelet")
    kube = KubeDouble(kubelet)
    kube.start()
    install_connections(monkeypatch, kube)
    yield kube
    kube.stop()
    assert kubelet.leftovers() == []
    assert not ours(), f"leaked: {ours()}"
    state = STATE_ROOT / "kubelet"  # goes when nothing but its lock file is left (a leak stays visible)
    if state.exists() and not [p for p in state.iterdir() if p.name != ".lock"]:
        shutil.rmtree(state, ignore_errors=True)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def first_trigger_event(trigger: Any) -> dict[str, Any]:
    """The event a deferred operator resumes with, as the triggerer gets it: the trigger
    serialized and rebuilt, then run by asyncio until it fires."""
    import asyncio

    from airflow.sdk.module_loading import import_string

    classpath, kwargs = trigger.serialize()
    rebuilt = import_string(classpath)(**kwargs)

    async def run() -> dict[str, Any]:
        async for event in rebuilt.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(run())


def sigint_as_from_a_terminal() -> None:
    """``preexec_fn`` of a child the test interrupts with SIGINT: SIGINT at its default action.
    A shell starts background jobs with SIGINT ignored and children inherit that, so Python would
    never raise KeyboardInterrupt (a CI run started with ``&`` would time out)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
