"""The name formats Kubernetes and Open MPI accept, and the longest job name that fits them."""

from __future__ import annotations

import re

from airflow_mpi.contract import JOB_HASH_LEN, MAX_DNS_LABEL

# Anchored with \Z, not $ (which also matches before a final newline): the apiserver allows none.
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?\Z")  # DNS-1035: Service names start with a letter
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
MCA_NAME = re.compile(r"^[a-z][a-z0-9_]*\Z")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]\Z")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
RESOURCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
# Control characters: never in a name, path, option or argument value (newlines split config lines).
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_DNS_SUBDOMAIN = 253
# Kubernetes allows 256 KiB of annotations (keys and values) per object; the run identity's take
# up to 3 x 250 characters, kept free here.
MAX_ANNOTATION_BYTES = 256 * 1024 - 4096


def is_dns_label(text: str) -> bool:
    return len(text) <= MAX_DNS_LABEL and bool(DNS_LABEL.match(text))


def is_dns1123_label(text: str) -> bool:
    """A namespace name: at most 63 of [a-z0-9-], starting and ending with a letter or digit."""
    return len(text) <= MAX_DNS_LABEL and bool(DNS1123_LABEL.match(text))


def is_qualified_name(key: str) -> bool:
    """A label or annotation key: ``[prefix/]name``."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > MAX_DNS_SUBDOMAIN or not DNS_SUBDOMAIN.match(prefix)):
        return False
    return bool(LABEL_NAME.match(name))


def is_label_value(value: str) -> bool:
    return len(value) <= MAX_DNS_LABEL and bool(LABEL_VALUE.match(value))


def max_name_length(worker_replicas: int) -> int:
    """Longest ``name`` whose longest pod name (``<name>-<hash>-worker-<N-1>``) is a DNS label."""
    suffix = max(len("-master-0"), len("-worker-") + len(str(max(worker_replicas - 1, 0))))
    return MAX_DNS_LABEL - (1 + JOB_HASH_LEN) - suffix
