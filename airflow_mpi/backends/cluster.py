"""Jobs already on a cluster, for the CLI and the connection test: list them, read a master's log,
delete one and wait until it is gone, and check that the API answers and allows what the backend
needs. Built on ``KubernetesBackend``'s own bounded requests and error translation, so a refusal
or an unreachable API reads the same here as during a run.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

from airflow_mpi import contract
from airflow_mpi.backends.k8s_errors import NOT_FOUND, ApiRequest, api_status, explain, translate
from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import BackendError, JobNotFound
from airflow_mpi.jobtable import MANAGED_SELECTOR, JobRow, summarize_job
from airflow_mpi.logstream import split_tag
from airflow_mpi.naming import LABEL_JOB, build_pod_name, job_selector
from airflow_mpi.podlog import PartialLine, RankLineSplitter
from airflow_mpi.spec import Role

JOB_PLURALS = ("services", "secrets", "configmaps", "pods")
DELETE_WAIT = 60.0  # seconds for the garbage collector to take a deleted job's objects
CHECK_TIMEOUT = (5.0, 10.0)  # (connect, read) seconds of each request of a connection test


def list_jobs(backend: KubernetesBackend, namespace: str, now: float | None = None) -> list[JobRow]:
    """Every job of this product in the namespace, oldest first (two list requests)."""
    now = time.time() if now is None else now
    services = backend._list(namespace, "services", MANAGED_SELECTOR)
    pods: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for pod in backend._list(namespace, "pods", MANAGED_SELECTOR):
        pods[(pod["metadata"].get("labels") or {}).get(LABEL_JOB, "")].append(pod)
    rows = [summarize_job(service, pods.get(service["metadata"]["name"], []), now) for service in services]
    return sorted(rows, key=lambda row: (-row.age_s, row.name))


def job_objects(backend: KubernetesBackend, job_name: str, namespace: str) -> list[str]:
    """``kind/name`` of each object of the job still there."""
    selector = job_selector(job_name)
    return [
        f"{plural[:-1]}/{o['metadata']['name']}"
        for plural in JOB_PLURALS
        for o in backend._list(namespace, plural, selector)
    ]


def read_master_log(backend: KubernetesBackend, job_name: str, namespace: str) -> list[str]:
    """The master's log as it is now, each rank's lines reassembled (as ``run`` shows them)."""
    master = build_pod_name(job_name, Role.MASTER, 0)
    request = ApiRequest("get", "pods/log", namespace, master)
    try:
        response = backend._send(
            lambda timeout: backend.core.read_namespaced_pod_log(
                master, namespace, container=contract.CONTAINER_NAME, _preload_content=False, _request_timeout=timeout
            )
        )
    except BackendError:
        raise
    except Exception as error:
        if api_status(error) == NOT_FOUND:
            _require_job(backend, job_name, namespace)
            raise JobNotFound(f"job {job_name} has no master pod (yet): nothing logged") from None
        raise translate(error, request, backend.api_url) from error
    splitter = RankLineSplitter()
    lines = splitter.feed(response.data) + splitter.flush()
    return [plain_line(line) for line in lines if not isinstance(line, PartialLine)]


def plain_line(line: str) -> str:
    """A line as a terminal should get it: a rewritten line's final state without its ``\r``."""
    tag, text = split_tag(line)
    return tag + text[1:] if text.startswith("\r") else line


def delete_job(backend: KubernetesBackend, job_name: str, namespace: str, wait: float = DELETE_WAIT) -> list[str]:
    """Delete the job (its Service; the garbage collector takes the rest) and wait until nothing
    of it is left; what the collector has not taken by then is deleted directly. Returns what is
    still there after that (empty on success); ``JobNotFound`` if there was no such job."""
    if not _require_job(backend, job_name, namespace):
        return []
    backend.teardown(job_name, namespace)
    deadline = time.monotonic() + wait
    while True:
        left = job_objects(backend, job_name, namespace)
        if not left:
            return []
        if time.monotonic() >= deadline:
            break
        time.sleep(0.3)
    since = time.monotonic()
    for item in left:  # the collector is slow or off
        kind, name = item.split("/", 1)
        backend._delete(namespace, f"{kind}s", name, since)
    return job_objects(backend, job_name, namespace)


def _require_job(backend: KubernetesBackend, job_name: str, namespace: str) -> bool:
    """True if the job's Service is there; False if only dependents are; else ``JobNotFound``."""
    if backend._read(namespace, "services", job_name) is not None:
        return True
    if job_objects(backend, job_name, namespace):
        return False
    raise JobNotFound(
        f"no job {job_name} in namespace {namespace}: `airflow-mpi jobs --namespace {namespace}` lists the jobs there"
    )


def check_access(backend: KubernetesBackend, namespace: str) -> tuple[bool, str]:
    """One list of the namespace's pods (what every job's watch does) and a read of the namespace:
    (True, what answered) or (False, what failed and what to change). No retries: a connection
    test says at once that the API cannot be reached."""
    url = backend.api_url
    request = ApiRequest("list", "pods", namespace)
    try:
        response = backend.core.list_namespaced_pod(
            namespace, limit=1, _preload_content=False, _request_timeout=CHECK_TIMEOUT
        )
        listed = len(json.loads(response.data).get("items") or [])
    except Exception as error:
        if api_status(error) is None:
            return False, f"cannot reach the Kubernetes API at {url} ({_reason(error)}): check the server address"
        return False, explain(error, request, url)
    try:
        backend.core.read_namespace(namespace, _preload_content=False, _request_timeout=CHECK_TIMEOUT)
    except Exception as error:
        body = getattr(error, "body", "") or ""
        if api_status(error) == NOT_FOUND and '"namespaces"' in str(body):
            return False, (
                f"namespace {namespace} does not exist (404 NotFound from the Kubernetes API at {url}): create it "
                f"(kubectl create namespace {namespace}) or set the mpi connection's namespace to one that exists"
            )
        unchecked = " (whether the namespace exists was not checked: reading it was refused)"
        return True, f"the Kubernetes API at {url} lists pods in namespace {namespace}{unchecked}"
    some = "pods" if listed else "no pods yet"
    return True, f"the Kubernetes API at {url} lists pods in namespace {namespace} ({some})"


def _reason(error: BaseException) -> str:
    text = f"{error!r} {error}".lower()
    if "refused" in text:
        return "connection refused"
    if "timed out" in text or "timeout" in text:
        return "no answer in time"
    if "name or service not known" in text or "nodename nor servname" in text:
        return "unknown host name"
    return type(error).__name__
