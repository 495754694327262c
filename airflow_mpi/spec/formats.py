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
# An MCA value, and any other mpiexec option or value: Open MPI copies MCA parameters (given with
# --mca, by an option such as --map-by, or as OMPI_MCA_* in mpiexec's environment) onto each
# remote daemon's command line, which ssh hands to the worker's login shell inside double quotes.
# So only characters no shell treats specially: interface lists (eth0,lo), subnets (10.0.0.0/8),
# exclusions (^openib), numbers (-1), paths (/opt/x), ppr:2:node:PE=2.
MCA_VALUE = re.compile(r"^[A-Za-z0-9_.,:/^=+@%-]+\Z")
MCA_VALUE_CHARS = "letters, digits and _ . , : / ^ = + @ % -"
MAX_MCA_VALUE = 1024
# execve refuses any single argument or environment string of 128 KiB or more (Linux
# MAX_ARG_STRLEN, its NUL included): a longer NAME=value would fail when the pod starts.
MAX_ARG_BYTES = 128 * 1024 - 1
MAX_DNS_SUBDOMAIN = 253
# Kubernetes allows 256 KiB of annotations (keys and values) per object; the run identity's take
# up to 3 x 250 characters, kept free here.
MAX_ANNOTATION_BYTES = 256 * 1024 - 4096


def mca_value_problem(value: str) -> str | None:
    """Why ``value`` may not reach a remote daemon's command line, or None."""
    if not value:
        return "is empty"
    if len(value) > MAX_MCA_VALUE:
        return f"is {len(value)} characters long (at most {MAX_MCA_VALUE})"
    if not MCA_VALUE.match(value):
        bad = sorted({c for c in value if not MCA_VALUE.match(c)})
        shown = " ".join(repr(c) for c in bad[:8])
        return (
            f"{value[:80]!r} contains {shown}: Open MPI hands MCA values and option values to a shell on "
            f"every worker, so they may hold only {MCA_VALUE_CHARS}"
        )
    return None


def env_string_bytes(name: str, value: str) -> int:
    """The bytes of ``NAME=value`` as execve gets it (a lone surrogate counted as 3)."""
    return len(name.encode("utf-8", "surrogatepass")) + 1 + len(value.encode("utf-8", "surrogatepass"))


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
