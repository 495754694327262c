"""Kubernetes backend: exactly the objects ``airflow-mpi render`` prints, core API only.

Per job: a headless Service (the owner of everything else: deleting it garbage-collects the job),
a Secret (ssh material), a ConfigMap (launch script, mpiexec arguments, hostfile), worker pods
(created concurrently) and, once every worker is Ready, the master pod.

API use is event-driven: one watch over the job's pods (label selector) for readiness, failures
and the end, resumed from its resourceVersion, relisted on 410 Gone; one followed log stream for
the master, resumed after a drop from the last line's own timestamp (``LogCursor``), so no line
is shown twice or lost whatever the clock skew. A job costs N + 10 API requests for N workers.
"""

from __future__ import annotations

import contextlib
import copy
import json
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from airflow_mpi import contract
from airflow_mpi.backends.base import FoundJob
from airflow_mpi.backends.k8s_errors import (
    BAD_REQUEST,
    CONFLICT,
    GONE,
    NOT_FOUND,
    api_status,
    is_transient,
    retry_delay,
    translate,
)
from airflow_mpi.exceptions import BackendUnavailable, JobNotFound, LaunchError
from airflow_mpi.gang import (
    KUEUE_WORKLOAD,
    POD_GROUP_KINDS,
    describe_group_wait,
    render_gang_manifests,
)
from airflow_mpi.logstream import LineSplitter, LogCursor, split_timestamped
from airflow_mpi.manifests import PLACEHOLDER_UID, render_manifests, render_owner_reference
from airflow_mpi.naming import LABEL_JOB, LABEL_TRY_NUMBER, RunIdentity, build_pod_name, job_selector, run_selector
from airflow_mpi.plan import JobPlan
from airflow_mpi.readiness import HostProbe, probes_from_states
from airflow_mpi.spec import MPIJobSpec, Role
from airflow_mpi.status import PodPhase, PodState, PodTable, WatchLoop, pod_state_from_k8s

# The one API-dispatch table: each plural as CoreV1Api spells it in ``<verb>_namespaced_<kind>``.
KINDS = {"services": "service", "secrets": "secret", "configmaps": "config_map", "pods": "pod"}
CREATE_ATTEMPTS = 6
WATCH_SECONDS = 290  # the API server ends a watch by itself after at most ~5-10 minutes
LOG_READ_TIMEOUT = 60.0  # a quiet stream is reopened (from the cursor) after this
TEARDOWN_WAIT = 60.0
EOF = object()

Obj = dict[str, Any]


@dataclass
class _Job:
    name: str
    namespace: str
    watcher: PodWatcher
    roles: dict[str, Role]  # worker pods, and the master once it is created
    master: str
    plan: JobPlan | None = None
    master_manifest: Obj | None = None
    cursor: LogCursor = field(default_factory=LogCursor)
    final_pods: list[str] = field(default_factory=list)
    seen_events: int = -1  # the watch's event count when pod states were last read


class _AlreadyExists(LaunchError):
    def __init__(self, message: str, existing: Obj | None) -> None:
        super().__init__(message)
        self.existing = existing


class KubernetesBackend:
    """Runs a plan's pods on a Kubernetes cluster through the cncf provider's hook."""

    name = "kubernetes"

    def __init__(
        self,
        kubernetes_conn_id: str = "kubernetes_default",
        namespace: str | None = None,
        *,
        api_client: Any = None,
        create_concurrency: int = 16,
        log_read_timeout: float = LOG_READ_TIMEOUT,
    ) -> None:
        self.kubernetes_conn_id = kubernetes_conn_id
        self._namespace = namespace
        self._api_client = api_client
        self.create_concurrency = create_concurrency
        self.log_read_timeout = log_read_timeout
        self._jobs: dict[str, _Job] = {}

    # --- clients --------------------------------------------------------------------------

    @cached_property
    def _hook(self) -> Any:
        try:
            from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
        except ImportError as error:  # pragma: no cover - a declared dependency
            raise BackendUnavailable("apache-airflow-providers-cncf-kubernetes is not installed") from error
        return KubernetesHook(conn_id=self.kubernetes_conn_id)

    @cached_property
    def api_client(self) -> Any:
        from kubernetes.client import ApiClient

        if self._api_client is not None:
            return self._api_client
        try:
            configuration = copy.copy(self._hook.api_client.configuration)
        except Exception as error:
            raise BackendUnavailable(
                f"cannot reach Kubernetes through connection {self.kubernetes_conn_id!r}: {error}"
            ) from error
        # Concurrent creates of many workers: one pooled connection per thread.
        configuration.connection_pool_maxsize = max(self.create_concurrency + 4, 16)
        return ApiClient(configuration)

    @cached_property
    def core(self) -> Any:
        from kubernetes.client import CoreV1Api

        return CoreV1Api(self.api_client)

    def _api(self, verb: str, plural: str) -> Callable[..., Any]:
        """``CoreV1Api.<verb>_namespaced_<kind>`` for ``plural`` (e.g. create, "pods")."""
        return getattr(self.core, f"{verb}_namespaced_{KINDS[plural]}")  # type: ignore[no-any-return]

    def namespace_for(self, spec: MPIJobSpec) -> str:
        if spec.pod.namespace:
            return spec.pod.namespace
        if self._namespace:
            return self._namespace
        if self._api_client is None:
            with contextlib.suppress(Exception):
                namespace = self._hook.get_namespace()
                if namespace:
                    return str(namespace)
        return "default"

    # --- create ---------------------------------------------------------------------------

    def create(self, plan: JobPlan) -> None:
        namespace = self.namespace_for(plan.spec)
        manifests = render_gang_manifests(plan, namespace, owner_uid=PLACEHOLDER_UID)
        service = self._create_service(namespace, manifests[0])
        owner = render_owner_reference(plan, service["metadata"]["uid"])
        # Watch from the Service's version: every event of the pods created next is seen.
        job = self._watch(plan, namespace, service["metadata"]["resourceVersion"])
        try:
            for manifest in manifests[1:]:
                manifest["metadata"]["ownerReferences"] = [owner]
            secret, config_map, *rest = manifests[1:]
            self._create(namespace, "secrets", secret)
            self._create(namespace, "configmaps", config_map)
            if plan.spec.scheduling.gang is not None:
                self._create_gang(namespace, job, rest)
                return
            *workers, master = rest
            job.master_manifest = master
            if workers:
                with ThreadPoolExecutor(max_workers=min(self.create_concurrency, len(workers))) as pool:
                    for _ in pool.map(lambda pod: self._create(namespace, "pods", pod), workers):
                        pass  # keep none of the (large) responses
        except BaseException:
            self.teardown(plan.job_name)
            raise

    def _create_gang(self, namespace: str, job: _Job, objects: list[Obj]) -> None:
        """A gang waits until all its pods exist: the PodGroup, then the master with the workers
        at once (the master's launch script waits for the workers' sshd itself)."""
        from airflow_mpi.backends.custom_objects import CustomObjects

        pods = [obj for obj in objects if obj["kind"] == "Pod"]
        gang = job.plan.spec.scheduling.gang if job.plan else None
        for group in (obj for obj in objects if obj["kind"] != "Pod"):
            if gang in POD_GROUP_KINDS:
                CustomObjects(self.api_client).create(namespace, POD_GROUP_KINDS[gang], group)
        job.roles[job.master] = Role.MASTER
        with ThreadPoolExecutor(max_workers=min(self.create_concurrency, len(pods))) as pool:
            for _ in pool.map(lambda pod: self._create(namespace, "pods", pod), pods):
                pass

    def starts_master_with_workers(self, plan: JobPlan) -> bool:
        return plan.spec.scheduling.gang is not None

    def custom_objects_to_delete(self, plan: JobPlan) -> list[tuple[str, str, str]]:
        gang = plan.spec.scheduling.gang
        return [KUEUE_WORKLOAD[:3]] if gang is not None and gang.value == "kueue" else []

    def queue_status(self, job_name: str) -> str | None:
        """Why a gang-scheduled job waits for admission (its pods say), or None; a job without
        a gang setting is never queued here: ``startup_timeout`` covers unschedulable pods."""
        job = self._job(job_name)
        if job.plan is None or job.plan.spec.scheduling.gang is None:
            return None
        with job.watcher.cond:
            pods = list(job.watcher.table.pods.values())
        return describe_group_wait(pods)

    def _watch(self, plan: JobPlan, namespace: str, resource_version: str) -> _Job:
        job = _Job(
            name=plan.job_name,
            namespace=namespace,
            watcher=PodWatcher(self.core, namespace, job_selector(plan.job_name)),
            roles={worker.name: Role.WORKER for worker in plan.workers},
            master=plan.master.name,
            plan=plan,
        )
        self._jobs[plan.job_name] = job
        job.watcher.start(resource_version)
        return job

    def _create_service(self, namespace: str, manifest: Obj) -> Obj:
        name = manifest["metadata"]["name"]
        for _ in range(3):
            try:
                return self._create(namespace, "services", manifest)
            except _AlreadyExists as exists:
                # A Service of this very job is there: an earlier attempt of the same try.
                self._delete_and_wait(namespace, name, exists.existing)
        raise LaunchError(f"job {name}: an earlier attempt's objects are still being deleted")

    def _create(self, namespace: str, plural: str, manifest: Obj) -> Obj:
        """POST with bounded retries on 429/5xx and connection errors. A 409 after a retried POST
        means the first attempt went through: the existing object is ours when labels agree."""
        create = self._api("create", plural)
        name = manifest["metadata"]["name"]
        retried = False
        for attempt in range(CREATE_ATTEMPTS):
            try:
                return dict(json.loads(create(namespace, manifest, _preload_content=False).data))
            except Exception as error:
                if api_status(error) == CONFLICT:
                    existing = self._read(namespace, plural, name)
                    if retried and existing is not None and _same_job(existing, manifest):
                        return existing
                    raise _AlreadyExists(f"{plural[:-1]} {name} already exists in {namespace}", existing) from error
                if is_transient(error):
                    retried = True
                    time.sleep(retry_delay(error, attempt))
                    continue
                raise translate(error, f"creating {plural[:-1]} {name} in {namespace}", creating=True) from error
        raise LaunchError(f"creating {plural[:-1]} {name} in {namespace} failed {CREATE_ATTEMPTS} times")

    def _read(self, namespace: str, plural: str, name: str) -> Obj | None:
        try:
            return dict(json.loads(self._api("read", plural)(name, namespace, _preload_content=False).data))
        except Exception as error:
            if api_status(error) == NOT_FOUND:
                return None
            raise translate(error, f"reading {plural[:-1]} {name} in {namespace}") from error

    def _delete_and_wait(self, namespace: str, name: str, existing: Obj | None, timeout: float = TEARDOWN_WAIT) -> None:
        from kubernetes.client import V1DeleteOptions

        with contextlib.suppress(Exception):
            self._api("delete", "services")(
                name, namespace, body=V1DeleteOptions(propagation_policy="Foreground"), _preload_content=False
            )
        deadline = time.monotonic() + timeout
        while self._read(namespace, "services", name) is not None and time.monotonic() < deadline:
            time.sleep(0.5)

    # --- readiness and the master ---------------------------------------------------------

    def _job(self, job_name: str) -> _Job:
        job = self._jobs.get(job_name)
        return job if job is not None else self._attach(job_name)

    def _attach(self, job_name: str) -> _Job:
        """Watch a job this process did not create (a sensor in another task), by name alone:
        the pods' role labels tell who is who."""
        namespace = self._namespace or "default"
        watcher = PodWatcher(self.core, namespace, job_selector(job_name))
        watcher.start("")
        watcher.wait_listed(30)
        with watcher.cond:
            pods = dict(watcher.table.pods)
        if not pods:
            watcher.stop()
            raise JobNotFound(f"no job {job_name} in namespace {namespace} (no pods with its label)")
        states = {name: pod_state_from_k8s(pod) for name, pod in pods.items()}
        roles = {name: state.role for name, state in states.items()}
        master = next((n for n, r in roles.items() if r is Role.MASTER), build_pod_name(job_name, Role.MASTER, 0))
        job = _Job(name=job_name, namespace=namespace, watcher=watcher, roles=roles, master=master)
        self._jobs[job_name] = job
        return job

    def pod_states(self, job_name: str) -> list[PodState]:
        job = self._job(job_name)
        with job.watcher.cond:
            job.seen_events = job.watcher.table.events
            return job.watcher.table.states(job.roles)

    def wait_for_change(self, job_name: str, timeout: float) -> None:
        """Returns at once if an event came since the states were last read (no lost wake-up)."""
        job = self._job(job_name)
        with job.watcher.cond:
            if job.watcher.table.events == job.seen_events:
                job.watcher.cond.wait(timeout)

    def probe_workers(self, job_name: str) -> list[HostProbe]:
        """Readiness from the watch, no request (see ``readiness.probes_from_states``)."""
        job = self._job(job_name)
        return probes_from_states(job_name, self.pod_states(job_name), job.roles)

    def start_master(self, job_name: str) -> None:
        job = self._job(job_name)
        if job.plan is not None and job.plan.spec.scheduling.gang is not None:
            return  # created with the workers (a gang starts whole)
        if job.master_manifest is None:  # adopted after a deferral: the job's Service owns it
            if job.plan is None:
                raise LaunchError(f"job {job_name}: no plan to render its master from")
            service = self._read(job.namespace, "services", job_name)
            if service is None:
                raise JobNotFound(f"job {job_name} is gone (its Service was deleted)")
            uid = service["metadata"]["uid"]
            job.master_manifest = render_manifests(job.plan, job.namespace, owner_uid=uid)[-1]
        job.roles[job.master] = Role.MASTER
        self._create(job.namespace, "pods", job.master_manifest)

    def follow_master(self, job_name: str, idle_tick: float = 0.1) -> Iterator[list[str]]:
        """The master's log, live; resumed from the cursor after drops and read timeouts."""
        job = self._job(job_name)
        job.roles[job.master] = Role.MASTER
        reconnects = 0
        while True:
            state = self._master_state(job)
            if state.phase is PodPhase.PENDING and not state.reason.startswith(("Err", "Image", "Invalid")):
                job.watcher.wait(idle_tick)
                yield []
                continue
            if state.reason == "Deleted":
                return
            since = job.cursor.resume()
            try:
                response = self._open_log(job, since)
            except Exception as error:
                status = api_status(error)
                if status == NOT_FOUND or (state.ended and status == BAD_REQUEST):
                    return  # gone, or ended without ever starting (e.g. an image error)
                if status == BAD_REQUEST or is_transient(error):  # 400: the container is not up yet
                    job.watcher.wait(min(0.2 * (reconnects + 1), 2.0))
                    reconnects += 1
                    yield []
                    continue
                raise translate(error, f"reading the log of {job.master}") from error
            clean = yield from self._read_stream(job, response, idle_tick)
            if clean and self._master_state(job).ended:
                return
            reconnects += 1
            job.watcher.wait(0.2 if clean else 0.05)  # let the watch catch up with the pod's end

    def _master_state(self, job: _Job) -> PodState:
        states = {s.name: s for s in self.pod_states(job.name)}
        return states.get(job.master) or PodState(job.master, Role.MASTER, PodPhase.PENDING)

    def _open_log(self, job: _Job, since: str | None) -> Any:
        query = [("container", contract.CONTAINER_NAME), ("follow", "true"), ("timestamps", "true")]
        if since:
            query.append(("sinceTime", since))  # the client has no since_time parameter
        return self.api_client.call_api(
            f"/api/v1/namespaces/{job.namespace}/pods/{job.master}/log",
            "GET",
            query_params=query,
            header_params={"Accept": "*/*"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
            _request_timeout=(10, self.log_read_timeout),
        )

    def _read_stream(self, job: _Job, response: Any, idle_tick: float) -> Generator[list[str], None, bool]:
        """Yield batches of new lines; returns True on a clean end of stream, False on a drop."""
        chunks: queue.Queue[Any] = queue.Queue(maxsize=64)  # bounded: ~4 MB in flight at most

        def read() -> None:
            try:
                for chunk in response.stream(65536, decode_content=False):
                    chunks.put(chunk)
                chunks.put(EOF)
            except Exception as error:
                chunks.put(error)

        reader = threading.Thread(target=read, name=f"log-{job.master}", daemon=True)
        reader.start()
        lines = LineSplitter()
        clean = False
        try:
            while True:
                try:
                    item = chunks.get(timeout=idle_tick)
                except queue.Empty:
                    yield []
                    continue
                if item is EOF:
                    clean = True
                    break
                if isinstance(item, Exception):
                    break
                batch = []
                for text in lines.feed(item):
                    try:
                        stamp, line = split_timestamped(text)
                    except ValueError:
                        continue  # not a log line (should not happen with timestamps=true)
                    if job.cursor.accept(stamp):
                        batch.append(line)
                if batch:
                    yield batch
        finally:
            with contextlib.suppress(Exception):
                response.shutdown()
            with contextlib.suppress(Exception):
                response.release_conn()
            reader.join(2)
        return clean  # a partial last line of a drop is read again after the resume

    def pod_log_tail(self, job_name: str, pod: str, lines: int = 20) -> list[str]:
        job = self._job(job_name)
        try:
            response = self.core.read_namespaced_pod_log(
                pod, job.namespace, container=contract.CONTAINER_NAME, tail_lines=lines, _preload_content=False
            )
            return [line for line in response.data.decode("utf-8", "replace").splitlines() if line.strip()]
        except Exception:
            return []

    def release(self, job_name: str) -> None:
        """Stop watching a job without touching it (a sensor's poke is done)."""
        job = self._jobs.pop(job_name, None)
        if job is not None:
            job.watcher.stop()

    # --- teardown -------------------------------------------------------------------------

    def teardown(self, job_name: str, namespace: str | None = None) -> None:
        """Delete the Service: the garbage collector deletes the rest. Waits until the job's pods
        are gone (deleting any the collector has not reached in time)."""
        from kubernetes.client import V1DeleteOptions

        job = self._jobs.get(job_name)
        namespace = job.namespace if job else namespace or self._namespace or "default"
        try:
            self._api("delete", "services")(
                job_name, namespace, body=V1DeleteOptions(propagation_policy="Background"), _preload_content=False
            )
        except Exception as error:
            if api_status(error) != NOT_FOUND:
                raise translate(error, f"deleting job {job_name} (its service) in {namespace}") from error
        self._delete_kueue_workload(job, job_name, namespace)
        if job is None:
            return
        watcher = job.watcher
        deadline = time.monotonic() + TEARDOWN_WAIT
        with watcher.cond:
            while watcher.table.pods and time.monotonic() < deadline and watcher.alive:
                watcher.cond.wait(0.5)
            left = list(watcher.table.pods) if watcher.alive else None
        if left is None:  # no watch to tell: ask
            left = [p["metadata"]["name"] for p in self._list(namespace, "pods", job_selector(job_name))]
        for pod in left:  # the collector is slow or off: delete directly
            with contextlib.suppress(Exception):
                self._api("delete", "pods")(pod, namespace, _preload_content=False)
        job.final_pods = left
        watcher.stop()

    def _delete_kueue_workload(self, job: _Job | None, job_name: str, namespace: str) -> None:
        """Kueue keeps a finalizer on the group's pods until its Workload (named after the group,
        the job) finishes, which never happens while workers run: delete it, and Kueue lets go."""
        if job is None or job.plan is None or job.plan.spec.scheduling.gang is None:
            return
        from airflow_mpi.backends.custom_objects import CustomObjects

        if job.plan.spec.scheduling.gang.value == "kueue":
            CustomObjects(self.api_client).delete(namespace, KUEUE_WORKLOAD, job_name)

    def leftovers(self, job_name: str) -> list[str]:
        """What of the job still exists, by listing (Services, Secrets, ConfigMaps, and the pods
        the watch saw last)."""
        job = self._jobs.pop(job_name, None)
        namespace = job.namespace if job else self._namespace or "default"
        selector = job_selector(job_name)
        found = []
        for plural in ("services", "secrets", "configmaps"):
            found += [f"{plural[:-1]} {o['metadata']['name']}" for o in self._list(namespace, plural, selector)]
        if job is None or job.final_pods:
            found += [f"pod {o['metadata']['name']}" for o in self._list(namespace, "pods", selector)]
        return found

    def _list(self, namespace: str, plural: str, selector: str) -> list[Obj]:
        response = self._api("list", plural)(namespace, label_selector=selector, _preload_content=False)
        return list(json.loads(response.data).get("items") or [])

    # --- retries: find and adopt the job of an earlier try ---------------------------------

    def find_jobs(self, identity: RunIdentity, namespace: str) -> list[FoundJob]:
        """Jobs of every try of this task instance (one list request)."""
        found = []
        for service in self._list(namespace, "services", run_selector(identity)):
            labels = service["metadata"].get("labels") or {}
            found.append(
                FoundJob(
                    labels.get(LABEL_JOB, service["metadata"]["name"]), namespace, int(labels.get(LABEL_TRY_NUMBER, 0))
                )
            )
        return sorted(found, key=lambda job: job.try_number)

    def adopt(self, plan: JobPlan, namespace: str) -> list[PodState]:
        """Watch an existing job (an earlier try's) as if it had been created here."""
        job = self._watch(plan, namespace, "")  # list first
        watcher = job.watcher
        watcher.wait_listed(30)
        with watcher.cond:
            if plan.master.name in watcher.table.pods:
                job.roles[plan.master.name] = Role.MASTER
            return watcher.table.states(job.roles)


class PodWatcher:
    """One watch over a job's pods in a thread, kept in a ``PodTable``; waiters wake on events.
    The thread drives the shared ``WatchLoop`` (list, watch, relist on 410, back off)."""

    def __init__(self, core: Any, namespace: str, selector: str) -> None:
        self.core, self.namespace, self.selector = core, namespace, selector
        self.loop = WatchLoop(first_backoff=0.1)
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self._listed = False

    @property
    def table(self) -> PodTable:
        return self.loop.table

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, resource_version: str) -> None:
        self.table.resource_version = resource_version
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.selector}", daemon=True)
        self._thread.start()

    def wait(self, timeout: float) -> None:
        with self.cond:
            self.cond.wait(timeout)

    def wait_listed(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self._listed and time.monotonic() < deadline:
                self.cond.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()
        if self._thread is not None:
            self._thread.join(5)

    def _list(self) -> None:
        response = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector, _preload_content=False)
        data = json.loads(response.data)
        with self.cond:
            self.loop.listed(data.get("items") or [], data["metadata"]["resourceVersion"])
            self._listed = True
            self.cond.notify_all()

    def _run(self) -> None:
        loop = self.loop
        while not self._stop.is_set():
            try:
                if loop.must_list:
                    self._list()
                else:
                    with self.cond:
                        self._listed = True
                        self.cond.notify_all()
                self._response = self.core.list_namespaced_pod(
                    self.namespace,
                    label_selector=self.selector,
                    watch=True,
                    resource_version=self.table.resource_version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=WATCH_SECONDS,
                    _preload_content=False,
                    _request_timeout=(10, WATCH_SECONDS + 30),
                )
                for event in _watch_events(self._response):
                    with self.cond:
                        current = loop.apply(event)
                        self.cond.notify_all()
                    if not current:
                        break
                loop.watch_ended()
            except Exception as error:
                if self._stop.is_set():
                    break
                time.sleep(loop.failed(gone=api_status(error) == GONE))
            finally:
                response, self._response = self._response, None
                if response is not None:
                    with contextlib.suppress(Exception):
                        response.release_conn()
        with self.cond:
            self.cond.notify_all()


def _watch_events(response: Any) -> Iterator[Obj]:
    """The events of a watch response (one JSON object a line; no cap: the API server bounds them)."""
    lines = LineSplitter(max_bytes=None)
    for chunk in response.stream(65536, decode_content=False):
        yield from (json.loads(line) for line in lines.feed(chunk) if line.strip())
    yield from (json.loads(line) for line in lines.flush() if line.strip())


def _same_job(existing: Obj, manifest: Obj) -> bool:
    ours = manifest["metadata"].get("labels", {}).get(LABEL_JOB)
    return bool(ours) and (existing.get("metadata", {}).get("labels") or {}).get(LABEL_JOB) == ours
