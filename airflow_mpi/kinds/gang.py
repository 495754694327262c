"""Gang scheduling for the Kubernetes backend's pods: the group object and each pod's marks.

Under any gang scheduler or queue the group only starts once all its pods exist, so the master is
created together with the workers (its launch script waits for their sshd), never after them:
workers first and the master once they are Ready would wait forever for a group that cannot
reach its size. Objects in creation order: Service, Secret, ConfigMap, PodGroup, master, workers.
"""

from __future__ import annotations

from decimal import Decimal

from airflow_mpi.job.plan import JobPlan
from airflow_mpi.kinds.manifests import (
    PLACEHOLDER_UID,
    Manifest,
    render_config_map,
    render_manifests,
    render_owner_reference,
    render_pod,
    render_resources,
    render_secret,
    render_service,
    require_image,
)
from airflow_mpi.spec import Gang, parse_quantity, render_quantity

# What each scheduler reads from a pod (names as the schedulers define them).
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
# A failed member is not waited for: Airflow owns retries, so the group ends with the failure.
KUEUE_RETRIABLE_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
KUEUE_FINALIZER = "kueue.x-k8s.io/managed"

# (group, version, plural, kind) of each PodGroup; Kueue's Workload is created by Kueue itself.
VOLCANO_POD_GROUP = ("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup")
COSCHEDULING_POD_GROUP = ("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup")
KUEUE_WORKLOAD = ("kueue.x-k8s.io", "v1beta1", "workloads", "Workload")
POD_GROUP_KINDS = {Gang.VOLCANO: VOLCANO_POD_GROUP, Gang.COSCHEDULING: COSCHEDULING_POD_GROUP}


def group_size(plan: JobPlan) -> int:
    """Pods that must run together: the master and every worker."""
    return len(plan.pods)


def sum_requests(plan: JobPlan) -> dict[str, str]:
    """The whole group's resource requests (a gang is admitted only when all of it fits)."""
    totals: dict[str, Decimal] = {}
    for pod in plan.pods:
        role = plan.spec.master if pod.role.value == "master" else plan.spec.workers
        for resource, amount in render_resources(role)["requests"].items():
            parsed = parse_quantity(amount)
            if parsed is not None:
                totals[resource] = totals.get(resource, Decimal(0)) + parsed
    return {resource: render_quantity(amount) for resource, amount in totals.items()}


def render_pod_group(plan: JobPlan, namespace: str, owner: Manifest | None) -> Manifest | None:
    """The PodGroup named after the job (volcano or coscheduling); None for kueue or no gang."""
    gang = plan.spec.scheduling.gang
    if gang not in POD_GROUP_KINDS:
        return None
    group, version, _, kind = POD_GROUP_KINDS[gang]
    metadata: Manifest = {"name": plan.job_name, "namespace": namespace, "labels": dict(plan.labels)}
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    spec: Manifest = {"minMember": group_size(plan), "minResources": sum_requests(plan)}
    if gang is Gang.VOLCANO:
        if plan.spec.scheduling.queue:
            spec["queue"] = plan.spec.scheduling.queue
        if plan.spec.pod.priority_class:
            spec["priorityClassName"] = plan.spec.pod.priority_class
    return {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": metadata, "spec": spec}


def mark_pod(plan: JobPlan, pod: Manifest) -> Manifest:
    """Add what the chosen scheduler reads to one pod manifest (in place; returned for chaining)."""
    scheduling = plan.spec.scheduling
    gang = scheduling.gang
    metadata = pod["metadata"]
    scheduler = scheduling.scheduler_for(gang)
    if scheduler:
        pod["spec"]["schedulerName"] = scheduler
    if gang is Gang.VOLCANO:
        metadata["annotations"][VOLCANO_GROUP_ANNOTATION] = plan.job_name
    elif gang is Gang.COSCHEDULING:
        metadata["labels"][COSCHEDULING_GROUP_LABEL] = plan.job_name
    elif gang is Gang.KUEUE:
        metadata["labels"][KUEUE_QUEUE_LABEL] = scheduling.queue
        metadata["labels"][KUEUE_GROUP_LABEL] = plan.job_name
        metadata["annotations"][KUEUE_TOTAL_ANNOTATION] = str(group_size(plan))
        metadata["annotations"][KUEUE_RETRIABLE_ANNOTATION] = "false"
    return pod


def render_gang_manifests(
    plan: JobPlan, namespace: str, *, owner_uid: str | None = None, redact_secrets: bool = False
) -> list[Manifest]:
    """Every object of a gang-scheduled job in creation order: Service, Secret, ConfigMap,
    the PodGroup (volcano, coscheduling), then the master and the workers together. Without a
    gang setting: the plain objects, the master last."""
    if plan.spec.scheduling.gang is None:
        objects = render_manifests(plan, namespace, owner_uid=owner_uid, redact_secrets=redact_secrets)
        return [mark_pod(plan, obj) if obj["kind"] == "Pod" else obj for obj in objects]
    require_image(plan)
    owner = render_owner_reference(plan, owner_uid or PLACEHOLDER_UID)
    objects = [
        render_service(plan, namespace),
        render_secret(plan, namespace, owner, redact=redact_secrets),
        render_config_map(plan, namespace, owner),
    ]
    pod_group = render_pod_group(plan, namespace, owner)
    if pod_group is not None:
        objects.append(pod_group)
    objects += [mark_pod(plan, render_pod(plan, pod, namespace, owner)) for pod in plan.pods]
    return objects


# Why a pod is not scheduled while its group waits: the scheduler's verdict or Kueue's gate.
WAITING_REASONS = ("Unschedulable", "SchedulingGated")


def describe_group_wait(pods: list[Manifest], queue: str | None = None) -> str | None:
    """Why the group waits for admission, or None once any of its pods was scheduled (from then
    on the usual rules apply). A group waits when none of its pods is scheduled and one says why
    (``PodScheduled=False``), in the scheduler's words, after the ``queue`` it waits in (the
    scheduler's verdict does not name it: Volcano's says "pod group is not ready, 3 Pending")."""
    if not pods:
        return None
    reason = None
    for pod in pods:
        conditions = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
        scheduled = conditions.get("PodScheduled") or {}
        if scheduled.get("status") == "True":
            return None
        if scheduled.get("status") == "False" and scheduled.get("reason") in WAITING_REASONS:
            reason = reason or scheduled.get("message") or scheduled.get("reason")
    if reason is None:
        return None
    return f"queued in queue {queue!r}: {reason}" if queue else f"queued: {reason}"
