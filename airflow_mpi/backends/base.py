"""The Backend protocol: what the operator, sensor and CLI need from a place that runs pods.

A backend receives a rendered ``JobPlan`` once (``create``) and from then on is addressed by the
job name, so a sensor in another task, or a later try, can find the same job. Implementations:
``backends.local.LocalBackend`` (namespaced processes) and
``backends.kubernetes.KubernetesBackend`` (core objects). ``ReattachableBackend`` and
``DeferrableBackend`` say what a backend offers beyond the flow, so callers never ask for a class.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.kinds.base import JobKind
from airflow_mpi.observe.readiness import HostProbe
from airflow_mpi.observe.status import PodState
from airflow_mpi.spec import MPIJobSpec


@runtime_checkable
class Backend(Protocol):
    name: str

    def create(self, plan: JobPlan) -> None:
        """Create the job's shared objects and its worker pods (not the master). Removes what an
        earlier, crashed attempt of the same job left behind first."""

    def probe_workers(self, job_name: str) -> list[HostProbe]:
        """One readiness check of every worker's sshd, now (never waits)."""

    def pod_states(self, job_name: str) -> list[PodState]:
        """What every pod of the job is doing now."""

    def wait_for_change(self, job_name: str, timeout: float) -> None:
        """Block until something about the job's pods may have changed, or ``timeout``."""

    def start_master(self, job_name: str) -> None:
        """Start the master pod: its launch script checks the hosts again and execs mpiexec."""

    def follow_master(self, job_name: str, idle_tick: float = 0.1) -> Iterator[list[str]]:
        """The master's output, live, as batches of complete lines (each rank's reassembled, as
        ``podlog.RankLineSplitter`` gives them, with ``PartialLine`` states of lines still being
        rewritten), until it ends. Yields an empty batch at least every ``idle_tick`` seconds so
        the caller can check deadlines and workers."""

    def pod_log_tail(self, job_name: str, pod: str, lines: int = 20) -> list[str]:
        """The last lines a pod printed (for failure messages)."""

    def teardown(self, job_name: str) -> None:
        """Delete everything the job created. Idempotent; safe on a partly created job."""

    def leftovers(self, job_name: str) -> list[str]:
        """What of the job still exists (empty after a complete teardown)."""

    def release(self, job_name: str) -> None:
        """Stop following a job without touching it (a sensor's poke is done): whatever this
        object keeps running for the job (a watch) ends; the job itself goes on."""


@dataclass(frozen=True)
class FoundJob:
    """A job of a try of the same task instance (for reattach), and the namespace it is in."""

    job_name: str
    namespace: str
    try_number: int


@runtime_checkable
class ReattachableBackend(Backend, Protocol):
    """A backend whose jobs outlive the process that created them (Kubernetes), so a retry can
    find an earlier try's job and reattach. Local pods die with their owner: nothing to find."""

    def namespace_for(self, spec: MPIJobSpec) -> str:
        """Where a job of this spec lives."""

    def find_jobs(self, identity: RunIdentity, namespace: str) -> list[FoundJob]:
        """Jobs of every try of this task instance."""

    def adopt(self, plan: JobPlan, namespace: str) -> list[PodState]:
        """Watch an existing job (an earlier try's, or one a deferral left) as if created here."""

    def remove_found(self, found: FoundJob) -> list[str]:
        """Tear down a job ``find_jobs`` found, in the namespace it was found in (not this
        backend's default); what of it is left (as ``leftovers``)."""


@runtime_checkable
class DeferrableBackend(ReattachableBackend, Protocol):
    """A backend whose pods run without the task's process, so the task can wait in a trigger
    (holding no worker slot) and resume in another process by adopting the job. The trigger
    watches the pods through this Airflow connection."""

    kubernetes_conn_id: str
    api_timeout: float  # seconds the trigger may go without an answer from the API
    kind: JobKind  # what the trigger reads the job's pods as (it is given the kind's name)


@runtime_checkable
class QueueAwareBackend(Backend, Protocol):
    """A backend whose jobs may wait for a gang scheduler or a queue to admit them: while they
    do, the job is queued, not stuck (``startup_timeout`` waits; ``scheduling.queue_timeout``
    bounds it)."""

    def queue_status(self, job_name: str) -> str | None:
        """Why the job waits for admission now (queue, group, missing room), or None once admitted."""

    def starts_master_with_workers(self, plan: JobPlan) -> bool:
        """Whether ``create`` already starts the master (on Kubernetes, every kind does);
        ``start_master`` then has nothing to do and the master's launch script waits for the
        workers' sshd."""

    def custom_objects_to_delete(self, plan: JobPlan) -> list[tuple[str, str, str]]:
        """(group, version, plural) of the custom objects named after the job that a kill must
        delete too (a Volcano Job, a Kueue Workload); the Service takes the rest along."""


@runtime_checkable
class StackBackend(Backend, Protocol):
    """A backend that can ask a running job's pods for their ranks' Python stacks (the hang
    watchdog, ``airflow-mpi stacks``): each pod runs ``launch.sh stacks``, as ``kubectl exec``
    would run it."""

    def take_stacks(self, job_name: str, wait: int) -> tuple[dict[str, str], dict[str, str]]:
        """Each running pod's ``launch.sh stacks <wait>`` output (pod -> text), and the pods that
        could not be asked (pod -> why). Never raises for one pod."""


@runtime_checkable
class NoticeBackend(Backend, Protocol):
    """A backend that can tell a running job's ranks that their pods are about to go (the task is
    being killed): each pod runs ``launch.sh notice``, which sends every rank process SIGTERM,
    and the backend gives them the job's ``termination_grace`` to save and end before teardown.
    (On Kubernetes a pod's deletion is the notice: the kubelet signals it.)"""

    def give_notice(self, job_name: str, grace: float) -> list[str]:
        """Each running pod's ``AIRFLOW_MPI_NOTICE`` line; returns once the master has ended, or
        after ``grace`` seconds. Never raises for one pod."""


@runtime_checkable
class PlanningBackend(Backend, Protocol):
    """A backend whose controller fixes names or paths of the pods (mpi-operator names the master
    ``<job>-launcher`` and mounts its own files at ``/etc/mpi``): it renders the plan itself, so
    the runner, the rank checks and the failure messages use the names the pods really have."""

    def render_plan(self, spec: MPIJobSpec, identity: RunIdentity) -> JobPlan:
        """The plan of ``spec`` for this run, as this backend runs it."""
