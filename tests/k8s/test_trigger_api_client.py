"""The triggerer's shared API client: one per (connection, event loop), closed by its last user;
an exec-plugin user gets a client of its own each time; the configuration is the connection's."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

from airflow_mpi.triggers.api_client import _SHARED, load_configuration, shared_api_client
from tests.doubles.kube_double import KubeDouble


@pytest.mark.usefixtures("connections")
def test_waits_on_one_loop_share_one_client_closed_by_the_last(double: KubeDouble) -> None:
    async def scenario() -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        async with shared_api_client("kube_double") as first:
            async with shared_api_client("kube_double") as second:
                from kubernetes_asyncio.client import CoreV1Api

                listed = await CoreV1Api(second).list_namespaced_pod("default", _request_timeout=5)
                assert listed.items == []
            open_after_one_left = not first.rest_client.pool_manager.closed
        closed_after_all_left = first.rest_client.pool_manager.closed
        return (
            first,
            second,
            open_after_one_left,
            closed_after_all_left,
            dict(_SHARED.get(asyncio.get_running_loop(), {})),
        )

    first, second, open_after_one_left, closed_after_all_left, left = asyncio.run(scenario())
    assert first is second
    assert open_after_one_left and closed_after_all_left
    assert left == {}  # nothing kept for a connection nobody uses
    assert first.configuration.host == double.url.rstrip("/")


@pytest.mark.usefixtures("connections")
def test_each_event_loop_has_its_own_client() -> None:
    async def one() -> Any:
        async with shared_api_client("kube_double") as client:
            return client

    assert asyncio.run(one()) is not asyncio.run(one())


def test_an_exec_plugin_user_is_not_shared(double: KubeDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig = double.kubeconfig()
    token = json.dumps(
        {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": {"token": "t"}}
    )
    for user in kubeconfig["users"]:
        user["user"] = {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": sys.executable,
                "args": ["-c", f"print({token!r})"],
                "interactiveMode": "Never",
            }
        }
    extra = {"kube_config": json.dumps(kubeconfig)}
    monkeypatch.setenv("AIRFLOW_CONN_KUBE_EXEC", json.dumps({"conn_type": "kubernetes", "extra": extra}))

    async def scenario() -> tuple[Any, Any, bool]:
        shareable = (await load_configuration("kube_exec")).shareable
        async with shared_api_client("kube_exec") as first, shared_api_client("kube_exec") as second:
            return first, second, shareable

    first, second, shareable = asyncio.run(scenario())
    assert not shareable
    assert first is not second


def test_a_connection_with_two_configurations_is_refused_by_name_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_mpi.backends.kubernetes import KubernetesBackend
    from airflow_mpi.exceptions import BackendUnavailable

    extra = {"in_cluster": True, "kube_config_path": "/nonexistent"}
    monkeypatch.setenv("AIRFLOW_CONN_KUBE_BOTH", json.dumps({"conn_type": "kubernetes", "extra": extra}))
    said = "connection 'kube_both': in_cluster, kube_config_path are mutually exclusive"
    with pytest.raises(ValueError, match=said):
        asyncio.run(load_configuration("kube_both"))
    with pytest.raises(BackendUnavailable, match=said):  # the waiting path, before any request
        _ = KubernetesBackend(kubernetes_conn_id="kube_both").api_client
