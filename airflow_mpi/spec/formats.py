"""The name formats Kubernetes and Open MPI accept, and the longest job name that fits them."""

from __future__ import annotations

import re

from airflow_mpi.contract import JOB_HASH_LEN, MAX_DNS_LABEL

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # DNS-1035: Service names start with a letter
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MCA_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
RESOURCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def is_dns_label(text: str) -> bool:
    return len(text) <= MAX_DNS_LABEL and bool(DNS_LABEL.match(text))


def is_dns1123_label(text: str) -> bool:
    """A namespace name: at most 63 of [a-z0-9-], starting and ending with a letter or digit."""
    return len(text) <= MAX_DNS_LABEL and bool(DNS1123_LABEL.match(text))


def is_qualified_name(key: str) -> bool:
    """A label or annotation key: ``[prefix/]name``."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
        return False
    return bool(LABEL_NAME.match(name))


def max_name_length(worker_replicas: int) -> int:
    """Longest ``name`` whose longest pod name (``<name>-<hash>-worker-<N-1>``) is a DNS label."""
    suffix = max(len("-master-0"), len("-worker-") + len(str(max(worker_replicas - 1, 0))))
    return MAX_DNS_LABEL - (1 + JOB_HASH_LEN) - suffix
