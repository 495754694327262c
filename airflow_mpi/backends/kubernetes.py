"""Kubernetes backend: exactly the objects ``airflow-mpi render`` prints, for one job kind.

The kind (``kinds.base.JobKind``: ``pods``, ``volcano``, ``mpijob`` or ``trainjob``) says what
differs: the objects and their top object, how pod states are read, when a job is queued, what
is left over. This module does the I/O for every kind alike, through ``CoreObjects`` and
``CustomObjects``:

- ``pods``: a headless Service (the owner of everything else: deleting it garbage-collects the
  job), a Secret (ssh material), a ConfigMap (launch script, mpiexec arguments, hostfile), and
  the worker and master pods, created concurrently (the master's launch script waits for the
  workers' sshd).
- ``volcano`` / ``mpijob`` / ``trainjob``: the custom top object, whose controller creates the
  pods, and our Secret and ConfigMap owned by it; teardown deletes the top object (in the
  foreground, but for a TrainJob: ``JobKind.deletion_propagation``).

API use is event-driven: one watch over the job's pods (``PodWatcher``) and one followed log
stream for the master (``MasterLogFollow``). A ``pods`` job costs N + 10 requests for N workers.
Every wait ends: requests are bounded by ``api_timeout`` of API silence, and a refusal (401, 403,
404, 422) ends the wait at once with what to change (``k8s_errors.explain``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Any

from airflow_mpi import contract
from airflow_mpi.backends.base import FoundJob
from airflow_mpi.backends.core_objects import CoreObjects
from airflow_mpi.backends.creation import JobCreation
from airflow_mpi.backends.custom_objects import CustomObjects, TopObjects
from airflow_mpi.backends.k8s_errors import API_TIMEOUT, RBAC_DOC, ApiSilence
from airflow_mpi.backends.kube_connection import KubeConnection, connection_named, waiting_client
from airflow_mpi.backends.log_follow import MasterLogFollow
from airflow_mpi.backends.pod_watch import PodWatcher, WatchedJob
from airflow_mpi.backends.removal import JobRemoval
from airflow_mpi.exceptions import BackendError, BackendUnavailable, JobNotFound, LaunchError
from airflow_mpi.job.identity import owned_by
from airflow_mpi.job.naming import RunIdentity, job_selector
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.kinds.base import CONDITION_WAIT, JobKind
from airflow_mpi.kinds.permissions import missing_permissions, render_missing
from airflow_mpi.kinds.registry import BACKEND_OF_KIND, job_kind
from airflow_mpi.observe.readiness import HostProbe, probes_from_states
from airflow_mpi.observe.stacks import stacks_command
from airflow_mpi.observe.status import PodPhase, PodState
from airflow_mpi.spec import MPIJobSpec, Role

_log = logging.getLogger(__name__)
LOG_READ_TIMEOUT = 60.0  # a quiet stream is reopened (from the cursor) after this

Obj = dict[str, Any]


class KubernetesBackend:
    """Runs a plan's pods on a Kubernetes cluster through the cncf provider's hook, as ``kind``."""

    def __init__(
        self,
        kubernetes_conn_id: str = "kubernetes_default",
        namespace: str | None = None,
        *,
        kind: str = "pods",
        api_client: Any = None,
        create_concurrency: int = 16,
        log_read_timeout: float = LOG_READ_TIMEOUT,
        api_timeout: float = API_TIMEOUT,
        platform_env: Mapping[str, str] | None = None,
    ) -> None:
        self.kind: JobKind = job_kind(kind)
        # What the cluster's platform writes into every pod (its connection's ``nccl_ib_env``).
        self.platform_env = dict(platform_env or {})
        self.name = BACKEND_OF_KIND[self.kind.name]  # the connection's ``backend`` that runs the kind
        self.kubernetes_conn_id = kubernetes_conn_id
        self._namespace = namespace
        self._api_client = api_client
        self.create_concurrency = create_concurrency
        self.log_read_timeout = log_read_timeout
        self.api_timeout = api_timeout
        self._jobs: dict[str, WatchedJob] = {}
        # The jobs this backend was asked to create or adopt: who owns each, and where it is.
        self._owners: dict[str, tuple[RunIdentity, str]] = {}
        # Names never torn down here: held by another job, or refused before anything was created.
        self._untouched: set[str] = set()
        self._permitted: set[tuple[str, Any]] = set()  # (namespace, permissions) checked

    # --- clients --------------------------------------------------------------------------

    @cached_property
    def connection(self) -> KubeConnection:
        """The ``kubernetes`` connection, read as the deferred path reads it (``kube_connection``)."""
        return connection_named(self.kubernetes_conn_id)

    @cached_property
    def api_client(self) -> Any:
        if self._api_client is not None:
            return self._api_client
        return waiting_client(self.connection, self.create_concurrency)

    @property
    def api_url(self) -> str:
        return str(self.api_client.configuration.host)

    @cached_property
    def silence(self) -> ApiSilence:
        """How long the API has not answered, across every request and job of this backend."""
        return ApiSilence(self.api_url, self.api_timeout)

    @cached_property
    def objects(self) -> CoreObjects:
        """Core objects, events and pod logs: every request of this backend goes through it."""
        return CoreObjects(self.api_client, self.silence)

    @cached_property
    def custom(self) -> CustomObjects:
        """Custom objects (top objects, PodGroups, Kueue Workloads), bounded as the core ones."""
        return CustomObjects(self.api_client, self.objects.request, self.api_url)

    @cached_property
    def tops(self) -> TopObjects:
        """The jobs' top objects (a controller's custom objects, or our Services)."""
        return TopObjects(self.objects, self.custom, self.kind.top_resource)

    @cached_property
    def creation(self) -> JobCreation:
        return JobCreation(self.objects, self.custom, self.kind, self.create_concurrency, self._watch, self._teardown)

    @cached_property
    def removal(self) -> JobRemoval:
        return JobRemoval(self.objects, self.custom, self.kind)

    def namespace_for(self, spec: MPIJobSpec) -> str:
        if spec.pod.namespace:
            return spec.pod.namespace
        if self._namespace:
            return self._namespace
        if self._api_client is None:
            with contextlib.suppress(BackendUnavailable):
                if self.connection.namespace:
                    return self.connection.namespace
        return "default"

    def render_plan(self, spec: MPIJobSpec, identity: RunIdentity) -> JobPlan:
        return self.kind.render_plan(spec, identity, self.platform_env)

    def starts_master_with_workers(self, plan: JobPlan) -> bool:
        return True  # every kind: its launch script waits for the workers' sshd

    def custom_objects_to_delete(self, plan: JobPlan) -> list[tuple[str, str, str]]:
        return self.kind.custom_objects_to_delete(plan)

    # --- create ---------------------------------------------------------------------------

    def check_permissions(self, namespace: str, spec: MPIJobSpec) -> None:
        """Fail before anything is created when the credentials lack a verb the job needs (its
        kind's and its gang's too: one SelfSubjectRulesReview). An answer the server marks
        incomplete (a webhook authorizer), or a review that is not allowed, is not judged: the
        requests themselves will say. The error names who lacks the verb (a SelfSubjectReview; the
        connection where the server does not say)."""
        needed = self.kind.permissions(spec)
        if (namespace, needed) in self._permitted:
            return
        status = self.objects.rules_review(namespace)
        if status is not None:
            missing = missing_permissions(status.get("resourceRules") or [], needed)
            if missing and not status.get("incomplete"):
                user, connection = self.objects.whoami(), self.kubernetes_conn_id
                raise LaunchError(render_missing(missing, namespace, RBAC_DOC, user=user, connection=connection))
        self._permitted.add((namespace, needed))

    def create(self, plan: JobPlan) -> None:
        namespace = self.namespace_for(plan.spec)
        self._owners[plan.job_name] = (plan.identity, namespace)
        try:
            self.check_permissions(namespace, plan.spec)
        except LaunchError:
            # Nothing was created: its teardown would only ask for verbs the Role may lack.
            self._untouched.add(plan.job_name)
            raise
        self.creation.create(plan, namespace)

    def _watch(self, plan: JobPlan, namespace: str, resource_version: str) -> WatchedJob:
        job = WatchedJob(
            name=plan.job_name,
            namespace=namespace,
            watcher=PodWatcher(self.objects.core, namespace, job_selector(plan.job_name), self.silence),
            roles={worker.name: Role.WORKER for worker in plan.workers},
            master=plan.master.name,
            plan=plan,
        )
        self._jobs[plan.job_name] = job
        job.watcher.start(resource_version)
        return job

    # --- queued, readiness and the master -------------------------------------------------

    def _job(self, job_name: str) -> WatchedJob:
        job = self._jobs.get(job_name)
        return job if job is not None else self._attach(job_name)

    def _attach(self, job_name: str) -> WatchedJob:
        """Watch a job this process did not create (a sensor in another task), by name alone:
        the pods' role labels tell who is who (a generated master under its expected name)."""
        namespace = self._namespace or "default"
        watcher = PodWatcher(self.objects.core, namespace, job_selector(job_name), self.silence)
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
        master, roles = self.kind.attached_roles(job_name, pods)
        job = WatchedJob(name=job_name, namespace=namespace, watcher=watcher, roles=roles, master=master)
        self._jobs[job_name] = job
        return job

    def queue_status(self, job_name: str) -> str | None:
        """Why the job waits for admission (``JobKind.admission`` on its pods and, when the
        kind needs it, its top object), or None; ``LaunchError`` when it will never start."""
        job, kind = self._job(job_name), self.kind
        with job.watcher.cond:
            pods = list(job.watcher.table.pods.values())
        scheduling = job.plan.spec.scheduling if job.plan is not None else None
        top = None
        if kind.reads_top_to_queue(pods):
            top = self.tops.get(job.namespace, job_name)
        gang = scheduling is not None and scheduling.gang is not None

        selector = kind.events_selector(job_name, top)

        def refusal() -> str | None:
            events = self.objects.events(job.namespace, selector) if selector is not None else []
            return kind.refusal(job_name, events, time.monotonic() - job.created_at)

        admission = kind.admission(job_name, gang, scheduling.queue if scheduling else None, pods, top, refusal)
        if admission.never_starts is not None:
            raise LaunchError(admission.never_starts)
        return admission.queued

    def pod_states(self, job_name: str) -> list[PodState]:
        """From the watch, read as the kind reads them; raises what ended the watch (a refusal,
        or an API silent past ``api_timeout``)."""
        job = self._job(job_name)
        job.watcher.check()
        with job.watcher.cond:
            job.seen_events = job.watcher.table.events
            states = job.watcher.table.states(job.roles)
            deleting = {n for n, pod in job.watcher.table.pods.items() if pod["metadata"].get("deletionTimestamp")}
        master = next((state for state in states if state.name == job.master), None)
        gone = None
        if master is not None and master.reason == "Deleted" and self.kind.reads_top_when_master_deleted():
            gone = self._master_gone_failure(job)
        return self.kind.deciding_states(job.master, states, deleting, gone)

    def _master_gone_failure(self, job: WatchedJob) -> str | None:
        """Why the master pod was deleted, from the top object (e.g. an MPIJob's ``Failed``
        condition): its controller writes it a moment after the pod goes, so it is waited for
        up to ``CONDITION_WAIT`` seconds, once."""
        if job.gone_failure is None:
            deadline = time.monotonic() + CONDITION_WAIT
            while True:
                failure = self.kind.master_gone_failure(self.tops.get(job.namespace, job.name))
                if failure is not None or time.monotonic() >= deadline:
                    job.gone_failure = (failure,)
                    break
                time.sleep(0.2)
        return job.gone_failure[0]

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
        """Nothing to create: the master was created with the workers (by us or by the kind's
        controller) and its launch script waits for their sshd; from now on it is waited for."""
        job = self._job(job_name)
        job.roles.setdefault(job.master, Role.MASTER)

    def follow_master(self, job_name: str, idle_tick: float = 0.1) -> Iterator[list[str]]:
        """The master's log, live; resumed from the cursor after drops and read timeouts."""
        job = self._job(job_name)
        job.roles[job.master] = Role.MASTER

        def master_state() -> PodState:
            states = {s.name: s for s in self.pod_states(job.name)}
            return states.get(job.master) or PodState(job.master, Role.MASTER, PodPhase.PENDING)

        def open_log(since: str | None) -> Any:
            return self.objects.open_log(job.namespace, self._master_pod(job), since, self.log_read_timeout)

        yield from MasterLogFollow(job, master_state, open_log, self.silence).batches(idle_tick)
        last = job.lines.flush()  # lines the master left unfinished when it ended
        if last:
            yield last

    def _master_pod(self, job: WatchedJob) -> str:
        """The master's own pod name (a generated master's newest pod; its expected name until then)."""
        with job.watcher.cond:
            return self.kind.master_pod_now(job.watcher.table, job.master) or job.master

    def pod_log_tail(self, job_name: str, pod: str, lines: int = 20) -> list[str]:
        """The pod's last lines, for a failure message: [] when they cannot be had quickly."""
        job = self._job(job_name)
        return self.objects.log_tail(job.namespace, self._master_pod(job) if pod == job.master else pod, lines)

    def take_stacks(self, job_name: str, wait: int) -> tuple[dict[str, str], dict[str, str]]:
        """``launch.sh stacks`` in every running pod of the job at once, through the exec API.
        Lists the pods itself, so ``airflow-mpi stacks`` can ask a job another process runs."""
        job = self._jobs.get(job_name)
        namespace = job.namespace if job is not None else (self._namespace or "default")
        pods = self.objects.list(namespace, "pods", job_selector(job_name))
        if not pods:
            raise JobNotFound(f"no pods of job {job_name} in namespace {namespace}")
        running = {
            p["metadata"]["name"]: stacks_command(pod_launch_script(p), wait)
            for p in pods
            if (p.get("status") or {}).get("phase") == "Running"
        }
        outputs: dict[str, str] = {}
        errors: dict[str, str] = {}

        def ask(pod: str) -> None:
            try:
                code, out, err = self.objects.exec_in_pod(namespace, pod, running[pod], timeout=wait + 15)
            except Exception as error:  # one pod's answer; the others still count
                errors[pod] = str(error).split("\n", 1)[0]
                return
            outputs[pod] = out
            if code not in (0, None):
                errors[pod] = (err.strip().splitlines() or [f"exit code {code}"])[-1]

        with ThreadPoolExecutor(max_workers=min(16, max(1, len(running)))) as pool:
            list(pool.map(ask, running))
        return outputs, errors

    def release(self, job_name: str) -> None:
        """Stop watching a job without touching it (a sensor's poke is done)."""
        job = self._jobs.pop(job_name, None)
        if job is not None:
            job.watcher.stop()

    # --- teardown -------------------------------------------------------------------------

    def teardown(self, job_name: str) -> None:
        """Delete the job's top object (the rest goes with it) and wait until its pods are gone,
        deleting any the garbage collector has not reached in time. Bounded: when the API
        refuses or stays silent for ``api_timeout``, raises that error (the job may be left).
        A job this backend created or adopted is removed where it is, and only if it is its own."""
        self._teardown(job_name, self._where(job_name))

    def _where(self, job_name: str) -> str:
        """The job's namespace: where this backend watches it, created or adopted it, else its default."""
        job = self._jobs.get(job_name)
        if job is not None:
            return job.namespace
        owner = self._owners.get(job_name)
        return owner[1] if owner is not None else self._namespace or "default"

    def _teardown(self, job_name: str, namespace: str) -> None:
        """``teardown`` of a job in ``namespace`` unless this backend watches it (it knows where).
        A job asked for but not watched (its create failed before its top object was made) may
        share its name with another job's top object: that one is left alone."""
        if job_name in self._untouched:
            return
        job = self._jobs.get(job_name)
        if job is None and job_name in self._owners:
            identity = self._owners[job_name][0]
            top = self.tops.get(namespace, job_name)
            if top is not None and not owned_by(identity, top["metadata"].get("labels")):
                _log.warning("not removing %s in namespace %s: it is another job's", job_name, namespace)
                self._untouched.add(job_name)
                return
        self.removal.remove(job, job_name, job.namespace if job else namespace)

    def leftovers(self, job_name: str) -> list[str]:
        """What of the job still exists (``JobRemoval.leftovers``); the job is forgotten here.
        Nothing of a name another job holds, nor of a job refused before its creation, is this job's."""
        namespace = self._where(job_name)
        job = self._jobs.pop(job_name, None)
        self._owners.pop(job_name, None)
        if job_name in self._untouched:
            self._untouched.discard(job_name)
            return []
        return self.removal.leftovers(job, job_name, namespace)

    def remove_found(self, found: FoundJob) -> list[str]:
        """Tear down a job ``find_jobs`` found, in its own namespace; what is left of it."""
        self._teardown(found.job_name, found.namespace)
        job = self._jobs.pop(found.job_name, None)
        self._owners.pop(found.job_name, None)
        return self.removal.leftovers(job, found.job_name, job.namespace if job else found.namespace)

    # --- retries: find and adopt the job of an earlier try ---------------------------------

    def find_jobs(self, identity: RunIdentity, namespace: str) -> list[FoundJob]:
        """Jobs of every try of this task instance (one list request: their top objects carry
        the run labels)."""
        return self.tops.find_jobs(namespace, identity)

    def adopt(self, plan: JobPlan, namespace: str) -> list[PodState]:
        """Watch an existing job (an earlier try's) as if it had been created here; a generated
        master counts from the start (its controller creates it with the workers)."""
        self._owners[plan.job_name] = (plan.identity, namespace)
        job = self._watch(plan, namespace, "")  # list first
        watcher = job.watcher
        watcher.wait_listed(30)
        watcher.check()
        kind = self.kind
        with watcher.cond:
            if kind.master_counts_from_start(watcher.table, plan.master.name):
                job.roles[plan.master.name] = Role.MASTER
            unseen = kind.master_pod_now(watcher.table, plan.master.name) is None
        if unseen and kind.reads_top_when_master_deleted():
            # Its master pod may have gone before this watch began: the top object says why.
            failure = kind.master_gone_failure(self.tops.get(namespace, plan.job_name))
            if failure is not None:
                job.gone_failure = (failure,)
                with watcher.cond:
                    watcher.table.deleted.add(plan.master.name)
        return self.pod_states(plan.job_name)

    # --- the cluster CLI --------------------------------------------------------------------

    def job_exists(self, job_name: str, namespace: str) -> bool:
        """Whether the job's top object is there."""
        return self.tops.get(namespace, job_name) is not None

    def master_pod_name(self, job_name: str, namespace: str) -> str:
        """The pod whose log is the job's (an MPIJob's: its newest launcher pod)."""
        selector = self.kind.master_selector(job_name)
        pods = self.objects.list(namespace, "pods", selector) if selector else []
        return self.kind.master_pod(job_name, pods)


def pod_launch_script(pod: Mapping[str, Any]) -> str:
    """Where the launch script is in this pod: its config directory (``AIRFLOW_MPI_CONFIG_DIR``
    when a kind moves it, as an MPIJob's pods do) plus ``launch.sh``."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == contract.CONTAINER_NAME:
            for var in container.get("env") or []:
                if var.get("name") == contract.ENV_CONFIG_DIR and var.get("value"):
                    return f"{var['value']}/launch.sh"
    return contract.DEFAULT_PATHS.launch_script
