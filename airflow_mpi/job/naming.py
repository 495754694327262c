"""Names: the job name from an Airflow run identity, pod and host names, labels and selectors.

The job name is ``<spec.name>-<13 base32>``, a 65-bit hash of the full run identity (its
deployment too: ``job/identity.py``), so it is deterministic for one try of one task instance and
does not collide between deployments, runs or tries (a million jobs a day: once in ~10^8 days).
Every name here is a valid DNS-1123 label; label values are made safe the way Kubernetes needs
(at most 63 of ``[-A-Za-z0-9_.]``, alphanumeric at both ends: an unmapped task's map index -1 is
not a label value, so that label is left out, as the cncf provider does).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from airflow_mpi.contract import JOB_HASH_LEN, MAX_DNS_LABEL, Role
from airflow_mpi.job.identity import (
    LABEL_PREFIX,
    LABEL_RUN_KEY,
    LABEL_TRY_NUMBER,
    RunIdentity,
    build_job_hash,
    build_run_key,
    owner_labels,
)

__all__ = ["LABEL_PREFIX", "LABEL_RUN_KEY", "LABEL_TRY_NUMBER", "RunIdentity", "build_run_key"]

LABEL_JOB = f"{LABEL_PREFIX}/job"
LABEL_ROLE = f"{LABEL_PREFIX}/role"
LABEL_INDEX = f"{LABEL_PREFIX}/replica-index"
LABEL_DAG_ID = f"{LABEL_PREFIX}/dag-id"
LABEL_TASK_ID = f"{LABEL_PREFIX}/task-id"
LABEL_RUN_ID = f"{LABEL_PREFIX}/run-id"
LABEL_MAP_INDEX = f"{LABEL_PREFIX}/map-index"
MANAGED_BY = "airflow-mpi"


def build_job_name(base: str, identity: RunIdentity) -> str:
    """``<base>-<hash>``: deterministic per try, distinct between runs, tries and map indexes."""
    return f"{base}-{build_job_hash(identity, JOB_HASH_LEN)}"


def build_pod_name(job_name: str, role: Role, index: int) -> str:
    return f"{job_name}-{role.value}-{index}"


def build_host_name(job_name: str, pod_name: str) -> str:
    """``<pod>.<job>``: resolves through the headless Service ``<job>`` (or the local hosts file)."""
    return f"{pod_name}.{job_name}"


def safe_label_value(text: str) -> str:
    """A valid label value for any string: kept when valid, else cleaned, cut and hashed."""
    if len(text) <= MAX_DNS_LABEL and re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[: MAX_DNS_LABEL - 9].strip("-_.")
    return f"{cleaned}-{digest}" if cleaned else digest


def build_job_labels(job_name: str, identity: RunIdentity, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Labels on every object of the job: app.kubernetes.io/*, the job and the run identity (its
    owner: ``identity.owner_labels``, compared before anything found under the job's name is
    deleted or adopted). The map index only for a mapped task; every try is found by the run key."""
    labels = dict(extra or {})
    labels.update(
        {
            "app.kubernetes.io/name": "airflow-mpi",
            "app.kubernetes.io/instance": job_name,
            "app.kubernetes.io/managed-by": MANAGED_BY,
            LABEL_JOB: job_name,
            LABEL_DAG_ID: safe_label_value(identity.dag_id),
            LABEL_TASK_ID: safe_label_value(identity.task_id),
            LABEL_RUN_ID: safe_label_value(identity.run_id),
            **owner_labels(identity),
        }
    )
    if identity.map_index >= 0:
        labels[LABEL_MAP_INDEX] = str(identity.map_index)
    else:
        labels.pop(LABEL_MAP_INDEX, None)  # not even from ``extra``: it would claim a mapped task
    return labels


def build_pod_labels(job_labels: Mapping[str, str], role: Role, index: int) -> dict[str, str]:
    return {
        **job_labels,
        "app.kubernetes.io/component": role.value,
        LABEL_ROLE: role.value,
        LABEL_INDEX: str(index),
    }


def job_selector(job_name: str) -> str:
    """Label selector for every object of one job."""
    return f"{LABEL_JOB}={job_name}"


def run_selector(identity: RunIdentity) -> str:
    """Label selector for the jobs of every try of one task instance."""
    return f"{LABEL_RUN_KEY}={build_run_key(identity)}"
