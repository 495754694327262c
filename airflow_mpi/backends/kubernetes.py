"""Kubernetes backend: exactly the objects ``airflow-mpi render`` prints, core API only.

Per job: a headless Service (the owner of everything else: deleting it garbage-collects the job),
a Secret (ssh material), a ConfigMap (launch script, mpiexec arguments, hostfile), worker pods
(created concurrently) and, once every worker is Ready, the master pod.

API use is event-driven: one watch over the job's pods (label selector) for readiness, failures
and the end, resumed from its resourceVersion, relisted on 410 Gone; one followed log stream for
the master, resumed after a drop from the last line's own timestamp (``LogCursor``), so no line
is shown twice or lost whatever the clock skew. A job costs N + 10 API requests for N workers.

Every wait ends: each request carries a read timeout, 429/5xx and connection failures are retried
only until the API has been silent for ``api_timeout`` seconds (``ApiSilence``), and a refusal
(401, 403, 404, 422) ends the wait at once with what to change (``k8s_errors.explain``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
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
from airflow_mpi.backends.custom_objects import CustomObjects
from airflow_mpi.backends.k8s_errors import (
    API_TIMEOUT,
    BAD_REQUEST,
    CONFLICT,
    FORBIDDEN,
    GONE,
    NOT_FOUND,
    RBAC_DOC,
    ApiRequest,
    ApiSilence,
    api_status,
    deleted,
    is_refusal,
    is_transient,
    read_or_none,
    retry_delay,
    translate,
)
from airflow_mpi.exceptions import BackendError, BackendUnavailable, BackendUnreachable, JobNotFound, LaunchError
from airflow_mpi.gang import (
    KUEUE_WORKLOAD,
    POD_GROUP_KINDS,
    describe_group_wait,
    render_gang_manifests,
)
from airflow_mpi.logcursor import LogCursor, TimestampedLogSplitter
from airflow_mpi.manifests import (
    PLACEHOLDER_UID,
    config_map_name,
    render_manifests,
    render_owner_reference,
    secret_name,
)
from airflow_mpi.naming import LABEL_JOB, LABEL_TRY_NUMBER, RunIdentity, build_pod_name, job_selector, run_selector
from airflow_mpi.permissions import (
    POD_BACKEND_RULES,
    Permission,
    build_permissions,
    missing_permissions,
    render_missing,
)
from airflow_mpi.plan import JobPlan
from airflow_mpi.podlog import LineSplitter, RankLineSplitter
from airflow_mpi.readiness import HostProbe, probes_from_states
from airflow_mpi.spec import MPIJobSpec, Role
from airflow_mpi.status import PodPhase, PodState, PodTable, WatchLoop, pod_state_from_k8s

_log = logging.getLogger(__name__)
# The one API-dispatch table: each plural as CoreV1Api spells it in ``<verb>_namespaced_<kind>``.
KINDS = {"services": "service", "secrets": "secret", "configmaps": "config_map", "pods": "pod"}
WATCH_SECONDS = 290  # the API server ends a watch by itself after at most ~5-10 minutes
LOG_READ_TIMEOUT = 60.0  # a quiet stream is reopened (from the cursor) after this
TEARDOWN_WAIT = 60.0  # for the pods to go once the API has accepted the delete
TAIL_READ_TIMEOUT = 10.0  # a failure message's "last lines" are not worth a longer wait
GC_SETTLE = 5.0  # seconds leftovers gives the garbage collector once the owner Service is gone
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
    # The master's output across reconnects: each rank's unfinished line survives a dropped stream.
    lines: RankLineSplitter = field(default_factory=RankLineSplitter)
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
        api_timeout: float = API_TIMEOUT,
    ) -> None:
        self.kubernetes_conn_id = kubernetes_conn_id
        self._namespace = namespace
        self._api_client = api_client
        self.create_concurrency = create_concurrency
        self.log_read_timeout = log_read_timeout
        self.api_timeout = api_timeout
        self._jobs: dict[str, _Job] = {}
        self._permitted: set[str] = set()  # namespaces whose permissions were checked

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
        return ApiClient(configure_client(configuration, self.create_concurrency))

    @property
    def api_url(self) -> str:
        return str(self.api_client.configuration.host)

    @cached_property
    def silence(self) -> ApiSilence:
        """How long the API has not answered, across every request and job of this backend."""
        return ApiSilence(self.api_url, self.api_timeout)

    @cached_property
    def custom(self) -> CustomObjects:
        """Custom objects (PodGroups, Kueue Workloads, Volcano Jobs), bounded as the core ones."""
        return CustomObjects(self.api_client, self._send, self.api_url)

    @cached_property
    def core(self) -> Any:
        from kubernetes.client import CoreV1Api

        return CoreV1Api(self.api_client)

    def _api(self, verb: str, plural: str) -> Callable[..., Any]:
        """``CoreV1Api.<verb>_namespaced_<kind>`` for ``plural`` (e.g. create, "pods")."""
        return getattr(self.core, f"{verb}_namespaced_{KINDS[plural]}")  # type: ignore[no-any-return]

    def _send(self, call: Callable[[tuple[float, float]], Any], since: float | None = None) -> Any:
        """Make one request (``call(request_timeout)``), retrying 429/5xx answers and connection
        failures until the API has been silent for ``api_timeout`` since ``since`` (default: now),
        then ``BackendUnreachable``. Any other error is the caller's to read (404, 409 ...)."""
        since = time.monotonic() if since is None else since
        attempt = 0
        while True:
            try:
                result = call(self.silence.request_timeout(since))
            except Exception as error:
                self.silence.failed(error)
                if not is_transient(error):
                    raise
                if self.silence.exceeded(since):
                    raise self.silence.error(since) from error
                time.sleep(min(retry_delay(error, attempt), max(0.0, self.silence.left(since))))
                attempt += 1
                continue
            self.silence.answered()
            return result

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

    # What this backend's credentials must be allowed (checked once per namespace, before the
    # first create); a backend that manages other resources names its own, or none to skip.
    required_permissions: tuple[Permission, ...] = build_permissions(POD_BACKEND_RULES)

    def check_permissions(self, namespace: str) -> None:
        """Fail before anything is created when the credentials lack a verb the job needs (one
        SelfSubjectRulesReview). An answer the server marks incomplete (a webhook authorizer) is
        not judged: the requests themselves will say."""
        if not self.required_permissions or namespace in self._permitted:
            return
        from kubernetes.client import AuthorizationV1Api

        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectRulesReview",
            "spec": {"namespace": namespace},
        }
        api = AuthorizationV1Api(self.core.api_client)
        try:
            response = self._send(
                lambda timeout: api.create_self_subject_rules_review(
                    review, _preload_content=False, _request_timeout=timeout
                )
            )
        except BackendError:
            raise
        except Exception as error:
            if api_status(error) in (FORBIDDEN, NOT_FOUND):  # reviews not allowed or served: cannot check
                self._permitted.add(namespace)
                return
            raise translate(error, ApiRequest("create", "selfsubjectrulesreviews", namespace), self.api_url) from error
        status = json.loads(response.data or b"{}").get("status") or {}
        missing = missing_permissions(status.get("resourceRules") or [], self.required_permissions)
        if missing and not status.get("incomplete"):
            raise LaunchError(render_missing(missing, namespace, RBAC_DOC))
        self._permitted.add(namespace)

    def create(self, plan: JobPlan) -> None:
        namespace = self.namespace_for(plan.spec)
        self.check_permissions(namespace)
        manifests = render_gang_manifests(plan, namespace, owner_uid=PLACEHOLDER_UID)
        try:
            service = self._create_service(namespace, manifests[0])
            owner = render_owner_reference(plan, service["metadata"]["uid"])
            # Watch from the Service's version: every event of the pods created next is seen.
            job = self._watch(plan, namespace, service["metadata"]["resourceVersion"])
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
        except BaseException as error:
            # Even a create that timed out may have been applied. Not when the API has just been
            # silent for the whole bound, though: the caller's teardown (bounded) tries that again.
            if not isinstance(error, BackendUnreachable):
                with contextlib.suppress(Exception):  # the create's own error is the one to raise
                    self.teardown(plan.job_name, namespace)
                # A refused pod (e.g. by PodSecurity admission) leaves no pod for teardown to wait
                # on: delete the Secret and ConfigMap now rather than at the garbage collector's pace.
                for delete, name in (
                    (self.core.delete_namespaced_secret, secret_name(plan.job_name)),
                    (self.core.delete_namespaced_config_map, config_map_name(plan.job_name)),
                ):
                    with contextlib.suppress(Exception):
                        delete(name, namespace, _preload_content=False)
            raise

    def _create_gang(self, namespace: str, job: _Job, objects: list[Obj]) -> None:
        """A gang waits until all its pods exist: the PodGroup, then the master with the workers
        at once (the master's launch script waits for the workers' sshd itself)."""
        pods = [obj for obj in objects if obj["kind"] == "Pod"]
        gang = job.plan.spec.scheduling.gang if job.plan else None
        for group in (obj for obj in objects if obj["kind"] != "Pod"):
            if gang in POD_GROUP_KINDS:
                self.custom.create(namespace, POD_GROUP_KINDS[gang], group)
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
        return describe_group_wait(pods, job.plan.spec.scheduling.queue)

    def _watch(self, plan: JobPlan, namespace: str, resource_version: str) -> _Job:
        job = _Job(
            name=plan.job_name,
            namespace=namespace,
            watcher=PodWatcher(self.core, namespace, job_selector(plan.job_name), self.silence),
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
        """POST, retried on 429/5xx and connection errors (bounded by ``api_timeout``). A 409 after
        a retried POST means the first attempt went through: the existing object is ours when
        labels agree."""
        create = self._api("create", plural)
        name = manifest["metadata"]["name"]
        attempts = 0

        def post(timeout: tuple[float, float]) -> Any:
            nonlocal attempts
            attempts += 1
            return create(namespace, manifest, _preload_content=False, _request_timeout=timeout)

        try:
            return dict(json.loads(self._send(post).data))
        except BackendError:
            raise
        except Exception as error:
            if api_status(error) == CONFLICT:
                existing = self._read(namespace, plural, name)
                if attempts > 1 and existing is not None and _same_job(existing, manifest):
                    return existing
                raise _AlreadyExists(f"{plural[:-1]} {name} already exists in {namespace}", existing) from error
            raise translate(error, ApiRequest("create", plural, namespace, name), self.api_url) from error

    def _read(self, namespace: str, plural: str, name: str) -> Obj | None:
        read = self._api("read", plural)
        return read_or_none(
            lambda: self._send(lambda timeout: read(name, namespace, _preload_content=False, _request_timeout=timeout)),
            ApiRequest("get", plural, namespace, name),
            self.api_url,
        )

    def _delete_and_wait(self, namespace: str, name: str, existing: Obj | None, timeout: float = TEARDOWN_WAIT) -> None:
        from kubernetes.client import V1DeleteOptions

        with contextlib.suppress(Exception):
            self._api("delete", "services")(
                name,
                namespace,
                body=V1DeleteOptions(propagation_policy="Foreground"),
                _preload_content=False,
                _request_timeout=self.silence.request_timeout(time.monotonic()),
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
        watcher = PodWatcher(self.core, namespace, job_selector(job_name), self.silence)
        watcher.start("")
        watcher.wait_listed(30)
        try:
            watcher.check()
        except BackendError:
            watcher.stop()
            raise
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
        """From the watch; raises what ended it (a refusal, or an API silent past ``api_timeout``)."""
        job = self._job(job_name)
        job.watcher.check()
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
        yield from self._follow(job, idle_tick)
        last = job.lines.flush()  # lines the master left unfinished when it ended
        if last:
            yield last

    def _follow(self, job: _Job, idle_tick: float) -> Iterator[list[str]]:
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
                self.silence.answered()
            except Exception as error:
                self.silence.failed(error)
                status = api_status(error)
                if status == NOT_FOUND or (state.ended and status == BAD_REQUEST):
                    return  # gone, or ended without ever starting (e.g. an image error)
                if status == BAD_REQUEST or is_transient(error):
                    # 400: the container is not up yet. A transient failure is bounded by the
                    # watch: pod_states raises once the API has been silent for api_timeout.
                    job.watcher.wait(min(0.2 * (reconnects + 1), 2.0))
                    reconnects += 1
                    yield []
                    continue
                request = ApiRequest("get", "pods/log", job.namespace, job.master)
                raise translate(error, request, self.api_url) from error
            clean = yield from self._read_stream(job, response, idle_tick)
            if clean and self._master_state(job).ended:
                return
            reconnects += 1
            job.watcher.wait(0.2 if clean else 0.05)  # let the watch catch up with the pod's end
            # The runner's turn: a stream that keeps ending at once (a node that lost the
            # container while its pod says Running) must not keep its timeout from running.
            yield []

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
            _request_timeout=self.silence.request_timeout(time.monotonic(), read=self.log_read_timeout),
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
        # Bytes after each line's stamp go on to the job's splitter as they come: a line that
        # never ends (a progress bar) costs no memory, and a resumed stream skips, to the byte,
        # what the cursor says was read (a line broken off by a drop goes on where it stopped).
        stream = TimestampedLogSplitter(job.cursor, job.lines)
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
                batch: list[str] = stream.feed(item)
                batch += job.lines.progress()
                if batch:
                    yield batch
        finally:
            with contextlib.suppress(Exception):
                response.shutdown()
            with contextlib.suppress(Exception):
                response.release_conn()
            reader.join(2)
        return clean

    def pod_log_tail(self, job_name: str, pod: str, lines: int = 20) -> list[str]:
        """The pod's last lines, for a failure message: [] when they cannot be had quickly."""
        job = self._job(job_name)
        for _ in range(2):  # one retry: a pooled connection the server has closed meanwhile
            try:
                response = self.core.read_namespaced_pod_log(
                    pod,
                    job.namespace,
                    container=contract.CONTAINER_NAME,
                    tail_lines=lines,
                    _preload_content=False,
                    _request_timeout=self.silence.request_timeout(time.monotonic(), read=TAIL_READ_TIMEOUT),
                )
            except Exception as error:
                if is_transient(error):
                    continue
                return []
            return [line for line in response.data.decode("utf-8", "replace").splitlines() if line.strip()]
        return []

    def release(self, job_name: str) -> None:
        """Stop watching a job without touching it (a sensor's poke is done)."""
        job = self._jobs.pop(job_name, None)
        if job is not None:
            job.watcher.stop()

    # --- teardown -------------------------------------------------------------------------

    def teardown(self, job_name: str, namespace: str | None = None) -> None:
        """Delete the Service: the garbage collector deletes the rest. Waits until the job's pods
        are gone (deleting any the collector has not reached in time). Bounded: when the API
        refuses or stays silent for ``api_timeout``, raises that error (the job may be left)."""
        job = self._jobs.get(job_name)
        namespace = job.namespace if job else namespace or self._namespace or "default"
        since = time.monotonic()
        try:
            try:
                self._delete(namespace, "services", job_name, since, propagation="Background")
            except BackendError as error:
                raise type(error)(
                    f"{error}; then delete the Service {job_name} in namespace {namespace} (kubectl delete service "
                    f"{job_name} -n {namespace}): the job's other objects and pods go with it"
                ) from error
            failed: BackendError | None = None
            try:  # before the wait: Kueue's finalizer holds the pods until its Workload goes
                self._delete_kueue_workload(job, job_name, namespace, since)
            except BackendError as error:
                failed = error
            if job is None:
                if failed is not None:
                    raise failed
                return
            watcher = job.watcher
            deadline = time.monotonic() + TEARDOWN_WAIT
            with watcher.cond:
                while watcher.table.pods and time.monotonic() < deadline and watcher.alive:
                    watcher.cond.wait(0.5)
                left = list(watcher.table.pods) if watcher.alive else None
            if left is None:  # no watch to tell: ask; if the API will not say, the collector has them
                with contextlib.suppress(BackendError):
                    left = [p["metadata"]["name"] for p in self._list(namespace, "pods", job_selector(job_name), since)]
            left = left or []
            job.final_pods = left
            if left:
                failed = self._delete_without_collector(namespace, job_name, left, since) or failed
            if failed is not None:
                raise failed
        finally:
            if job is not None:
                job.watcher.stop()

    def _delete_without_collector(
        self, namespace: str, job_name: str, pods: list[str], since: float
    ) -> BackendError | None:
        """The garbage collector did not remove the job's pods in ``TEARDOWN_WAIT``: it is slow or
        not running. Delete the pods and the objects the Service owned (the Secret holds the job's
        private key) directly, and say so."""
        _log.warning(
            "the garbage collector did not delete the pods of job %s within %.0f s (is kube-controller-manager "
            "running?): deleting the job's pods, Secret and ConfigMap directly",
            job_name,
            TEARDOWN_WAIT,
        )
        failed: BackendError | None = None
        objects = [("pods", pod) for pod in pods]
        for plural in ("secrets", "configmaps"):
            with contextlib.suppress(BackendError):
                objects += [
                    (plural, o["metadata"]["name"])
                    for o in self._list(namespace, plural, job_selector(job_name), since)
                ]
        for plural, name in objects:
            try:
                self._delete(namespace, plural, name, since)
            except BackendError as error:
                failed = failed or error
        return failed

    def _delete(self, namespace: str, plural: str, name: str, since: float, propagation: str = "") -> bool:
        """DELETE one object (bounded by ``api_timeout`` from ``since``); False if it was gone."""
        from kubernetes.client import V1DeleteOptions

        delete = self._api("delete", plural)
        body = V1DeleteOptions(propagation_policy=propagation) if propagation else None
        return deleted(
            lambda: self._send(
                lambda timeout: delete(name, namespace, body=body, _preload_content=False, _request_timeout=timeout),
                since,
            ),
            ApiRequest("delete", plural, namespace, name),
            self.api_url,
        )

    def _delete_kueue_workload(self, job: _Job | None, job_name: str, namespace: str, since: float) -> None:
        """Kueue keeps a finalizer on the group's pods until its Workload (named after the group,
        the job) finishes, which never happens while workers run: delete it, and Kueue lets go."""
        if job is None or job.plan is None or job.plan.spec.scheduling.gang is None:
            return
        if job.plan.spec.scheduling.gang.value == "kueue":
            self.custom.delete(namespace, KUEUE_WORKLOAD, job_name, since=since)

    def leftovers(self, job_name: str) -> list[str]:
        """What of the job still exists, by listing (Services, Secrets, ConfigMaps, and the pods
        the watch saw last). Dependents of a Service already gone are given ``GC_SETTLE`` seconds:
        the garbage collector deletes them shortly after their owner."""
        job = self._jobs.pop(job_name, None)
        namespace = job.namespace if job else self._namespace or "default"
        selector = job_selector(job_name)
        since = time.monotonic()
        plurals = ("services", "secrets", "configmaps", *(("pods",) if job is None or job.final_pods else ()))
        while True:
            found = [
                f"{plural[:-1]} {o['metadata']['name']}"
                for plural in plurals
                for o in self._list(namespace, plural, selector, since)
            ]
            owner_there = any(item.startswith("service ") for item in found)
            if not found or owner_there or time.monotonic() - since >= GC_SETTLE:
                return found
            time.sleep(0.2)

    def _list(self, namespace: str, plural: str, selector: str, since: float | None = None) -> list[Obj]:
        """One list (bounded by ``api_timeout`` from ``since``, default now)."""
        list_ = self._api("list", plural)
        try:
            response = self._send(
                lambda timeout: list_(
                    namespace, label_selector=selector, _preload_content=False, _request_timeout=timeout
                ),
                since,
            )
        except BackendError:
            raise
        except Exception as error:
            raise translate(error, ApiRequest("list", plural, namespace), self.api_url) from error
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
        watcher.check()
        with watcher.cond:
            if plan.master.name in watcher.table.pods:
                job.roles[plan.master.name] = Role.MASTER
            return watcher.table.states(job.roles)

    # --- the cluster CLI: whose job an object is, its pods' states, its master pod ----------

    # The (apiVersion, kind) of the object that owns a job's objects: what deleting takes it all.
    top_owner: tuple[str, str] = ("v1", "Service")

    @classmethod
    def owns(cls, obj: Obj) -> bool:
        """Whether a job's object (our Secret, a pod) is of a job this backend made, by its owner."""
        refs = obj.get("metadata", {}).get("ownerReferences") or []
        return any((ref.get("apiVersion"), ref.get("kind")) == cls.top_owner for ref in refs)

    def job_exists(self, job_name: str, namespace: str) -> bool:
        """Whether the job's top object (here its Service) is there."""
        return self._read(namespace, "services", job_name) is not None

    def job_pod_states(self, pods: list[Obj]) -> list[PodState]:
        """The states that decide a job's phase, from its pods as listed (no watch)."""
        return [pod_state_from_k8s(pod) for pod in pods]

    def master_pod_name(self, job_name: str, namespace: str) -> str:
        """The pod whose log is the job's: the master's fixed name here."""
        return build_pod_name(job_name, Role.MASTER, 0)


class PodWatcher:
    """One watch over a job's pods in a thread, kept in a ``PodTable``; waiters wake on events.
    The thread drives the shared ``WatchLoop`` (list, watch, relist on 410, back off) until it is
    stopped, the API refuses (401, 403, 404 ...), or the API has been silent for the bound; then
    ``check`` raises why, so no waiter waits on a watch that has ended."""

    def __init__(self, core: Any, namespace: str, selector: str, silence: ApiSilence) -> None:
        self.core, self.namespace, self.selector = core, namespace, selector
        self.silence = silence
        self.loop = WatchLoop(first_backoff=0.1)
        self.cond = threading.Condition()
        self.error: BackendError | None = None
        self._stop = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self._listed = False
        self._since = time.monotonic()

    @property
    def table(self) -> PodTable:
        return self.loop.table

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, resource_version: str) -> None:
        self.table.resource_version = resource_version
        self._since = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.selector}", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raise what ended the watch, or ``BackendUnreachable`` once the API has been silent
        for the bound (even while a request of the thread still hangs)."""
        if self.error is not None:
            raise self.error
        if self.silence.exceeded(self._since):
            raise self.silence.error(self._since)

    def wait(self, timeout: float) -> None:
        with self.cond:
            self.cond.wait(timeout)

    def wait_listed(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self._listed and self.error is None and time.monotonic() < deadline:
                if self.silence.exceeded(self._since):
                    return
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
        response = self.core.list_namespaced_pod(
            self.namespace,
            label_selector=self.selector,
            _preload_content=False,
            _request_timeout=self.silence.request_timeout(self._since),
        )
        data = json.loads(response.data)
        self.silence.answered()
        with self.cond:
            self.loop.listed(data.get("items") or [], data["metadata"]["resourceVersion"])
            self._listed = True
            self.cond.notify_all()

    def _watch(self) -> Any:
        # A quiet watch must still end (and so answer) well within the bound.
        seconds = self.silence.watch_seconds(WATCH_SECONDS)
        return self.core.list_namespaced_pod(
            self.namespace,
            label_selector=self.selector,
            watch=True,
            resource_version=self.table.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=seconds,
            _preload_content=False,
            _request_timeout=self.silence.request_timeout(self._since, read=seconds + self.silence.limit / 2),
        )

    def _run(self) -> None:
        loop = self.loop
        while not self._stop.is_set():
            verb = "list"  # the RBAC verb of the request under way, for a refusal's message
            try:
                if loop.must_list:
                    self._list()
                else:
                    with self.cond:
                        self._listed = True
                        self.cond.notify_all()
                verb = "watch"
                self._response = self._watch()
                self.silence.answered()
                for event in _watch_events(self._response):
                    self.silence.answered()
                    with self.cond:
                        current = loop.apply(event)
                        self.cond.notify_all()
                    if not current:
                        break
                loop.watch_ended()
            except Exception as error:
                if self._stop.is_set():
                    break
                self.silence.failed(error)
                if is_refusal(error):
                    self._end(translate(error, ApiRequest(verb, "pods", self.namespace), self.silence.api_url))
                    break
                if self.silence.exceeded(self._since):
                    self._end(self.silence.error(self._since))
                    break
                delay = loop.failed(gone=api_status(error) == GONE)
                self._stop.wait(min(delay, max(0.05, self.silence.left(self._since))))
            finally:
                response, self._response = self._response, None
                if response is not None:
                    with contextlib.suppress(Exception):
                        response.release_conn()
        with self.cond:
            self.cond.notify_all()

    def _end(self, error: BackendError) -> None:
        with self.cond:
            self.error = error
            self.cond.notify_all()


def _watch_events(response: Any) -> Iterator[Obj]:
    """The events of a watch response (one JSON object a line; no cap: the API server bounds them)."""
    lines = LineSplitter(max_bytes=None)
    for chunk in response.stream(65536, decode_content=False):
        yield from (json.loads(line) for line in lines.feed(chunk) if line.strip())
    yield from (json.loads(line) for line in lines.flush() if line.strip())


def configure_client(configuration: Any, concurrency: int = 16) -> Any:
    """What every request of the backend relies on, set on a client ``Configuration``: one pooled
    connection per create thread, and no retries inside urllib3 (the backend retries itself,
    bounded by ``api_timeout``; urllib3's would repeat a hung read up to three times)."""
    configuration.connection_pool_maxsize = max(concurrency + 4, 16)
    configuration.retries = 0
    return configuration


def _same_job(existing: Obj, manifest: Obj) -> bool:
    ours = manifest["metadata"].get("labels", {}).get(LABEL_JOB)
    return bool(ours) and (existing.get("metadata", {}).get("labels") or {}).get(LABEL_JOB) == ours
