"""What a ``kubernetes`` connection asks for, read once and the same way for both waits: the
waiting path hands it to the cncf provider's ``KubernetesHook`` (as arguments, so the hook does
not read the connection again: ``waiting_client``), the deferred path to ``kubernetes_asyncio``'s
loaders (``triggers.api_client``).

The fields and their rules are the provider's: ``in_cluster``, ``kube_config_path`` and
``kube_config`` (at most one; none: the pod's ServiceAccount in a pod, else the default
kubeconfig), ``cluster_context``, ``namespace``, ``disable_verify_ssl``,
``disable_tcp_keepalive``, each also under its old ``extra__kubernetes__`` name. Where the
provider's two hooks differ (its async hook skips the ServiceAccount, ``disable_verify_ssl`` and
keepalive), this follows the synchronous one, which users configure against. A value the
provider would read some way or other (``"yes"`` for a flag, a kubeconfig that is not YAML) is
refused here, naming the field.
"""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from airflow_mpi.backends.token_file import use_token_file
from airflow_mpi.exceptions import BackendUnavailable

IN_CLUSTER, KUBE_CONFIG_PATH, KUBE_CONFIG, DEFAULT = "in_cluster", "kube_config_path", "kube_config", "default"
FIELDS = (
    "in_cluster",
    "kube_config_path",
    "kube_config",
    "cluster_context",
    "namespace",
    "disable_verify_ssl",
    "disable_tcp_keepalive",
)
_PREFIX = "extra__kubernetes__"
# The provider's [kubernetes_executor] defaults, for a process without its configuration section.
KEEPALIVE_DEFAULTS = {"tcp_keep_idle": 120, "tcp_keep_intvl": 30, "tcp_keep_cnt": 6}


@dataclass(frozen=True)
class KubeConnection:
    """One ``kubernetes`` connection, read: where the client's configuration comes from
    (``source``: in_cluster, kube_config_path, kube_config or default) and how it talks."""

    conn_id: str
    source: str = DEFAULT
    kube_config_path: str | None = None
    kube_config: dict[str, Any] | None = None
    cluster_context: str | None = None
    namespace: str | None = None
    verify_ssl: bool = True
    tcp_keepalive: bool = True

    def hook_arguments(self) -> dict[str, Any]:
        """``KubernetesHook`` arguments that make it load exactly this configuration, and read
        no connection itself (``conn_id`` None)."""
        return {
            "conn_id": None,
            "kubernetes_conn_id": None,
            "in_cluster": True if self.source == IN_CLUSTER else None,
            "config_file": self.kube_config_path,
            "config_dict": self.kube_config,
            "cluster_context": self.cluster_context,
            "disable_verify_ssl": not self.verify_ssl,
            "disable_tcp_keepalive": not self.tcp_keepalive,
        }

    def describe(self) -> str:
        """Where the configuration comes from, for messages."""
        return {
            IN_CLUSTER: "the pod's ServiceAccount (in_cluster)",
            KUBE_CONFIG_PATH: f"kubeconfig {self.kube_config_path} (kube_config_path)",
            KUBE_CONFIG: "the kubeconfig in its extras (kube_config)",
            DEFAULT: "the pod's ServiceAccount, or else the default kubeconfig (no in_cluster, kube_config_path "
            "or kube_config)",
        }[self.source]


def read_kube_connection(conn_id: str, extras: Mapping[str, Any] | str | None) -> KubeConnection:
    """The connection ``conn_id`` with ``extras`` (its extra JSON, as stored or parsed), checked:
    a ``ValueError`` names the field and the fix."""
    if isinstance(extras, str):
        extras = json.loads(extras) if extras.strip() else {}
    extras = dict(extras or {})

    def field(name: str) -> Any:
        value = extras.get(name, extras.get(f"{_PREFIX}{name}"))
        return None if value in (None, "") else value

    def flag(name: str) -> bool:
        value = field(name)
        if value is None or isinstance(value, bool):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ValueError(f"connection {conn_id!r}: extra {name!r} is {value!r}; set it to true or false")

    def text(name: str) -> str | None:
        value = field(name)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"connection {conn_id!r}: extra {name!r} must be a string, not {value!r}")
        return value

    choices = {IN_CLUSTER: flag(IN_CLUSTER), KUBE_CONFIG_PATH: field(KUBE_CONFIG_PATH), KUBE_CONFIG: field(KUBE_CONFIG)}
    chosen = [name for name, value in choices.items() if value]
    if len(chosen) > 1:
        raise ValueError(
            f"connection {conn_id!r}: {', '.join(chosen)} are mutually exclusive (each says where the cluster "
            "is); keep one of them in its extras"
        )
    return KubeConnection(
        conn_id=conn_id,
        source=chosen[0] if chosen else DEFAULT,
        kube_config_path=text(KUBE_CONFIG_PATH),
        kube_config=_kubeconfig(conn_id, field(KUBE_CONFIG)),
        cluster_context=text("cluster_context"),
        namespace=text("namespace"),
        verify_ssl=not flag("disable_verify_ssl"),
        tcp_keepalive=not flag("disable_tcp_keepalive"),
    )


def _kubeconfig(conn_id: str, value: Any) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    problem = "is neither a mapping nor YAML text"
    if isinstance(value, str):
        try:
            data = yaml.safe_load(value)
        except yaml.YAMLError as error:
            problem = f"is not YAML or JSON ({str(error).splitlines()[0]})"
        else:
            if isinstance(data, dict):
                return data
            problem = "is not a kubeconfig (a mapping with clusters, users and contexts)"
    raise ValueError(f"connection {conn_id!r}: extra 'kube_config' {problem}; paste the kubeconfig file's content")


def keepalive_options(idle: int, interval: int, count: int) -> list[tuple[int, int, int]]:
    """The socket options the provider sets for TCP keepalive (``[kubernetes_executor]
    tcp_keep_idle``, ``tcp_keep_intvl``, ``tcp_keep_cnt``), where the platform has them."""
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


def connection_named(conn_id: str) -> KubeConnection:
    """Connection ``conn_id`` read (the default one need not exist: no field set then)."""
    try:
        extras = _hook_class().get_connection(conn_id).extra_dejson
        return read_kube_connection(conn_id, extras)
    except BackendUnavailable:
        raise
    except Exception as error:  # no such connection, or a field refused by name
        raise BackendUnavailable(f"cannot reach Kubernetes through connection {conn_id!r}: {error}") from error


def waiting_client(connection: KubeConnection, concurrency: int) -> Any:
    """The waiting path's client: the cncf provider's ``KubernetesHook`` loads the configuration
    as read; an in-cluster one sends the token its file holds at each request (``token_file``)."""
    from kubernetes.client import ApiClient

    hook = _hook_class()(**connection.hook_arguments())
    try:
        configuration = copy.copy(hook.api_client.configuration)
        in_cluster = hook.is_in_cluster
    except Exception as error:
        raise BackendUnavailable(
            f"cannot reach Kubernetes through connection {connection.conn_id!r} ({connection.describe()}): {error}"
        ) from error
    if in_cluster:  # the pod's projected token, which the kubelet rewrites while a job runs
        configuration.api_key = dict(configuration.api_key)
        use_token_file(configuration)
    return ApiClient(configure_client(configuration, concurrency))


def configure_client(configuration: Any, concurrency: int = 16) -> Any:
    """What every request of the backend relies on, set on a client ``Configuration``: one pooled
    connection per create thread, and no retries inside urllib3 (the backend retries itself,
    bounded by ``api_timeout``; urllib3's would repeat a hung read up to three times)."""
    configuration.connection_pool_maxsize = max(concurrency + 4, 16)
    configuration.retries = 0
    return configuration


def _hook_class() -> Any:
    try:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
    except ImportError as error:  # a declared dependency: missing, or the process is shutting down
        raise BackendUnavailable(
            f"cannot import apache-airflow-providers-cncf-kubernetes' KubernetesHook ({error})"
        ) from error
    return KubernetesHook
