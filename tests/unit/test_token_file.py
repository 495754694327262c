"""The in-cluster token as the kubelet rotates it (``backends.token_file``): each client sends the
token the file holds when the request is made, copies of its configuration read the same file,
and a 401 to a request sent before the file changed is made again rather than failing the job.
(Against the real apiserver: tests/cluster/test_incluster_real.py.)"""

from __future__ import annotations

import asyncio
import copy
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from kubernetes.client import Configuration
from kubernetes.client.exceptions import ApiException

from airflow_mpi.backends.core_objects import CoreObjects
from airflow_mpi.backends.k8s_errors import ApiSilence
from airflow_mpi.backends.token_file import TokenFile, renewed_since, token_generation, use_token_file


def rotate(path: Path, token: str) -> None:
    """Write ``token`` as the kubelet does: a new file renamed over the old one."""
    fresh = path.with_name(".fresh")
    fresh.write_text(token)
    os.replace(fresh, path)


def test_the_sync_client_sends_the_token_the_file_holds_now(tmp_path: Path) -> None:
    path = tmp_path / "token"
    rotate(path, "first\n")
    configuration = use_token_file(Configuration(), str(path))
    assert configuration.get_api_key_with_prefix("BearerToken") == "Bearer first"
    rotate(path, "second")
    assert configuration.get_api_key_with_prefix("BearerToken") == "Bearer second"
    copied = copy.deepcopy(configuration)  # what Configuration.set_default and get_default_copy do
    assert copied.refresh_api_key_hook is configuration.refresh_api_key_hook
    rotate(path, "third")
    assert copied.get_api_key_with_prefix("BearerToken") == "Bearer third"


def test_the_async_client_sends_the_token_the_file_holds_now(tmp_path: Path) -> None:
    from kubernetes_asyncio.client import Configuration as AsyncConfiguration

    path = tmp_path / "token"
    rotate(path, "first")
    configuration = use_token_file(AsyncConfiguration(), str(path))
    assert asyncio.run(configuration.get_api_key_with_prefix("BearerToken")) == "Bearer first"
    rotate(path, "second")
    assert asyncio.run(configuration.get_api_key_with_prefix("BearerToken")) == "Bearer second"


def test_a_file_being_swapped_or_emptied_keeps_the_last_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    rotate(path, "first")
    token = TokenFile(str(path))
    assert (token.current(), token.generation) == ("Bearer first", 1)
    path.unlink()
    assert (token.current(), token.generation) == ("Bearer first", 1)
    rotate(path, "")
    assert (token.current(), token.generation) == ("Bearer first", 1)
    rotate(path, "first")  # rewritten with the same token: not a new one
    assert (token.current(), token.generation) == ("Bearer first", 1)
    rotate(path, "second")
    assert (token.current(), token.generation) == ("Bearer second", 2)


def test_a_client_with_a_token_of_its_own_is_never_renewed() -> None:
    client = SimpleNamespace(configuration=Configuration())
    assert token_generation(client) == 0
    assert not renewed_since(client, 0)
    assert not renewed_since(None, 0)


def unauthorized() -> ApiException:
    return ApiException(status=401, reason="Unauthorized")


def test_a_401_to_a_request_sent_before_the_rotation_is_made_again(tmp_path: Path) -> None:
    path = tmp_path / "token"
    rotate(path, "old")
    client = SimpleNamespace(configuration=use_token_file(Configuration(), str(path)))
    objects = CoreObjects(client, ApiSilence("https://api.example", 30))
    sent: list[str] = []

    def call(timeout: object) -> str:
        sent.append(client.configuration.get_api_key_with_prefix("BearerToken"))
        if len(sent) == 1:
            rotate(path, "new")  # the kubelet's rotation and the old token's revocation, mid-request
            raise unauthorized()
        return "answered"

    assert objects.request(call) == "answered"
    assert sent == ["Bearer old", "Bearer new"]


def test_a_401_with_the_token_the_file_still_holds_fails_at_once(tmp_path: Path) -> None:
    path = tmp_path / "token"
    rotate(path, "revoked")
    client = SimpleNamespace(configuration=use_token_file(Configuration(), str(path)))
    objects = CoreObjects(client, ApiSilence("https://api.example", 30))
    calls = []

    def call(timeout: object) -> str:
        calls.append(timeout)
        raise unauthorized()

    with pytest.raises(ApiException):
        objects.request(call)
    assert len(calls) == 1
