"""Job kinds: what differs between the three ways a job's pods come to exist on Kubernetes.

- ``pods``: we create every object; a headless Service owns the rest.
- ``volcano``: a ``batch.volcano.sh`` Job; Volcano's controller creates the pods once its queue
  admits the whole job, and its policy deletes the other pods once one ended by itself.
- ``mpijob``: a ``kubeflow.org`` MPIJob; mpi-operator creates the workers and a launcher batch
  Job whose newest pod is the master, and removes the workers once the launcher ended.

Everything here is pure: the objects a kind renders, its top object (what deleting takes the
whole job), how its pods' states are read, how a queued job is described, what counts as left
over. The waiting backend (``backends.kubernetes``) and the deferred trigger (``triggers.mpi``)
are given a kind by name and call these very functions on what they read, so both decide alike.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_mpi.job.naming import RunIdentity, build_pod_name
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.kinds.gang import KUEUE_WORKLOAD, describe_group_wait, render_gang_manifests
from airflow_mpi.kinds.manifests import PLACEHOLDER_UID, config_map_name, render_owner_reference
from airflow_mpi.kinds.permissions import Permission, Rules, build_job_permissions, build_trigger_permissions
from airflow_mpi.kinds.registry import KIND_ENTRIES, KIND_OF_BACKEND
from airflow_mpi.observe.status import PodPhase, PodState, PodTable, pod_state_from_k8s
from airflow_mpi.spec import Gang, MPIJobSpec, Role

Obj = dict[str, Any]
GVK = tuple[str, str, str, str]  # (group, version, plural, kind)

SERVICE: GVK = ("", "v1", "services", "Service")  # the ``pods`` kind's top object


@dataclass(frozen=True)
class QueueCheck:
    """Where a job stands before its pods run: ``reason`` (queued, and why), ``failure`` (it
    never will run: say so and end), or neither (not queued: the pod rules apply)."""

    reason: str | None = None
    failure: str | None = None


NOT_QUEUED = QueueCheck()
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
class Admission:
    """What a job's pods and top object say before it runs: ``queued`` (why it waits for
    admission), ``never_starts`` (the whole error: its controller refused or failed it), or
    neither (admitted, or never queued: the pods' states decide)."""

    queued: str | None = None
    never_starts: str | None = None


class JobKind:
    """The ``pods`` kind, and what every kind shares; the others override what differs."""

    name: ClassVar[str] = "pods"  # its entry in ``kinds.registry``
    # The custom object a job of this kind is (None: our own objects, owned by a Service).
    top: ClassVar[GVK | None] = None
    top_label: ClassVar[str] = "Service"  # for messages: "Volcano job", "MPIJob"
    # The master is a controller's pod named ``<master>-<random>`` (a batch Job's): the newest counts.
    master_generated: ClassVar[bool] = False
    # The top object says why the master pod was deleted (read once, when it is).
    explains_master_deletion: ClassVar[bool] = False
    # What a job of this kind adds to the worker's Role (docs/guides/rbac.md's table): its top object.
    rules: ClassVar[Rules] = ()
    # What it adds to the triggerer's Role: reading its top object (and deleting it on a kill).
    trigger_rules: ClassVar[Rules] = ()

    @property
    def top_resource(self) -> GVK:
        """The API resource of the job's top object: the controller's custom resource, or our
        Service (group "": the core API)."""
        return self.top or SERVICE

    def controller_makes_pods(self) -> bool:
        """Whether a controller creates the job's pods from its top object (a pod not there yet
        may still come; the controller's object goes first and last), rather than we ourselves."""
        return self.top is not None

    def made_before_top(self, obj: Obj) -> bool:
        """Whether ``obj`` (one of ``render``'s beside the top object) must exist before the top
        object, and is only then given it as its owner. Our Secret and ConfigMap never are: they
        are created owned by the top object, so no crash leaves a private key nobody owns (a pod
        that starts first waits for its volumes, as the kubelet retries them)."""
        return False

    @property
    def top_owner(self) -> tuple[str, str]:
        """(apiVersion, kind) of the owner of the job's own objects: the top object."""
        if self.top is None:
            return ("v1", "Service")
        group, version, _, kind = self.top
        return (f"{group}/{version}", kind)

    def render(self, plan: JobPlan, namespace: str, *, redact_secrets: bool = False) -> list[Obj]:
        """Every object the job is made of, in creation order (the top object first);
        ``redact_secrets``: the keys replaced by a placeholder (what ``airflow-mpi render`` prints)."""
        return render_gang_manifests(plan, namespace, owner_uid=PLACEHOLDER_UID, redact_secrets=redact_secrets)

    def dependent_resource(self, obj: Obj) -> GVK:
        """The API resource of one of the objects ``render`` gives beside the top object (group
        "": the core API)."""
        try:
            return CORE_DEPENDENTS[obj["kind"]]
        except KeyError:
            raise ValueError(f"{self.name} jobs have no {obj.get('kind')!r} objects") from None

    def owner_reference(self, plan: JobPlan, uid: str) -> Obj:
        """What makes our objects the top object's dependents (deleted with it)."""
        return render_owner_reference(plan, uid)

    def config_map_name(self, job_name: str) -> str:
        """The job's own ConfigMap (the launch script, the hostfile)."""
        return config_map_name(job_name)

    def permissions(self, spec: MPIJobSpec) -> tuple[Permission, ...]:
        """Every verb the worker needs for a job of this kind with ``spec``, checked before it creates anything."""
        gang = spec.scheduling.gang
        return build_job_permissions(self.rules, gang.value if gang else None, spec.progress_timeout is not None)

    def trigger_permissions(self, deleted_on_kill: Sequence[Sequence[str]]) -> tuple[Permission, ...]:
        """Every verb the triggerer needs for a deferred job of this kind whose kill deletes ``deleted_on_kill``."""
        return build_trigger_permissions(self.trigger_rules, deleted_on_kill)

    def render_plan(
        self, spec: MPIJobSpec, identity: RunIdentity, platform_env: Mapping[str, str] | None = None
    ) -> JobPlan:
        """The job's plan as this kind runs it (``platform_env``: what the platform writes into every pod)."""
        return render_plan(spec, identity, platform_env=platform_env)

    def starts_master_with_workers(self, plan: JobPlan | None) -> bool:
        """Whether the master is created with the workers (its launch script then waits for
        their sshd) rather than once they are ready: a controller starts every pod, a gang starts
        whole (``plan`` None: a job adopted without its plan)."""
        return self.controller_makes_pods() or (plan is not None and plan.spec.scheduling.gang is not None)

    def refused_for_now(self, message: str) -> bool:
        """Whether the API's refusal of the top object (``message``) may pass by itself in a
        moment (an admission webhook that has not seen what was created just before it): the
        create is then tried again, briefly."""
        return False

    def deletion_propagation(self) -> str:
        """How teardown deletes the top object: ``Foreground``, so that it is gone only once
        everything it owns is (the wait for it to go is the wait for the whole job)."""
        return "Foreground"

    def custom_objects_to_delete(self, plan: JobPlan) -> list[tuple[str, str, str]]:
        """(group, version, plural) of the custom objects named after the job that a kill deletes:
        the controller's top object, or Kueue's Workload of a job of ours."""
        if self.top is not None:
            return [self.top[:3]]
        gang = plan.spec.scheduling.gang
        return [KUEUE_WORKLOAD[:3]] if gang is Gang.KUEUE else []

    def owns(self, obj: Obj) -> bool:
        """Whether a job's object (our Secret, a pod) belongs to a job of this kind, by its owner."""
        refs = obj.get("metadata", {}).get("ownerReferences") or []
        return any((ref.get("apiVersion"), ref.get("kind")) == self.top_owner for ref in refs)

    # --- the decisions both ways of waiting make --------------------------------------------

    def admission(
        self, job_name: str, gang: bool, queue: str | None, pods: list[Obj], top: Obj | None,
        refusal: Callable[[], str | None],
    ) -> Admission:  # fmt: skip
        """Whether the job waits for admission, or never starts. ``refusal`` reads what the
        controller's events say (asked only while queued, where the kind reads them)."""
        check = self.queue_check(gang, queue, pods, top)
        if check.failure is not None:
            return Admission(never_starts=f"{self.top_label} {job_name}: {check.failure}")
        if check.reason is None:
            return Admission()
        refused = refusal() if self.reads_events_to_queue(top) else None
        return Admission(never_starts=refused) if refused is not None else Admission(queued=check.reason)

    def deciding_states(
        self, master: str, states: list[PodState], deleting: set[str], master_gone_failure: str | None
    ) -> list[PodState]:
        """The pods' states that decide the job (``observe.status.evaluate_job``): a master pod
        deleted for a reason its top object gives fails with that reason; then ``observe``."""
        if master_gone_failure is not None:
            states = [state for state in states if state.name != master]
            states.append(PodState(master, Role.MASTER, PodPhase.FAILED, reason=master_gone_failure))
        return self.observe(states, deleting)

    # --- pod states -----------------------------------------------------------------------

    def observe(self, states: list[PodState], deleting: set[str]) -> list[PodState]:
        """The states that decide the job, from the watched ones (``deleting``: pods the API is
        deleting): without the pods the kind's own controller removes once the job is decided."""
        return states

    def master_gone_failure(self, top: Obj | None) -> str | None:
        """Why the master pod was deleted, as the top object says (None: it does not say)."""
        return None

    def reads_top_when_master_deleted(self) -> bool:
        """Whether a deleted master pod is a reason to read the top object (``master_gone_failure``)."""
        return self.explains_master_deletion

    def master_counts_from_start(self, table: PodTable, master: str) -> bool:
        """Whether an adopted job's master is watched from the start: seen already, or a
        controller's, made with the workers."""
        return self.master_generated or master in table.pods

    def attached_roles(self, job_name: str, pods: Mapping[str, Obj]) -> tuple[str, dict[str, Role]]:
        """The master's name and every pod's role, for a job found by name alone (the cluster CLI):
        a generated master is its controller's newest pod, whatever name the watch sees."""
        roles = {name: pod_state_from_k8s(pod).role for name, pod in pods.items()}
        if not self.master_generated:  # a master not created yet is not waited for
            return next(
                (n for n, r in roles.items() if r is Role.MASTER), build_pod_name(job_name, Role.MASTER, 0)
            ), roles
        master = self.master_pod(job_name, [])
        roles = {name: role for name, role in roles.items() if role is not Role.MASTER}
        roles[master] = Role.MASTER
        return master, roles

    def listed_states(self, pods: list[Obj]) -> list[PodState]:
        """The deciding states from the pods as listed (no watch: the cluster CLI); a generated
        master's newest pod is the master (its batch Job replaces one that failed)."""
        states = [pod_state_from_k8s(pod) for pod in pods]
        if self.master_generated:
            newest = newest_pod([pod for pod, state in zip(pods, states, strict=True) if state.role is Role.MASTER])
            states = [state for state in states if state.role is not Role.MASTER or state.name == newest]
        deleting = {pod["metadata"]["name"] for pod in pods if pod["metadata"].get("deletionTimestamp")}
        return self.observe(states, deleting)

    def master_name(self, job_name: str) -> str:
        """The master's name in the plan, which is its host name: ``<job>-master-0``."""
        return build_pod_name(job_name, Role.MASTER, 0)

    def master_pod(self, job_name: str, pods: list[Obj]) -> str:
        """The pod whose log is the job's: the master's own, or a generated master's newest pod
        (``<master>-<random>``, among ``pods``: those ``master_selector`` lists), or its name if none."""
        name = self.master_name(job_name)
        if not self.master_generated:
            return name
        return newest_pod([pod for pod in pods if pod["metadata"]["name"].startswith(f"{name}-")]) or name

    def master_pod_now(self, table: PodTable, master: str) -> str | None:
        """The master's own pod as the watch sees it: ``master`` once seen, or a generated
        master's newest pod; None while there is none (a controller creates the pods after
        the job is submitted: a log read before then is a 404 that says nothing)."""
        if not self.master_generated:
            return master if master in table.pods else None
        generated = table.generated(master, Role.MASTER)
        return generated[-1] if generated else None

    def master_selector(self, job_name: str) -> str | None:
        """The label selector of a generated master's pods (it may have had several); None:
        the master's name is fixed, nothing to list."""
        return None

    # --- queued ---------------------------------------------------------------------------

    def reads_top_to_queue(self, pods: list[Obj]) -> bool:
        """Whether ``queue_check`` needs the top object (read only then: one request): a
        controller's, before it made any pod."""
        return self.controller_makes_pods() and not pods

    def queue_check(self, gang: bool, queue: str | None, pods: list[Obj], top: Obj | None) -> QueueCheck:
        """Whether the job waits for admission (``gang``: it has a gang setting; ``queue``: the
        queue it names). A controller's job without pods yet waits as its top object says
        (``top_wait``), or never starts when that failed already; once there are pods, a gang's
        say so (unschedulable or gated, none scheduled). A job without a gang is never queued:
        ``startup_timeout`` covers unschedulable pods."""
        if self.controller_makes_pods() and not pods:
            failure = self.master_gone_failure(top)
            return QueueCheck(failure=failure) if failure is not None else QueueCheck(reason=self.top_wait(top))
        if not gang:
            return NOT_QUEUED
        return QueueCheck(reason=describe_group_wait(pods, queue))

    def top_wait(self, top: Obj | None) -> str | None:
        """Why a controller's job has no pods yet, as its top object says (suspended in a
        queue, not yet seen by the controller ...); None: it does not wait."""
        return None

    def reads_events_to_queue(self, top: Obj | None) -> bool:
        """Whether the controller's events may tell why the job never starts."""
        return False

    def events_selector(self, job_name: str) -> str:
        """The field selector of the events about the job's top object."""
        kind = self.top[3] if self.top else "Service"
        return f"involvedObject.name={job_name},involvedObject.kind={kind}"

    def refusal(self, job_name: str, events: list[Obj], waited: float) -> str | None:
        """Why the controller will never start the job (its events, or its silence for
        ``waited`` seconds), or None."""
        return None

    # --- leftovers ------------------------------------------------------------------------

    def extra_leftover_queries(self, job_name: str) -> list[tuple[str, str]]:
        """(plural, label selector) of objects a controller made that must be gone once the job
        is (beyond our Service, Secret and ConfigMap, which every kind checks)."""
        return []

    def leftover_names(self, job_name: str) -> list[tuple[str, str]]:
        """(plural, name) of core objects a controller made under its own labels."""
        return []


@functools.cache
def registered_kinds() -> dict[str, JobKind]:
    """Every kind of ``kinds.registry``, by name, in its order (imported on first use: a kind's
    module may import this one)."""
    kinds: dict[str, JobKind] = {}
    for entry in KIND_ENTRIES:
        module, _, cls = entry.path.partition(":")
        kind = getattr(importlib.import_module(module), cls)()
        if kind.name != entry.name:
            raise TypeError(f"{entry.path} is kind {kind.name!r}, registered as {entry.name!r}")
        kinds[entry.name] = kind
    return kinds


def job_kind(name: str) -> JobKind:
    """The kind named ``name`` (``pods``, ``volcano``, ``mpijob``)."""
    kinds = registered_kinds()
    try:
        return kinds[name]
    except KeyError:
        raise ValueError(f"unknown job kind {name!r}: one of {', '.join(kinds)}") from None


def kind_for_backend(backend: str) -> JobKind:
    """The kind an ``mpi`` connection's Kubernetes ``backend`` runs (``kubernetes``: plain pods)."""
    try:
        return job_kind(KIND_OF_BACKEND[backend])
    except KeyError:
        raise ValueError(f"unknown Kubernetes backend {backend!r}: one of {', '.join(KIND_OF_BACKEND)}") from None


def kind_of(obj: Obj) -> JobKind:
    """The kind of the job ``obj`` (our Secret, a pod) belongs to, by its owner: the kinds with a
    top object of their own first, then the one whose objects a Service owns."""
    kinds = sorted(registered_kinds().values(), key=lambda kind: kind.top is None)
    return next((kind for kind in kinds if kind.owns(obj)), kinds[-1])


def top_condition(top: Obj | None, kind: str) -> Obj | None:
    """The top object's condition ``kind`` when its status is True, else None."""
    for condition in ((top or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return dict(condition)
    return None


def event_message(events: list[Obj], reason: str) -> str | None:
    """The message of the first event with ``reason`` (a controller that refuses an object may
    say so only in an event: no condition), or None."""
    for event in events:
        if event.get("reason") == reason:
            return str(event.get("message") or reason)
    return None


def without_cleanup_kills(states: list[PodState], deleting: set[str]) -> list[PodState]:
    """Pod states without the workers a controller removes once the master has ended by itself
    (mpi-operator's ``cleanPodPolicy: Running``, JobSet's deletion of the Jobs still active): they
    are not what decided the job (an evicted or failed worker is kept)."""
    master = next((state for state in states if state.role is Role.MASTER), None)
    if master is None or not master.ended or master.reason == "Deleted":
        return states
    return [
        state
        for state in states
        if state.role is Role.MASTER or (state.name not in deleting and state.reason != "Deleted")
    ]


def newest_pod(pods: list[Obj]) -> str | None:
    """The name of the pod created last (names break ties: a second's resolution)."""
    stamped = sorted((pod["metadata"].get("creationTimestamp") or "", pod["metadata"]["name"]) for pod in pods)
    return stamped[-1][1] if stamped else None
