"""Jobs already on a cluster, for the CLI and the connection test: list them, read a master's log,
delete one and wait until it is gone, and check that the API answers and allows what the backend
needs. Built on the backend's own client (``CoreObjects``: bounded requests, translated errors), so
a refusal or an unreachable API reads the same here as during a run.

A job may have been made by any Kubernetes backend: plain pods (our Service owns everything), a
Volcano Job or an MPIJob (its controller makes the pods). Every one creates our Secret with our
labels, owned by its top object: that owner says the job's kind (``kinds.registry.kind_of``), and a backend
of that kind reads the job's pods, finds its master pod and deletes it.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator

from airflow_mpi.backends.k8s_errors import NOT_FOUND, ApiRequest, api_status, certificate_rejected, explain
from airflow_mpi.backends.kubernetes import KubernetesBackend, Obj
from airflow_mpi.exceptions import JobNotFound
from airflow_mpi.job.naming import LABEL_JOB, job_selector
from airflow_mpi.kinds.registry import kind_of, registered_kinds
from airflow_mpi.observe.jobtable import MANAGED_SELECTOR, JobRow, summarize_job
from airflow_mpi.observe.lines import PartialLine, RankLineSplitter
from airflow_mpi.observe.output import split_tag

JOB_PLURALS = ("secrets", "configmaps", "pods")  # what every backend's job has with our job label
CORE_KINDS = {"service": "services", "secret": "secrets", "configmap": "configmaps", "pod": "pods"}
DELETE_WAIT = 60.0  # seconds for the garbage collector to take a deleted job's objects
CHECK_TIMEOUT = (5.0, 10.0)  # (connect, read) seconds of each request of a connection test


class Cluster:
    """One backend of each kind on the same API client and namespace (and the same bounds)."""

    def __init__(self, backend: KubernetesBackend, namespace: str) -> None:
        self.namespace = namespace
        self.base = backend
        self.kinds = {
            kind: KubernetesBackend(
                kubernetes_conn_id=backend.kubernetes_conn_id,
                namespace=namespace,
                kind=kind,
                api_client=backend.api_client,
                api_timeout=backend.api_timeout,
            )
            for kind in registered_kinds()
        }

    def backend_for(self, job_name: str) -> KubernetesBackend:
        """The backend of a job's kind: from its own objects' owners, else from its top object
        alone (the others may be gone already); ``JobNotFound`` if nothing of it is there."""
        for plural in JOB_PLURALS:
            found = self.base.objects.list(self.namespace, plural, job_selector(job_name))
            if found:
                return self.kinds[kind_of(found[0]).name]
        for backend in self.kinds.values():  # the registry's order: plain pods (a Service) first
            if backend.job_exists(job_name, self.namespace):
                return backend
        raise JobNotFound(
            f"no job {job_name} in namespace {self.namespace}: `airflow-mpi jobs --namespace {self.namespace}` "
            "lists the jobs there"
        )


def list_jobs(backend: KubernetesBackend, namespace: str, now: float | None = None) -> list[JobRow]:
    """Every job of this product in the namespace, whichever backend made it, oldest first (two
    list requests: our ConfigMaps' metadata, one per job, and our pods). No Secret is read: the
    identity, owner and age of a job are in its ConfigMap's labels, annotations and owner."""
    now = time.time() if now is None else now
    anchors = backend.objects.list_metadata(namespace, "configmaps", MANAGED_SELECTOR)
    pods: dict[str, list[Obj]] = defaultdict(list)
    for pod in backend.objects.list(namespace, "pods", MANAGED_SELECTOR):
        pods[(pod["metadata"].get("labels") or {}).get(LABEL_JOB, "")].append(pod)
    rows: dict[str, JobRow] = {}
    for anchor in anchors:
        name = (anchor["metadata"].get("labels") or {}).get(LABEL_JOB, "")
        if not name or name in rows:
            continue
        kind = kind_of(anchor)
        states = kind.listed_states(pods.get(name, []))
        rows[name] = summarize_job(anchor, pods.get(name, []), now, states=states, backend=kind.name)
    return sorted(rows.values(), key=lambda row: (-row.age_s, row.name))


def read_master_log(backend: KubernetesBackend, job_name: str, namespace: str) -> list[str]:
    """The master's log as it is now (the job's backend says which pod that is: an MPIJob's is
    its newest launcher pod), each rank's lines reassembled (as ``run`` shows them)."""
    backend = Cluster(backend, namespace).backend_for(job_name)
    master = backend.master_pod_name(job_name, namespace)
    try:
        data = backend.objects.read_log(namespace, master)
    except JobNotFound:
        raise JobNotFound(f"job {job_name} has no master pod (yet): nothing logged") from None
    splitter = RankLineSplitter()
    lines = splitter.feed(data) + splitter.flush()
    return [plain_line(line) for line in lines if not isinstance(line, PartialLine)]


def follow_master_log(backend: KubernetesBackend, job_name: str, namespace: str) -> Iterator[list[str]]:
    """The master's log live, through the job's own backend (which pod, resumed after drops)."""
    backend = Cluster(backend, namespace).backend_for(job_name)
    try:
        yield from backend.follow_master(job_name)
    finally:
        backend.release(job_name)


def plain_line(line: str) -> str:
    """A line as a terminal should get it: a rewritten line's final state without its ``\r``."""
    tag, text = split_tag(line)
    return tag + text[1:] if text.startswith("\r") else line


def delete_job(backend: KubernetesBackend, job_name: str, namespace: str, wait: float = DELETE_WAIT) -> list[str]:
    """Delete the job through its backend's own teardown (its Service, Volcano Job or MPIJob: the
    rest goes with it) and wait until that backend finds nothing of it left; what is left of our
    own kinds by then is deleted directly. Returns what is still there after that (empty on
    success); ``JobNotFound`` if there was no such job."""
    backend = Cluster(backend, namespace).backend_for(job_name)
    backend.teardown(job_name)
    deadline = time.monotonic() + wait
    while True:
        left = backend.leftovers(job_name)
        if not left:
            return []
        if time.monotonic() >= deadline:
            break
        time.sleep(0.3)
    since = time.monotonic()
    for item in left:  # the collector is slow or off
        kind, _, name = item.partition(" ")
        if kind in CORE_KINDS:
            backend.objects.delete(namespace, CORE_KINDS[kind], name, since)
    return backend.leftovers(job_name)


def check_access(backend: KubernetesBackend, namespace: str) -> tuple[bool, str]:
    """One list of the namespace's pods (what every job's watch does) and a read of the namespace:
    (True, what answered) or (False, what failed and what to change). No retries: a connection
    test says at once that the API cannot be reached."""
    url = backend.api_url
    request = ApiRequest("list", "pods", namespace)
    try:
        response = backend.objects.core.list_namespaced_pod(
            namespace, limit=1, _preload_content=False, _request_timeout=CHECK_TIMEOUT
        )
        listed = len(json.loads(response.data).get("items") or [])
    except Exception as error:
        if api_status(error) is None and certificate_rejected(error) is None:
            return False, f"cannot reach the Kubernetes API at {url} ({_reason(error)}): check the server address"
        return False, explain(error, request, url)
    try:
        backend.objects.core.read_namespace(namespace, _preload_content=False, _request_timeout=CHECK_TIMEOUT)
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
