"""One Kubernetes API client per (connection, event loop), shared by every MPIJobTrigger waiting
in a triggerer. A client costs a TLS context (the CA bundle parsed: ~50 ms and ~0.5 MB) and a
connection pool; a triggerer holds hundreds of waits, which used to build one each.

The configuration comes from the Airflow connection with the fields and rules of the cncf
provider's ``KubernetesHook`` (``in_cluster``, ``kube_config_path``, ``kube_config``,
``cluster_context``; none of them: the pod's ServiceAccount when there is one, else the default
kubeconfig; the provider's ``AsyncKubernetesHook`` skips the ServiceAccount, so a deferred task
in a pod would not run as its waiting twin does), read here so that the triggerer does not
import that hook's module: it loads the synchronous ``kubernetes`` client as well (~40 MB of RSS
the trigger never uses). A user that authenticates through an exec plugin (short-lived tokens)
gets its own client per wait, loaded afresh, as the provider does; an in-cluster client sends the
token its file holds at each request (``backends.token_file``), shared or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import socket
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import yaml

from airflow_mpi.backends.kube_connection import (
    IN_CLUSTER,
    KEEPALIVE_DEFAULTS,
    KubeConnection,
    keepalive_options,
    read_kube_connection,
)
from airflow_mpi.backends.token_file import use_token_file
from airflow_mpi.observe.lines import LineSplitter

DEFAULT_CONN_ID = "kubernetes_default"


@dataclass
class _Shared:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    client: Any = None
    users: int = 0


_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Shared]] = weakref.WeakKeyDictionary()


# What every wait uses of the async client (its ApiClient, CoreV1Api, the kubeconfig loader).
CLIENT_MODULES = ("kubernetes_asyncio.client", "kubernetes_asyncio.config")
_client_imported = threading.Event()


async def import_client() -> None:
    """Import ``kubernetes_asyncio`` (about 3 s on a busy machine, once per process) in a thread:
    on the event loop the first wait would stop every other trigger of the triggerer that long.
    Done only once the whole import has finished (a module in ``sys.modules`` may be half-made)."""
    if not _client_imported.is_set():
        await asyncio.to_thread(_import_client)


def _import_client() -> None:
    for name in CLIENT_MODULES:
        importlib.import_module(name)
    _client_imported.set()


@contextlib.asynccontextmanager
async def shared_api_client(conn_id: str) -> AsyncIterator[Any]:
    """A ``kubernetes_asyncio`` ApiClient for ``conn_id``, shared with the other waits of this
    event loop and closed when the last of them leaves."""
    await import_client()
    clients = _SHARED.setdefault(asyncio.get_running_loop(), {})
    shared = clients.setdefault(conn_id, _Shared())
    own = None  # an exec-plugin user's configuration: a client of its own
    async with shared.lock:  # the first wait loads the configuration; the rest reuse its client
        if shared.client is None:
            loaded = await load_configuration(conn_id)
            if loaded.shareable:
                shared.client = _new_client(loaded)
            else:
                own = loaded
        if own is None:
            shared.users += 1
    if own is not None:
        async with _new_client(own) as client:
            yield client
        return
    try:
        yield shared.client
    finally:
        shared.users -= 1
        if shared.users == 0:
            client, shared.client = shared.client, None
            if clients.get(conn_id) is shared:
                del clients[conn_id]
            if client is not None:
                await client.close()


def _new_client(loaded: Loaded) -> Any:
    from kubernetes_asyncio.client import ApiClient

    loaded.configuration.connection_pool_maxsize = 0  # no cap: every wait holds a watch open at once
    client = ApiClient(loaded.configuration)
    if loaded.socket_options:
        # aiohttp takes no socket options: its connector makes each socket through this factory
        # (aiohttp 3.12+; older ones connect without keepalive), as urllib3 takes ``socket_options``.
        connector: Any = client.rest_client.pool_manager.connector
        if hasattr(connector, "_socket_factory"):
            connector._socket_factory = _socket_factory(loaded.socket_options)
    return client


def _socket_factory(options: list[tuple[int, int, int]]) -> Any:
    def make(addr_info: tuple[Any, ...]) -> socket.socket:
        family, type_, proto = addr_info[:3]
        sock = socket.socket(family=family, type=type_, proto=proto)
        for option in options:
            sock.setsockopt(*option)
        return sock

    return make


class Loaded(NamedTuple):
    """A connection's client configuration, whether a client of it may be shared (not for an
    exec-plugin user, whose token must be fetched again for each wait), and the socket options
    its connections get (TCP keepalive unless the connection disables it)."""

    configuration: Any
    shareable: bool
    socket_options: list[tuple[int, int, int]]


async def load_configuration(conn_id: str) -> Loaded:
    """What connection ``conn_id`` asks for, read as the waiting path reads it (``kube_connection``)."""
    connection = read_kube_connection(conn_id, await _connection_extras(conn_id))
    configuration, shareable = await _load(connection)
    if not connection.verify_ssl:  # as the waiting path's hook does
        configuration.verify_ssl = False
    return Loaded(configuration, shareable, keepalive_settings() if connection.tcp_keepalive else [])


def keepalive_settings() -> list[tuple[int, int, int]]:
    """TCP keepalive as the provider sets it for the waiting path (``[kubernetes_executor]``)."""
    from airflow_mpi.compat import conf

    settings = conf()
    values = {
        name: settings.getint("kubernetes_executor", name, fallback=default)
        for name, default in KEEPALIVE_DEFAULTS.items()
    }
    return keepalive_options(values["tcp_keep_idle"], values["tcp_keep_intvl"], values["tcp_keep_cnt"])


async def _load(connection: KubeConnection) -> tuple[Any, bool]:
    from kubernetes_asyncio import config
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION as default_location

    configuration, context = Configuration(), connection.cluster_context
    if connection.source == IN_CLUSTER:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return use_token_file(configuration), True  # the token as the kubelet last wrote it
    if connection.kube_config is not None:
        data = connection.kube_config
        await config.load_kube_config_from_dict(data, context=context, client_configuration=configuration)
        return configuration, not _uses_exec(data, context)
    path = connection.kube_config_path
    if path is None:  # nothing chosen: in a pod its ServiceAccount, as the waiting path's KubernetesHook
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:  # not in a pod: the default kubeconfig
            pass
        else:
            return use_token_file(configuration), True
        existing = [p for p in map(os.path.expanduser, default_location.split(os.pathsep)) if p]
        existing = [p for p in existing if os.path.exists(p)]
        path_for_exec = existing[0] if len(existing) == 1 else None  # a merge: which user is active is the client's
    else:
        path_for_exec = path
    await config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
    if path_for_exec is None:
        return configuration, False
    with open(path_for_exec) as handle:
        return configuration, not _uses_exec(yaml.safe_load(handle), context)


async def _connection_extras(conn_id: str) -> Any:
    from airflow_mpi.compat import AirflowNotFoundException, get_async_connection

    try:
        connection = await get_async_connection(conn_id)
    except AirflowNotFoundException:
        if conn_id != DEFAULT_CONN_ID:
            raise
        return {}  # the default connection need not exist: the default kubeconfig then
    return connection.extra_dejson


def _uses_exec(kubeconfig: dict[str, Any], context: str | None) -> bool:
    """Whether the active context's user runs an exec plugin (unresolvable: any user does)."""
    active = context or kubeconfig.get("current-context")
    contexts = kubeconfig.get("contexts") or []
    user = next((c.get("context", {}).get("user") for c in contexts if c.get("name") == active), None)
    users = kubeconfig.get("users") or []
    if user is None:
        return any("exec" in (u.get("user") or {}) for u in users)
    return any("exec" in (u.get("user") or {}) for u in users if u.get("name") == user)


async def raise_for_status(response: Any) -> None:
    """An error answer as the client's ``ApiException``: with ``_preload_content=False`` the async
    client hands back any response, and a 403's Status body would otherwise be read as events."""
    if 200 <= response.status <= 299:
        return
    from kubernetes_asyncio.client.exceptions import ApiException

    error = ApiException(status=response.status, reason=response.reason)
    error.body, error.headers = await response.read(), response.headers
    response.release()
    raise error


async def watch_events(response: Any) -> AsyncGenerator[dict[str, Any], None]:
    """The events of a watch response (one JSON object a line; no cap: the API server bounds them)."""
    lines = LineSplitter(max_bytes=None)
    async for chunk in response.content.iter_any():
        for line in lines.feed(chunk):
            if line.strip():
                yield json.loads(line)
    for line in lines.flush():
        if line.strip():
            yield json.loads(line)
