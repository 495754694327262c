"""One state machine for a job: pod states -> job phase and, when it failed, the cause.

The operator, the sensor and the triggers all decide through ``evaluate_job``; backends only
report what each pod is doing (``PodState``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from airflow_mpi.spec import Role

# Waiting reasons that never fix themselves: fail at once with the pod's own message.
FATAL_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "ErrImageNeverPull",
        "RunContainerError",
    }
)


class PodPhase(str, Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class PodState:
    name: str
    role: Role
    phase: PodPhase
    ready: bool = False
    exit_code: int | None = None
    reason: str = ""  # e.g. OOMKilled, Evicted, ErrImagePull, Unschedulable
    message: str = ""

    @property
    def ended(self) -> bool:
        return self.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)

    def describe(self) -> str:
        parts = [f"pod {self.name} ({self.role.value}) {self.phase.value.lower()}"]
        if self.exit_code is not None:
            parts.append(f"exit code {self.exit_code}")
        if self.reason:
            parts.append(self.reason)
        if self.message:
            parts.append(self.message)
        return ", ".join(parts)


class JobPhase(str, Enum):
    STARTING = "starting"  # workers not all ready yet
    READY = "ready"  # every worker ready, master not started
    RUNNING = "running"  # master started
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED)


@dataclass(frozen=True)
class JobStatus:
    phase: JobPhase
    failed_pod: str | None = None
    exit_code: int | None = None
    reason: str = ""

    @property
    def finished(self) -> bool:
        return self.phase.finished


def evaluate_job(pods: Sequence[PodState]) -> JobStatus:
    """The job's phase from its pods. A worker that ends, for any reason, while the job is not done
    fails the job: workers only run sshd, and an MPI job cannot lose a rank's node."""
    master = next((p for p in pods if p.role is Role.MASTER), None)
    workers = [p for p in pods if p.role is Role.WORKER]

    for pod in pods:
        if pod.reason in FATAL_WAITING_REASONS:
            return JobStatus(JobPhase.FAILED, pod.name, pod.exit_code, pod.describe())
    # A worker lost while the master is still going is the root cause, whatever the master says next.
    master_done = master is not None and master.phase is PodPhase.SUCCEEDED
    if not master_done:
        for worker in workers:
            if worker.ended:
                return JobStatus(JobPhase.FAILED, worker.name, worker.exit_code, worker.describe())
    if master is not None:
        if master.phase is PodPhase.FAILED:
            return JobStatus(JobPhase.FAILED, master.name, master.exit_code, master.describe())
        if master.phase is PodPhase.SUCCEEDED:
            return JobStatus(JobPhase.SUCCEEDED, exit_code=0)
        return JobStatus(JobPhase.RUNNING)  # created: pending or running
    if workers and not all(w.ready for w in workers):
        return JobStatus(JobPhase.STARTING)
    return JobStatus(JobPhase.READY)
