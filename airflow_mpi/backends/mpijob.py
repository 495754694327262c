"""MPIJob backend: one ``kubeflow.org/v2beta1`` MPIJob per MPI job (``airflow-mpi render
--backend mpijob`` prints it), for clusters that admit training only through mpi-operator.

The controller creates the Service ``<job>``, its own ssh Secret and hostfile ConfigMap, the
worker pods and a batch/v1 launcher Job whose pod (``<job>-launcher-<random>``) is our master;
we create our Secret and ConfigMap (its pods start at once and must find them), then the
MPIJob, which then owns them. From there this is the Kubernetes backend: the same pod watch (by
our job label, which both templates carry), readiness, master log follow (the newest launcher
pod) and failure causes. The MPIJob's own state says what
the pods cannot: queued (suspended by Kueue, or waiting for its gang), rejected (the controller's
``ValidationError`` event) and why it failed when the launcher pod is gone. Teardown deletes the
MPIJob in the foreground, which takes everything else along.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from airflow_mpi.backends.base import FoundJob
from airflow_mpi.backends.custom_objects import find_custom_jobs
from airflow_mpi.backends.k8s_errors import ApiRequest, translate
from airflow_mpi.backends.kubernetes import TEARDOWN_WAIT, KubernetesBackend, Obj, _AlreadyExists, _Job
from airflow_mpi.exceptions import BackendError, LaunchError
from airflow_mpi.gang import describe_group_wait
from airflow_mpi.mpijob import (
    LABEL_OPERATOR_JOB,
    MPIJOB,
    describe_mpijob_failure,
    describe_mpijob_wait,
    describe_validation_event,
    launcher_name,
    launcher_selector,
    render_mpijob_manifests,
    render_mpijob_owner_reference,
    render_mpijob_plan,
    without_cleanup_kills,
)
from airflow_mpi.naming import RunIdentity
from airflow_mpi.plan import JobPlan
from airflow_mpi.spec import MPIJobSpec, Role
from airflow_mpi.status import PodPhase, PodState

# How long an MPIJob may go without any condition before the controller is taken to be absent.
CONTROLLER_GRACE = 60.0
CONDITION_WAIT = 2.0  # for the MPIJob's Failed condition once its launcher pod is gone


class MPIJobBackend(KubernetesBackend):
    """The Kubernetes backend with mpi-operator creating the pods."""

    name = "mpijob"
    # Its Role (README) grants its custom resources too; not checked before create yet: each
    # request's own 403 names a missing verb.
    required_permissions = ()
    top_owner = (f"{MPIJOB[0]}/{MPIJOB[1]}", MPIJOB[3])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._created_at: dict[str, float] = {}
        self._gone: dict[str, str | None] = {}  # why a job's launcher pod was deleted, once known

    def render_plan(self, spec: MPIJobSpec, identity: RunIdentity) -> JobPlan:
        return render_mpijob_plan(spec, identity)

    def create(self, plan: JobPlan) -> None:
        """Our Secret and ConfigMap first (the controller starts the pods at once, and a pod must
        find its volumes), then the MPIJob, then the MPIJob made their owner."""
        namespace = self.namespace_for(plan.spec)
        mpijob, secret, config_map = render_mpijob_manifests(plan, namespace)
        if self.custom.get(namespace, MPIJOB, plan.job_name) is not None:
            # An earlier attempt of this very try: start clean (its pods may be half-way).
            self._delete_mpijob(namespace, plan.job_name)
        ours: list[tuple[str, Obj]] = []
        try:
            for obj, plural in ((secret, "secrets"), (config_map, "configmaps")):
                obj["metadata"].pop("ownerReferences", None)
                ours.append((plural, self._create_fresh(namespace, plural, obj)))
            created = self.custom.create(namespace, MPIJOB, mpijob)
            self._created_at[plan.job_name] = time.monotonic()
            job = self._watch(plan, namespace, created["metadata"]["resourceVersion"])
            job.roles[plan.master.name] = Role.MASTER  # the controller creates it with the workers
            owner = render_mpijob_owner_reference(plan, created["metadata"]["uid"])
            for plural, obj in ours:
                obj["metadata"]["ownerReferences"] = [owner]
                self._replace(namespace, plural, obj)
        except BaseException:
            with contextlib.suppress(Exception):  # the create's own error is the one to raise
                self.teardown(plan.job_name, namespace)
            for plural, obj in ours:  # not owned yet, or the collector is slow: now
                with contextlib.suppress(Exception):
                    self._delete(namespace, plural, obj["metadata"]["name"], time.monotonic())
            raise

    def _create_fresh(self, namespace: str, plural: str, manifest: Obj) -> Obj:
        """Create; one left by an attempt that died before its MPIJob existed is replaced."""
        try:
            return self._create(namespace, plural, manifest)
        except _AlreadyExists:
            self._delete(namespace, plural, manifest["metadata"]["name"], time.monotonic())
            return self._create(namespace, plural, manifest)

    def _replace(self, namespace: str, plural: str, obj: Obj) -> None:
        replace = self._api("replace", plural)
        name = obj["metadata"]["name"]
        try:
            self._send(lambda timeout: replace(name, namespace, obj, _preload_content=False, _request_timeout=timeout))
        except BackendError:
            raise
        except Exception as error:
            raise translate(error, ApiRequest("update", plural, namespace, name), self.api_url) from error

    def starts_master_with_workers(self, plan: JobPlan) -> bool:
        return True

    def custom_objects_to_delete(self, plan: JobPlan) -> list[tuple[str, str, str]]:
        return [MPIJOB[:3]]

    def start_master(self, job_name: str) -> None:
        """Nothing to do: the controller starts the launcher with the workers
        (``launcherCreationPolicy: AtStartup``); its launch script waits for their sshd."""
        job = self._job(job_name)
        job.roles.setdefault(job.master, Role.MASTER)

    def pod_states(self, job_name: str) -> list[PodState]:
        """The launcher's newest pod under the master's name; without the workers the controller
        removes once the launcher ended; the MPIJob's failure when the launcher pod is gone."""
        job = self._job(job_name)
        states = super().pod_states(job_name)
        with job.watcher.cond:
            deleting = {
                name for name, pod in job.watcher.table.pods.items() if pod["metadata"].get("deletionTimestamp")
            }
        master = next((state for state in states if state.name == job.master), None)
        if master is not None and master.reason == "Deleted":
            failure = self._launcher_gone_failure(job)
            if failure is not None:
                states = [s for s in states if s.name != job.master]
                states.append(PodState(job.master, Role.MASTER, PodPhase.FAILED, reason=failure))
        return without_cleanup_kills(states, deleting)

    def _launcher_gone_failure(self, job: _Job) -> str | None:
        """Why the launcher pod was deleted, from the MPIJob's ``Failed`` condition (e.g. the
        launcher Job's ``DeadlineExceeded``): the controller writes it a moment after the pod
        goes, so it is waited for up to ``CONDITION_WAIT`` seconds, once."""
        if job.name in self._gone:
            return self._gone[job.name]
        deadline = time.monotonic() + CONDITION_WAIT
        while True:
            failure = describe_mpijob_failure(self.custom.get(job.namespace, MPIJOB, job.name))
            if failure is not None or time.monotonic() >= deadline:
                self._gone[job.name] = failure
                return failure
            time.sleep(0.2)

    def queue_status(self, job_name: str) -> str | None:
        """Queued while the MPIJob is suspended (Kueue has not admitted it) or has no pods yet
        (its gang waits); fails at once when the controller refused or never saw it."""
        job = self._job(job_name)
        with job.watcher.cond:
            pods = list(job.watcher.table.pods.values())
        if pods:  # a gang's pods wait unscheduled; others are not queued (startup_timeout holds)
            scheduling = job.plan.spec.scheduling if job.plan is not None else None
            if scheduling is None or scheduling.gang is None:
                return None
            return describe_group_wait(pods, scheduling.queue)
        mpijob = self.custom.get(job.namespace, MPIJOB, job_name)
        failure = describe_mpijob_failure(mpijob)
        if failure is not None:
            raise LaunchError(f"MPIJob {job_name}: {failure}")
        reason = describe_mpijob_wait(mpijob, bool(pods))
        if mpijob is not None and not (mpijob.get("status") or {}).get("conditions"):
            self._check_accepted(job, job_name)
        return reason

    def _check_accepted(self, job: _Job, job_name: str) -> None:
        """mpi-operator refuses an invalid MPIJob only with a ``ValidationError`` event; an MPIJob
        it never touches has no controller."""
        refused = describe_validation_event(self._events(job.namespace, job_name))
        if refused is not None:
            raise LaunchError(f"mpi-operator refused MPIJob {job_name} (ValidationError): {refused}")
        waited = time.monotonic() - self._created_at.get(job_name, time.monotonic())
        if waited > CONTROLLER_GRACE:
            raise LaunchError(
                f"MPIJob {job_name}: mpi-operator has not acted on it in {waited:.0f}s (no condition, no "
                "pods): install mpi-operator v0.5.0 or later, or check that it is running and watches this namespace"
            )

    def _events(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        selector = f"involvedObject.name={job_name},involvedObject.kind={MPIJOB[3]}"
        try:
            response = self._send(
                lambda timeout: self.core.list_namespaced_event(
                    namespace, field_selector=selector, _preload_content=False, _request_timeout=timeout
                )
            )
        except BackendError:
            raise
        except Exception as error:
            raise translate(error, ApiRequest("list", "events", namespace), self.api_url) from error
        return list(json.loads(response.data).get("items") or [])

    def _launcher_pod(self, job: _Job) -> str:
        """The newest launcher pod's own name (the master's name is the launcher's host name)."""
        with job.watcher.cond:
            generated = job.watcher.table.generated(job.master, Role.MASTER)
        return generated[-1] if generated else job.master

    def _open_log(self, job: _Job, since: str | None) -> Any:
        expected = job.master
        job.master = self._launcher_pod(job)
        try:
            return super()._open_log(job, since)
        finally:
            job.master = expected

    def pod_log_tail(self, job_name: str, pod: str, lines: int = 20) -> list[str]:
        job = self._job(job_name)
        return super().pod_log_tail(job_name, self._launcher_pod(job) if pod == job.master else pod, lines)

    def teardown(self, job_name: str, namespace: str | None = None) -> None:
        """Delete the MPIJob (its pods, Service, launcher Job, the controller's and our Secret and
        ConfigMap go with it) and wait until its pods are gone."""
        job = self._jobs.get(job_name)
        namespace = job.namespace if job else namespace or self._namespace or "default"
        # Foreground: the MPIJob is gone only once everything it owns is.
        self.custom.delete(namespace, MPIJOB, job_name, propagation="Foreground")
        super().teardown(job_name, namespace)  # waits for the pods; its Service delete finds it gone
        self.custom.wait_gone(namespace, MPIJOB, job_name, TEARDOWN_WAIT)
        for cache in (self._created_at, self._gone):
            cache.pop(job_name, None)

    def _delete_mpijob(self, namespace: str, name: str) -> None:
        self.custom.delete(namespace, MPIJOB, name, propagation="Foreground")
        if not self.custom.wait_gone(namespace, MPIJOB, name, 60):
            raise LaunchError(f"MPIJob {name}: an earlier attempt's MPIJob is still being deleted")

    def leftovers(self, job_name: str) -> list[str]:
        """What is left by our label and the controller's: the MPIJob, the pods, the Services,
        Secrets and ConfigMaps of either."""
        job = self._jobs.get(job_name)
        namespace = job.namespace if job else self._namespace or "default"
        found = super().leftovers(job_name)
        if self.custom.get(namespace, MPIJOB, job_name) is not None:
            found.append(f"MPIJob {job_name}")
        found += [
            f"pod {p['metadata']['name']}" for p in self._list(namespace, "pods", f"{LABEL_OPERATOR_JOB}={job_name}")
        ]
        for plural, name in (
            ("services", job_name),
            ("secrets", f"{job_name}-ssh"),
            ("configmaps", f"{job_name}-config"),
        ):
            if self._read(namespace, plural, name) is not None:
                found.append(f"{plural[:-1]} {name}")
        return sorted(set(found))

    def find_jobs(self, identity: RunIdentity, namespace: str) -> list[FoundJob]:
        """MPIJobs of every try of this task instance (they carry the run labels)."""
        return find_custom_jobs(self.custom, namespace, MPIJOB, identity)

    def adopt(self, plan: JobPlan, namespace: str) -> list[PodState]:
        """Watch an existing MPIJob's pods; its launcher counts from the start (the controller
        creates it with the workers, or it waits with them in the queue)."""
        super().adopt(plan, namespace)
        self._jobs[plan.job_name].roles[plan.master.name] = Role.MASTER
        self._created_at.setdefault(plan.job_name, time.monotonic())
        return self.pod_states(plan.job_name)

    # --- the cluster CLI ------------------------------------------------------------------

    @classmethod
    def owns(cls, obj: Obj) -> bool:
        """Owned by the MPIJob, or by its launcher's batch Job (the launcher pod); or by nothing
        yet: this backend alone creates its Secret and ConfigMap before their owner exists."""
        refs = obj.get("metadata", {}).get("ownerReferences") or []
        return not refs or any(
            (ref.get("apiVersion"), ref.get("kind")) in (cls.top_owner, LAUNCHER_OWNER) for ref in refs
        )

    def job_exists(self, job_name: str, namespace: str) -> bool:
        return self.custom.get(namespace, MPIJOB, job_name) is not None

    def job_pod_states(self, pods: list[Obj]) -> list[PodState]:
        """The newest launcher pod as the master (the batch Job replaces one that failed), without
        the workers the controller removes once the launcher ended."""
        states = super().job_pod_states(pods)
        launchers = [pod for pod, state in zip(pods, states, strict=True) if state.role is Role.MASTER]
        newest = _newest(launchers)
        deleting = {pod["metadata"]["name"] for pod in pods if pod["metadata"].get("deletionTimestamp")}
        kept = [state for state in states if state.role is not Role.MASTER or state.name == newest]
        return without_cleanup_kills(kept, deleting)

    def master_pod_name(self, job_name: str, namespace: str) -> str:
        """The newest launcher pod (``<job>-launcher-<random>``), or the launcher's name if none."""
        return _newest(self._list(namespace, "pods", launcher_selector(job_name))) or launcher_name(job_name)

    def _attach(self, job_name: str) -> _Job:
        """As the Kubernetes backend's, the master being the launcher under its expected name
        (the newest of its pods counts, as for a job created here)."""
        job = super()._attach(job_name)
        job.roles = {name: role for name, role in job.roles.items() if role is not Role.MASTER}
        job.master = launcher_name(job_name)
        job.roles[job.master] = Role.MASTER
        return job


LAUNCHER_OWNER = ("batch/v1", "Job")  # the launcher pod's owner: the controller's batch Job


def _newest(pods: list[Obj]) -> str | None:
    """The name of the pod created last (names break ties: a second's resolution)."""
    stamped = sorted((pod["metadata"].get("creationTimestamp") or "", pod["metadata"]["name"]) for pod in pods)
    return stamped[-1][1] if stamped else None
