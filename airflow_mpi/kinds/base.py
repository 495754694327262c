"""``JobKind``: the questions the waiting backend, the deferred trigger, teardown and the cluster
CLI ask a job kind, and the answers every kind derives alike.

A kind is one way a job's pods come to exist on Kubernetes: ``pods`` (``kinds.pods``: we create
every object, a headless Service owns the rest) or a controller's custom object
(``kinds.controller``'s base, for Volcano, MPIJob and TrainJob). Callers are given a kind by name
(``kinds.registry``) and call these very functions on what they read, so both ways of waiting
decide alike.

Everything here is pure: a kind renders objects and reads states; only backends do I/O. What a
kind's author fills in is the abstract methods and the hooks below them (a leading underscore:
not for callers).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_mpi.job.naming import RunIdentity, build_pod_name
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.kinds.manifests import GVK
from airflow_mpi.kinds.permissions import Permission, Rules, build_job_permissions, build_trigger_permissions
from airflow_mpi.observe.status import PodPhase, PodState, PodTable, pod_state_from_k8s
from airflow_mpi.spec import MPIJobSpec, Role

Obj = dict[str, Any]

# How long a custom top object may go without any sign of its controller (no condition, no
# pods) before the controller is taken to be absent.
CONTROLLER_GRACE = 60.0
# The core objects a kind creates beside its top object, by ``kind``.
CORE_DEPENDENTS: dict[str, GVK] = {
    "Secret": ("", "v1", "secrets", "Secret"),
    "ConfigMap": ("", "v1", "configmaps", "ConfigMap"),
}
# How long a top object may take to say why the master pod is gone (its controller writes that
# a moment after the pod goes): the waiting backend and the trigger each wait this long, once.
CONDITION_WAIT = 2.0


@dataclass(frozen=True)
class QueueCheck:
    """Where a job stands before its pods run: ``reason`` (queued, and why), ``failure`` (it
    never will run: say so and end), or neither (not queued: the pod rules apply)."""

    reason: str | None = None
    failure: str | None = None


NOT_QUEUED = QueueCheck()


@dataclass(frozen=True)
class Admission:
    """What a job's pods and top object say before it runs: ``queued`` (why it waits for
    admission), ``never_starts`` (the whole error: its controller refused or failed it), or
    neither (admitted, or never queued: the pods' states decide)."""

    queued: str | None = None
    never_starts: str | None = None


@dataclass(frozen=True)
class Leftover:
    """Objects a controller made that must be gone once the job is, beyond our Service, Secret
    and ConfigMap (which teardown checks for every kind): those of ``plural`` that ``selector``
    lists, or the one ``name``d."""

    plural: str
    selector: str | None = None
    name: str | None = None


class JobKind(ABC):
    """What callers ask a job kind. The abstract methods are what differs between kinds;
    the rest every kind derives alike from the hooks at the end."""

    name: ClassVar[str]  # its entry in ``kinds.registry``
    top_label: ClassVar[str]  # the job's top object, for messages: "Service", "MPIJob"
    top_resource: ClassVar[GVK]  # the API resource whose object is the job (deleting it takes it all)

    # --- creating -------------------------------------------------------------------------

    @abstractmethod
    def controller_makes_pods(self) -> bool:
        """Whether a controller creates the job's pods from its top object (a pod not there yet
        may still come; the controller's object goes first and last), rather than we ourselves."""

    def render_plan(
        self, spec: MPIJobSpec, identity: RunIdentity, platform_env: Mapping[str, str] | None = None
    ) -> JobPlan:
        """The job's plan as this kind runs it (``platform_env``: what the platform writes into every pod)."""
        from airflow_mpi.job.plan import render_plan

        return render_plan(spec, identity, platform_env=platform_env)

    @abstractmethod
    def render(self, plan: JobPlan, namespace: str, *, redact_secrets: bool = False) -> list[Obj]:
        """Every object the job is made of, in creation order (the top object first);
        ``redact_secrets``: the keys replaced by a placeholder (what ``airflow-mpi render`` prints)."""

    def dependent_resource(self, obj: Obj) -> GVK:
        """The API resource of one of the objects ``render`` gives beside the top object (group
        "": the core API)."""
        try:
            return CORE_DEPENDENTS[obj["kind"]]
        except KeyError:
            raise ValueError(f"{self.name} jobs have no {obj.get('kind')!r} objects") from None

    def made_before_top(self, obj: Obj) -> bool:
        """Whether ``obj`` (one of ``render``'s beside the top object) must exist before the top
        object, and is only then given it as its owner. Our Secret and ConfigMap never are: they
        are created owned by the top object, so no crash leaves a private key nobody owns (a pod
        that starts first waits for its volumes, as the kubelet retries them)."""
        return False

    @abstractmethod
    def owner_reference(self, plan: JobPlan, uid: str) -> Obj:
        """What makes our objects the top object's dependents (deleted with it)."""

    def refused_for_now(self, message: str) -> bool:
        """Whether the API's refusal of the top object (``message``) may pass by itself in a
        moment (an admission webhook that has not seen what was created just before it): the
        create is then tried again, briefly."""
        return False

    def permissions(self, spec: MPIJobSpec) -> tuple[Permission, ...]:
        """Every verb the worker needs for a job of this kind with ``spec``, checked before it creates anything."""
        gang = spec.scheduling.gang
        return build_job_permissions(self._rules, gang.value if gang else None, spec.progress_timeout is not None)

    def trigger_permissions(self, deleted_on_kill: Sequence[Sequence[str]]) -> tuple[Permission, ...]:
        """Every verb the triggerer needs for a deferred job of this kind whose kill deletes ``deleted_on_kill``."""
        return build_trigger_permissions(self._trigger_rules, deleted_on_kill)

    @abstractmethod
    def owns(self, obj: Obj) -> bool:
        """Whether a job's object (our Secret, a pod) belongs to a job of this kind, by its owner."""

    # --- deciding, as both ways of waiting do ---------------------------------------------

    @abstractmethod
    def reads_top_to_queue(self, pods: list[Obj]) -> bool:
        """Whether ``admission`` needs the top object (read only then: one request)."""

    def admission(
        self, job_name: str, gang: bool, queue: str | None, pods: list[Obj], top: Obj | None,
        refusal: Callable[[], str | None],
    ) -> Admission:  # fmt: skip
        """Whether the job waits for admission (``gang``: it has a gang setting; ``queue``: the
        queue it names), or never starts. ``refusal`` reads why the controller will not start it
        (its events: asked only while queued, where ``events_selector`` names them)."""
        check = self._queue_check(gang, queue, pods, top)
        if check.failure is not None:
            return Admission(never_starts=f"{self.top_label} {job_name}: {check.failure}")
        if check.reason is None:
            return Admission()
        refused = refusal() if self.events_selector(job_name, top) is not None else None
        return Admission(never_starts=refused) if refused is not None else Admission(queued=check.reason)

    def events_selector(self, job_name: str, top: Obj | None) -> str | None:
        """The field selector of the events that may tell why the job never starts, while its top
        object (``top``) leaves that to them; None: nothing to read."""
        return None

    def refusal(self, job_name: str, events: list[Obj], waited: float) -> str | None:
        """Why the controller will never start the job (its events, or its silence for
        ``waited`` seconds), or None."""
        return None

    def deciding_states(
        self, master: str, states: list[PodState], deleting: set[str], master_gone_failure: str | None
    ) -> list[PodState]:
        """The pods' states that decide the job (``observe.status.evaluate_job``; ``deleting``:
        pods the API is deleting): a master pod deleted for a reason its top object gives fails
        with that reason; the pods the kind's controller removes once the job is decided do not count."""
        if master_gone_failure is not None:
            states = [state for state in states if state.name != master]
            states.append(PodState(master, Role.MASTER, PodPhase.FAILED, reason=master_gone_failure))
        return self._observe(states, deleting)

    def reads_top_when_master_deleted(self) -> bool:
        """Whether a deleted master pod is a reason to read the top object (``master_gone_failure``)."""
        return False

    def master_gone_failure(self, top: Obj | None) -> str | None:
        """Why the master pod was deleted, as the top object says (None: it does not say)."""
        return None

    # --- the master, and a job found by name ----------------------------------------------

    def master_counts_from_start(self, table: PodTable, master: str) -> bool:
        """Whether an adopted job's master is watched from the start: seen already, or a
        controller's, made with the workers."""
        return self._master_generated or master in table.pods

    def attached_roles(self, job_name: str, pods: Mapping[str, Obj]) -> tuple[str, dict[str, Role]]:
        """The master's name and every pod's role, for a job found by name alone (the cluster CLI):
        a generated master is its controller's newest pod, whatever name the watch sees."""
        roles = {name: pod_state_from_k8s(pod).role for name, pod in pods.items()}
        if not self._master_generated:  # a master not created yet is not waited for
            master = next((n for n, r in roles.items() if r is Role.MASTER), build_pod_name(job_name, Role.MASTER, 0))
            return master, roles
        master = self.master_pod(job_name, [])
        roles = {name: role for name, role in roles.items() if role is not Role.MASTER}
        roles[master] = Role.MASTER
        return master, roles

    def listed_states(self, pods: list[Obj]) -> list[PodState]:
        """The deciding states from the pods as listed (no watch: the cluster CLI); a generated
        master's newest pod is the master (its batch Job replaces one that failed)."""
        states = [pod_state_from_k8s(pod) for pod in pods]
        if self._master_generated:
            newest = newest_pod([pod for pod, state in zip(pods, states, strict=True) if state.role is Role.MASTER])
            states = [state for state in states if state.role is not Role.MASTER or state.name == newest]
        deleting = {pod["metadata"]["name"] for pod in pods if pod["metadata"].get("deletionTimestamp")}
        return self._observe(states, deleting)

    def master_pod(self, job_name: str, pods: list[Obj]) -> str:
        """The pod whose log is the job's: the master's own, or a generated master's newest pod
        (``<master>-<random>``, among ``pods``: those ``master_selector`` lists), or its name if none."""
        name = self._master_name(job_name)
        if not self._master_generated:
            return name
        return newest_pod([pod for pod in pods if pod["metadata"]["name"].startswith(f"{name}-")]) or name

    def master_pod_now(self, table: PodTable, master: str) -> str | None:
        """The master's own pod as the watch sees it: ``master`` once seen, or a generated
        master's newest pod; None while there is none (a controller creates the pods after
        the job is submitted: a log read before then is a 404 that says nothing)."""
        if not self._master_generated:
            return master if master in table.pods else None
        generated = table.generated(master, Role.MASTER)
        return generated[-1] if generated else None

    def master_selector(self, job_name: str) -> str | None:
        """The label selector of a generated master's pods (it may have had several); None:
        the master's name is fixed, nothing to list."""
        return None

    # --- teardown -------------------------------------------------------------------------

    def deletion_propagation(self) -> str:
        """How teardown deletes the top object: ``Foreground``, so that it is gone only once
        everything it owns is (the wait for it to go is the wait for the whole job)."""
        return "Foreground"

    @abstractmethod
    def custom_objects_to_delete(self, plan: JobPlan) -> list[tuple[str, str, str]]:
        """(group, version, plural) of the custom objects named after the job that a kill deletes."""

    def leftovers(self, job_name: str) -> list[Leftover]:
        """What a controller made that must be gone once the job is (teardown's check)."""
        return []

    # --- hooks: what a kind's author fills in for the answers above -------------------------

    # What a job of this kind adds to the worker's Role (docs/guides/rbac.md's table): its top object.
    _rules: ClassVar[Rules] = ()
    # What it adds to the triggerer's Role: reading its top object (and deleting it on a kill).
    _trigger_rules: ClassVar[Rules] = ()
    # The master is a controller's pod named ``<master>-<random>`` (a batch Job's): the newest counts.
    _master_generated: ClassVar[bool] = False

    def _master_name(self, job_name: str) -> str:
        """The master's name in the plan, which is its host name: ``<job>-master-0``."""
        return build_pod_name(job_name, Role.MASTER, 0)

    @abstractmethod
    def _queue_check(self, gang: bool, queue: str | None, pods: list[Obj], top: Obj | None) -> QueueCheck:
        """Whether the job waits for admission, never starts, or neither (``admission``)."""

    def _observe(self, states: list[PodState], deleting: set[str]) -> list[PodState]:
        """The states that decide the job, from the watched ones: without the pods the kind's own
        controller removes once the job is decided."""
        return states


def top_condition(top: Obj | None, kind: str) -> Obj | None:
    """The top object's condition ``kind`` when its status is True, else None."""
    for condition in ((top or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return dict(condition)
    return None


def newest_pod(pods: list[Obj]) -> str | None:
    """The name of the pod created last (names break ties: a second's resolution)."""
    stamped = sorted((pod["metadata"].get("creationTimestamp") or "", pod["metadata"]["name"]) for pod in pods)
    return stamped[-1][1] if stamped else None
