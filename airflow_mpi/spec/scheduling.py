"""The spec's ``scheduling`` section: gang scheduling and queues, and its rules.

Without a gang scheduler, two jobs that each get part of their pods wait on each other until
``startup_timeout`` while holding GPUs. A gang setting makes the whole job (master and workers)
one group that is admitted at once or waits queued; ``queue_timeout`` bounds that wait.
The priority class is ``pod.priority_class``: one field, used by the pods and the group alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from airflow_mpi.exceptions import SpecIssue
from airflow_mpi.spec.formats import DNS_SUBDOMAIN, MAX_DNS_SUBDOMAIN

if TYPE_CHECKING:
    from airflow_mpi.spec.types import MPIJobSpec


class Gang(str, Enum):
    """Who holds the job's pods until all of them can run."""

    VOLCANO = "volcano"  # Volcano's scheduler and a scheduling.volcano.sh PodGroup
    COSCHEDULING = "coscheduling"  # scheduler-plugins' Coscheduling and a scheduling.x-k8s.io PodGroup
    KUEUE = "kueue"  # Kueue's plain-pod group: gated until the LocalQueue admits the whole group


# The scheduler that runs each gang setting's plugin, unless ``scheduler_name`` says otherwise.
DEFAULT_SCHEDULERS = {Gang.VOLCANO: "volcano", Gang.COSCHEDULING: "scheduler-plugins-scheduler"}


@dataclass(frozen=True)
class SchedulingSpec:
    """How the job waits for its resources. ``queue``: the Volcano Queue (``volcano``, and the
    Volcano Job backend) or Kueue LocalQueue (``kueue``). ``queue_timeout``: seconds the job may
    wait queued before it fails (default: no bound); ``startup_timeout`` starts once admitted."""

    gang: Gang | None = None
    """Who holds the pods until all of them can run: ``volcano``, ``coscheduling`` or ``kueue``. Default:
    no gang."""
    queue: str | None = None
    """The Volcano Queue (``volcano``, and the Volcano Job backend) or Kueue LocalQueue (``kueue``:
    required)."""
    scheduler_name: str | None = None
    """The pods' ``schedulerName``. Default: the gang's scheduler (``volcano``, ``scheduler-plugins-
    scheduler``)."""
    queue_timeout: int | None = None
    """Seconds the job may wait queued before it fails. Default: no bound (``startup_timeout`` starts
    once admitted)."""

    def scheduler_for(self, gang: Gang | None) -> str | None:
        """The pods' ``schedulerName`` under ``gang``; None keeps the cluster's default scheduler."""
        if self.scheduler_name:
            return self.scheduler_name
        return DEFAULT_SCHEDULERS.get(gang) if gang is not None else None


def check_scheduling(spec: MPIJobSpec) -> list[SpecIssue]:
    """The section's rules: names the API accepts, and what each gang setting needs."""
    section = spec.scheduling
    issues = []
    for key in ("queue", "scheduler_name"):
        value = getattr(section, key)
        if value is not None and (len(value) > MAX_DNS_SUBDOMAIN or not DNS_SUBDOMAIN.match(value)):
            issues.append(
                SpecIssue(
                    f"scheduling.{key}",
                    f"{value!r} is not a valid object name",
                    "use lowercase letters, digits, '-' and '.', e.g. 'training'",
                )
            )
    if section.gang is Gang.KUEUE and not section.queue:
        issues.append(
            SpecIssue(
                "scheduling.queue",
                "is required with gang 'kueue': Kueue admits only pods that name their LocalQueue",
                "set it to the LocalQueue of this namespace, e.g. 'training'",
            )
        )
    if section.gang is Gang.COSCHEDULING and section.queue:
        issues.append(
            SpecIssue(
                "scheduling.queue",
                "has no meaning with gang 'coscheduling' (its PodGroup has no queue)",
                "remove it, or use gang 'volcano' or 'kueue' to queue jobs",
            )
        )
    if section.queue_timeout is not None and section.queue_timeout < 1:
        issues.append(
            SpecIssue(
                "scheduling.queue_timeout",
                f"is {section.queue_timeout}",
                "give the longest wait in the queue in seconds, e.g. 3600, or leave it out for no bound",
            )
        )
    return issues
