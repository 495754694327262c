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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_mpi.job.naming import RunIdentity, build_pod_name, job_selector
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.kinds.gang import KUEUE_WORKLOAD, describe_group_wait, render_gang_manifests
from airflow_mpi.kinds.manifests import PLACEHOLDER_UID, config_map_name, render_owner_reference
from airflow_mpi.kinds.mpijob import (
    LABEL_OPERATOR_JOB,
    MPIJOB,
    describe_mpijob_failure,
    describe_mpijob_wait,
    describe_validation_event,
    launcher_name,
    launcher_selector,
    mpijob_config_map_name,
    render_mpijob_manifests,
    render_mpijob_owner_reference,
    render_mpijob_plan,
    without_cleanup_kills,
)
from airflow_mpi.kinds.permissions import WATCHDOG_RULES, Permission, build_job_rules, build_permissions
from airflow_mpi.kinds.volcano import (
    VOLCANO_JOB,
    describe_volcano_wait,
    render_volcano_manifests,
    render_volcano_owner_reference,
    without_policy_kills,
)
from airflow_mpi.observe.status import PodState, PodTable, pod_state_from_k8s
from airflow_mpi.spec import Gang, MPIJobSpec, Role

Obj = dict[str, Any]
GVK = tuple[str, str, str, str]  # (group, version, plural, kind)

# How long a custom top object may go without any sign of its controller (no condition, no
# pods) before the controller is taken to be absent.
CONTROLLER_GRACE = 60.0


@dataclass(frozen=True)
class QueueCheck:
    """Where a job stands before its pods run: ``reason`` (queued, and why), ``failure`` (it
    never will run: say so and end), or neither (not queued: the pod rules apply)."""

    reason: str | None = None
    failure: str | None = None


NOT_QUEUED = QueueCheck()


class JobKind:
    """The ``pods`` kind, and what every kind shares; the others override what differs."""

    name: ClassVar[str] = "pods"
    # The custom object a job of this kind is (None: our own objects, owned by a Service).
    top: ClassVar[GVK | None] = None
    top_label: ClassVar[str] = "Service"  # for messages: "Volcano job", "MPIJob"
    # Our Secret and ConfigMap are created before the top object (its controller starts pods at
    # once, and a pod must find its volumes), then made its dependents.
    ours_before_top: ClassVar[bool] = False
    # The master is a controller's pod named ``<master>-<random>`` (a batch Job's): the newest counts.
    master_generated: ClassVar[bool] = False
    # The top object says why the master pod was deleted (read once, when it is).
    explains_master_deletion: ClassVar[bool] = False

    @property
    def top_owner(self) -> tuple[str, str]:
        """(apiVersion, kind) of the owner of the job's own objects: the top object."""
        if self.top is None:
            return ("v1", "Service")
        group, version, _, kind = self.top
        return (f"{group}/{version}", kind)

    def render(self, plan: JobPlan, namespace: str) -> list[Obj]:
        """Every object the job is made of, in creation order (the top object first)."""
        return render_gang_manifests(plan, namespace, owner_uid=PLACEHOLDER_UID)

    def owner_reference(self, plan: JobPlan, uid: str) -> Obj:
        """What makes our objects the top object's dependents (deleted with it)."""
        return render_owner_reference(plan, uid)

    def config_map_name(self, job_name: str) -> str:
        """The job's own ConfigMap (the launch script, the hostfile; the live log's shown mark)."""
        return config_map_name(job_name)

    def permissions(self, spec: MPIJobSpec) -> tuple[Permission, ...]:
        """Every verb a job of this kind with ``spec`` needs, checked before anything is created."""
        gang = spec.scheduling.gang
        rules = build_job_rules(self.name, gang.value if gang is not None else None)
        return build_permissions((*rules, *(WATCHDOG_RULES if spec.progress_timeout is not None else ())))

    def render_plan(
        self, spec: MPIJobSpec, identity: RunIdentity, platform_env: Mapping[str, str] | None = None
    ) -> JobPlan:
        """The job's plan as this kind runs it (``platform_env``: what the platform writes into every pod)."""
        return render_plan(spec, identity, platform_env=platform_env)

    def starts_master_with_workers(self, plan: JobPlan) -> bool:
        """Whether the master is created with the workers (its launch script then waits for
        their sshd) rather than once they are ready: a gang starts whole."""
        return plan.spec.scheduling.gang is not None

    def custom_objects_to_delete(self, plan: JobPlan) -> list[tuple[str, str, str]]:
        """(group, version, plural) of the custom objects named after the job that a kill deletes."""
        gang = plan.spec.scheduling.gang
        return [KUEUE_WORKLOAD[:3]] if gang is Gang.KUEUE else []

    def owns(self, obj: Obj) -> bool:
        """Whether a job's object (our Secret, a pod) belongs to a job of this kind, by its owner."""
        refs = obj.get("metadata", {}).get("ownerReferences") or []
        return any((ref.get("apiVersion"), ref.get("kind")) == self.top_owner for ref in refs)

    # --- pod states -----------------------------------------------------------------------

    def observe(self, states: list[PodState], deleting: set[str]) -> list[PodState]:
        """The states that decide the job, from the watched ones (``deleting``: pods the API is
        deleting): without the pods the kind's own controller removes once the job is decided."""
        return states

    def master_gone_failure(self, top: Obj | None) -> str | None:
        """Why the master pod was deleted, as the top object says (None: it does not say)."""
        return None

    def listed_states(self, pods: list[Obj]) -> list[PodState]:
        """The deciding states from the pods as listed (no watch: the cluster CLI)."""
        states = [pod_state_from_k8s(pod) for pod in pods]
        deleting = {pod["metadata"]["name"] for pod in pods if pod["metadata"].get("deletionTimestamp")}
        return self.observe(states, deleting)

    def master_pod(self, job_name: str, pods: list[Obj]) -> str:
        """The pod whose log is the job's (``pods``: those ``master_selector`` lists, if any)."""
        return build_pod_name(job_name, Role.MASTER, 0)

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
        """Whether ``queue_check`` needs the top object (read only then: one request)."""
        return False

    def queue_check(self, gang: bool, queue: str | None, pods: list[Obj], top: Obj | None) -> QueueCheck:
        """Whether the job waits for admission (``gang``: it has a gang setting; ``queue``: the
        queue it names): a gang's pods say so (unschedulable or gated,
        none scheduled). A job without a gang is never queued: ``startup_timeout`` covers
        unschedulable pods."""
        if not gang:
            return NOT_QUEUED
        return QueueCheck(reason=describe_group_wait(pods, queue))

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


class VolcanoKind(JobKind):
    name = "volcano"
    top = VOLCANO_JOB
    top_label = "Volcano job"

    def render(self, plan: JobPlan, namespace: str) -> list[Obj]:
        """The Volcano Job, our Secret, our ConfigMap."""
        return list(render_volcano_manifests(plan, namespace))

    def owner_reference(self, plan: JobPlan, uid: str) -> Obj:
        return render_volcano_owner_reference(plan, uid)

    def starts_master_with_workers(self, plan: JobPlan) -> bool:
        return True

    def custom_objects_to_delete(self, plan: JobPlan) -> list[tuple[str, str, str]]:
        return [VOLCANO_JOB[:3]]

    def observe(self, states: list[PodState], deleting: set[str]) -> list[PodState]:
        """Without the pods Volcano's policy deleted once one pod ended by itself."""
        return without_policy_kills(states, deleting)

    def reads_top_to_queue(self, pods: list[Obj]) -> bool:
        return not pods

    def queue_check(self, gang: bool, queue: str | None, pods: list[Obj], top: Obj | None) -> QueueCheck:
        """Queued while the Job is Pending and none of its pods exists yet (Volcano creates them
        only once the queue admits the whole job)."""
        if pods:
            return NOT_QUEUED
        return QueueCheck(reason=describe_volcano_wait(top))

    def extra_leftover_queries(self, job_name: str) -> list[tuple[str, str]]:
        return [("pods", job_selector(job_name))]


class MPIJobKind(JobKind):
    name = "mpijob"
    top = MPIJOB
    top_label = "MPIJob"
    launcher_owner: ClassVar[tuple[str, str]] = ("batch/v1", "Job")  # the launcher pod's owner
    ours_before_top = True
    master_generated = True
    explains_master_deletion = True

    def render(self, plan: JobPlan, namespace: str) -> list[Obj]:
        """The MPIJob, our Secret, our ConfigMap."""
        return list(render_mpijob_manifests(plan, namespace))

    def owner_reference(self, plan: JobPlan, uid: str) -> Obj:
        return render_mpijob_owner_reference(plan, uid)

    def config_map_name(self, job_name: str) -> str:
        return mpijob_config_map_name(job_name)

    def render_plan(
        self, spec: MPIJobSpec, identity: RunIdentity, platform_env: Mapping[str, str] | None = None
    ) -> JobPlan:
        return render_mpijob_plan(spec, identity, platform_env=platform_env)

    def starts_master_with_workers(self, plan: JobPlan) -> bool:
        return True

    def custom_objects_to_delete(self, plan: JobPlan) -> list[tuple[str, str, str]]:
        return [MPIJOB[:3]]

    def owns(self, obj: Obj) -> bool:
        """Owned by the MPIJob, or by its launcher's batch Job (the launcher pod); or by nothing
        yet: this kind alone creates its Secret and ConfigMap before their owner exists."""
        refs = obj.get("metadata", {}).get("ownerReferences") or []
        return not refs or any(
            (ref.get("apiVersion"), ref.get("kind")) in (self.top_owner, self.launcher_owner) for ref in refs
        )

    def observe(self, states: list[PodState], deleting: set[str]) -> list[PodState]:
        """Without the workers the controller removes once the launcher ended by itself."""
        return without_cleanup_kills(states, deleting)

    def master_gone_failure(self, top: Obj | None) -> str | None:
        """The MPIJob's ``Failed`` condition (e.g. the launcher Job's ``DeadlineExceeded``)."""
        return describe_mpijob_failure(top)

    def listed_states(self, pods: list[Obj]) -> list[PodState]:
        """The newest launcher pod as the master (the batch Job replaces one that failed)."""
        states = [pod_state_from_k8s(pod) for pod in pods]
        launchers = [pod for pod, state in zip(pods, states, strict=True) if state.role is Role.MASTER]
        newest = newest_pod(launchers)
        kept = [state for state in states if state.role is not Role.MASTER or state.name == newest]
        deleting = {pod["metadata"]["name"] for pod in pods if pod["metadata"].get("deletionTimestamp")}
        return self.observe(kept, deleting)

    def master_pod(self, job_name: str, pods: list[Obj]) -> str:
        """The newest launcher pod (``<job>-launcher-<random>``), or the launcher's name if none."""
        launchers = [pod for pod in pods if pod["metadata"]["name"].startswith(f"{launcher_name(job_name)}-")]
        return newest_pod(launchers) or launcher_name(job_name)

    def reads_top_to_queue(self, pods: list[Obj]) -> bool:
        return not pods

    def queue_check(self, gang: bool, queue: str | None, pods: list[Obj], top: Obj | None) -> QueueCheck:
        """Queued while the MPIJob is suspended (Kueue has not admitted it) or has no pods yet
        (its gang waits); failed at once when the MPIJob failed before any pod existed."""
        if pods:  # a gang's pods wait unscheduled; others are not queued (startup_timeout holds)
            return super().queue_check(gang, queue, pods, top)
        failure = describe_mpijob_failure(top)
        if failure is not None:
            return QueueCheck(failure=failure)
        return QueueCheck(reason=describe_mpijob_wait(top, False))

    def reads_events_to_queue(self, top: Obj | None) -> bool:
        """An MPIJob with no condition yet: mpi-operator refuses an invalid one only with an event."""
        return top is not None and not (top.get("status") or {}).get("conditions")

    def refusal(self, job_name: str, events: list[Obj], waited: float) -> str | None:
        refused = describe_validation_event(events)
        if refused is not None:
            return f"mpi-operator refused MPIJob {job_name} (ValidationError): {refused}"
        if waited > CONTROLLER_GRACE:
            return (
                f"MPIJob {job_name}: mpi-operator has not acted on it in {waited:.0f}s (no condition, no pods): "
                "install mpi-operator v0.5.0 or later, or check that it is running and watches this namespace"
            )
        return None

    def extra_leftover_queries(self, job_name: str) -> list[tuple[str, str]]:
        return [("pods", f"{LABEL_OPERATOR_JOB}={job_name}")]

    def leftover_names(self, job_name: str) -> list[tuple[str, str]]:
        """The controller's own Service, ssh Secret and hostfile ConfigMap."""
        return [("services", job_name), ("secrets", f"{job_name}-ssh"), ("configmaps", f"{job_name}-config")]

    def master_selector(self, job_name: str) -> str:
        return launcher_selector(job_name)


KINDS: dict[str, JobKind] = {kind.name: kind for kind in (JobKind(), VolcanoKind(), MPIJobKind())}
# The cluster CLI tells a job's kind by its objects' owners, most specific first.
OWNER_ORDER = ("volcano", "mpijob", "pods")


def job_kind(name: str) -> JobKind:
    """The kind named ``name`` (``pods``, ``volcano``, ``mpijob``)."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown job kind {name!r}: one of {', '.join(KINDS)}") from None


def kind_of(obj: Obj) -> JobKind:
    """The kind of the job ``obj`` (our Secret, a pod) belongs to, by its owner."""
    return next((KINDS[name] for name in OWNER_ORDER if KINDS[name].owns(obj)), KINDS["pods"])


def newest_pod(pods: list[Obj]) -> str | None:
    """The name of the pod created last (names break ties: a second's resolution)."""
    stamped = sorted((pod["metadata"].get("creationTimestamp") or "", pod["metadata"]["name"]) for pod in pods)
    return stamped[-1][1] if stamped else None
