"""The ``pods`` kind: plain pods, core objects only. We create every object ourselves, and a
headless Service named after the job owns the rest (deleting it takes the whole job): the
Service, Secret, ConfigMap (and a gang's PodGroup), then the workers and the master at once: the
master's launch script starts mpiexec once every worker's sshd accepts the job's key.
"""

from __future__ import annotations

from typing import ClassVar

from airflow_mpi.job.plan import JobPlan
from airflow_mpi.kinds.base import NOT_QUEUED, JobKind, Obj, QueueCheck
from airflow_mpi.kinds.gang import KUEUE_WORKLOAD, describe_group_wait, render_gang_manifests
from airflow_mpi.kinds.manifests import GVK, PLACEHOLDER_UID, SERVICE, owner_reference_to
from airflow_mpi.spec import Gang


class PodsKind(JobKind):
    """Our own pods, owned by the job's headless Service."""

    name = "pods"
    top_label = "Service"
    top_resource: ClassVar[GVK] = SERVICE

    def controller_makes_pods(self) -> bool:
        return False

    def render(self, plan: JobPlan, namespace: str, *, redact_secrets: bool = False) -> list[Obj]:
        """The Service, Secret, ConfigMap, the gang's group object if any, the workers, the master."""
        return render_gang_manifests(plan, namespace, owner_uid=PLACEHOLDER_UID, redact_secrets=redact_secrets)

    def owner_reference(self, plan: JobPlan, uid: str) -> Obj:
        """The headless Service owns every other object: deleting it garbage-collects the job."""
        return owner_reference_to(SERVICE, plan.job_name, uid)

    def owns(self, obj: Obj) -> bool:
        refs = obj.get("metadata", {}).get("ownerReferences") or []
        return any((ref.get("apiVersion"), ref.get("kind")) == ("v1", "Service") for ref in refs)

    def reads_top_to_queue(self, pods: list[Obj]) -> bool:
        return False  # the Service says nothing the pods do not

    def custom_objects_to_delete(self, plan: JobPlan) -> list[tuple[str, str, str]]:
        """Kueue's Workload of a job Kueue queues as a pod group (named after the job)."""
        return [KUEUE_WORKLOAD[:3]] if plan.spec.scheduling.gang is Gang.KUEUE else []

    def _queue_check(self, gang: bool, queue: str | None, pods: list[Obj], top: Obj | None) -> QueueCheck:
        """A gang's pods say whether it waits (unschedulable or gated, none scheduled). A job
        without a gang is never queued: ``startup_timeout`` covers unschedulable pods."""
        if not gang:
            return NOT_QUEUED
        return QueueCheck(reason=describe_group_wait(pods, queue))
