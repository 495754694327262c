"""How a ``kubernetes`` connection is read, once for both waits: the source it names, the
provider's flags and old field names, and a refusal naming the field for what it cannot read."""

from __future__ import annotations

import json
import socket
import ssl

import pytest

from airflow_mpi.backends.k8s_errors import ApiRequest, certificate_rejected, explain, is_refusal, is_transient
from airflow_mpi.backends.kube_connection import (
    DEFAULT,
    IN_CLUSTER,
    KUBE_CONFIG,
    KUBE_CONFIG_PATH,
    keepalive_options,
    read_kube_connection,
)

KUBECONFIG = {"clusters": [], "users": [], "contexts": [], "current-context": "x"}


def test_no_field_means_the_service_account_then_the_default_kubeconfig() -> None:
    read = read_kube_connection("k", None)
    assert (read.source, read.verify_ssl, read.tcp_keepalive, read.namespace) == (DEFAULT, True, True, None)
    assert read.hook_arguments()["in_cluster"] is None  # the hook tries the pod, then ~/.kube/config


@pytest.mark.parametrize(
    ("extras", "source"),
    [
        ({"in_cluster": True}, IN_CLUSTER),
        ({"in_cluster": "True"}, IN_CLUSTER),
        ({"in_cluster": "false", "kube_config_path": "/k"}, KUBE_CONFIG_PATH),
        ({"extra__kubernetes__kube_config_path": "/k"}, KUBE_CONFIG_PATH),
        ({"kube_config": json.dumps(KUBECONFIG)}, KUBE_CONFIG),
        ({"kube_config": "clusters: []\nusers: []\ncontexts: []\n"}, KUBE_CONFIG),
        ({"kube_config": KUBECONFIG}, KUBE_CONFIG),
        ({"kube_config_path": "", "in_cluster": False}, DEFAULT),
    ],
)
def test_the_source_is_the_one_field_set(extras: dict[str, object], source: str) -> None:
    assert read_kube_connection("k", extras).source == source


def test_the_hook_is_told_everything_and_reads_no_connection() -> None:
    extras = {
        "kube_config": json.dumps(KUBECONFIG),
        "cluster_context": "ctx",
        "namespace": "training",
        "disable_verify_ssl": "true",
        "disable_tcp_keepalive": True,
    }
    read = read_kube_connection("k", json.dumps(extras))
    assert read.namespace == "training"
    assert read.hook_arguments() == {
        "conn_id": None,
        "kubernetes_conn_id": None,
        "in_cluster": None,
        "config_file": None,
        "config_dict": KUBECONFIG,
        "cluster_context": "ctx",
        "disable_verify_ssl": True,
        "disable_tcp_keepalive": True,
    }


@pytest.mark.parametrize(
    ("extras", "named"),
    [
        ({"in_cluster": True, "kube_config_path": "/k"}, "in_cluster, kube_config_path are mutually exclusive"),
        ({"kube_config_path": "/k", "kube_config": KUBECONFIG}, "kube_config_path, kube_config are mutually"),
        ({"disable_verify_ssl": "yes"}, "extra 'disable_verify_ssl' is 'yes'; set it to true or false"),
        ({"in_cluster": 1}, "extra 'in_cluster' is 1"),
        ({"kube_config": "a: [b"}, "extra 'kube_config' is not YAML or JSON"),
        ({"kube_config": "just text"}, "extra 'kube_config' is not a kubeconfig"),
        ({"namespace": 3}, "extra 'namespace' must be a string"),
    ],
)
def test_what_cannot_be_read_is_refused_naming_the_field(extras: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match="connection 'k': ") as caught:
        read_kube_connection("k", extras)
    assert named in str(caught.value)


def test_keepalive_is_the_providers_socket_options() -> None:
    options = keepalive_options(120, 30, 6)
    assert options[0] == (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    assert (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 120) in options
    assert (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 6) in options


def _rejected() -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    error.verify_message = "self-signed certificate in certificate chain"
    return error


def test_an_untrusted_certificate_is_a_refusal_not_a_retry() -> None:
    class MaxRetryError(Exception):  # urllib3's shape: the cause in ``reason``
        def __init__(self, reason: BaseException) -> None:
            super().__init__("max retries")
            self.reason = reason

    wrapped = MaxRetryError(OSError(_rejected()))
    assert certificate_rejected(wrapped) is not None
    assert not is_transient(wrapped) and is_refusal(wrapped)
    message = explain(wrapped, ApiRequest("list", "pods", "training"), "https://10.0.0.1:6443")
    assert "https://10.0.0.1:6443 presented a certificate the Kubernetes connection does not trust" in message
    assert "self-signed certificate in certificate chain" in message and "disable_verify_ssl" in message
    refused = ConnectionRefusedError(111, "refused")
    assert certificate_rejected(refused) is None and is_transient(refused) and not is_refusal(refused)


def test_both_waits_delete_a_job_in_one_order_with_one_propagation() -> None:
    from airflow_mpi.backends.removal import SERVICES, job_deletions
    from airflow_mpi.kinds.gang import KUEUE_WORKLOAD
    from airflow_mpi.kinds.registry import job_kind
    from airflow_mpi.kinds.trainjob import TRAINING_RUNTIME, TRAINJOB

    workload = KUEUE_WORKLOAD[:3]
    assert job_deletions(job_kind("pods"), []) == [(SERVICES, "Background")]
    assert job_deletions(job_kind("pods"), [workload]) == [(SERVICES, "Background"), (workload, "Background")]
    mpijob = job_kind("mpijob").top_resource[:3]
    assert job_deletions(job_kind("mpijob"), [mpijob]) == [(mpijob, "Foreground"), (SERVICES, "Background")]
    runtime, trainjob = TRAINING_RUNTIME[:3], TRAINJOB[:3]
    assert job_deletions(job_kind("trainjob"), [trainjob, runtime]) == [
        (trainjob, "Background"),  # Kueue's webhook would hold a foreground deletion for good
        (SERVICES, "Background"),
        (runtime, "Background"),
    ]
