"""The waits before the master runs, shared by the runner, the sensor and the deferred resume:
until every worker's sshd accepts the job key (bounded by ``startup_timeout``, a reason per host
that is not ready), and until a gang scheduler or queue admits the job (``observe.queueing``'s
rule). And the errors a worker ends the job with: its own log's cause and fix first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from airflow_mpi.backends.base import Backend, QueueAwareBackend
from airflow_mpi.exceptions import (
    JobFailed,
    JobTimeout,
    SshdNotReady,
)
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.observe.diagnosis import Diagnosis, diagnose, explain, merge_diagnoses
from airflow_mpi.observe.output import TAIL_LINES, format_tail
from airflow_mpi.observe.queueing import QueueClock
from airflow_mpi.observe.readiness import HostProbe, summarize_not_ready
from airflow_mpi.observe.status import JobPhase, JobStatus, evaluate_job
from airflow_mpi.spec import Role

DIAGNOSED_PODS = 8  # worker logs read to explain a readiness failure (each is one small read)


@dataclass(frozen=True)
class SshdReport:
    ready: bool
    probes: list[HostProbe]
    failure: JobStatus | None = None  # a worker pod ended: waiting longer cannot help


def check_sshd_once(backend: Backend, job_name: str) -> SshdReport:
    """One readiness check: pod states first (a dead worker fails at once), then real ssh logins.
    A master that already ended (started with its gang, it waits for sshd itself) ends the wait:
    its own end decides the job."""
    states = backend.pod_states(job_name)
    if any(state.role is Role.MASTER and state.ended and state.reason != "Deleted" for state in states):
        return SshdReport(True, [])
    status = evaluate_job(states)
    if status.phase is JobPhase.FAILED:
        return SshdReport(False, [], status)
    probes = backend.probe_workers(job_name)
    return SshdReport(all(p.ok for p in probes), probes)


def wait_for_sshd(
    backend: Backend,
    job_name: str,
    timeout: float,
    *,
    port: int = 22,
    queued: Callable[[], bool] | None = None,
    pause: Callable[[float], None] | None = None,
) -> list[HostProbe]:
    """Until every worker accepts the job key; bounded by ``timeout`` with a reason per host.
    While ``queued()`` says the job waits for admission, the ``timeout`` clock does not run.
    ``pause(seconds)`` stands in for the backend's wait between checks while the job is not
    queued (the runner follows a master started with its workers meanwhile)."""
    start = time.monotonic()
    delay = 0.02  # sshd starts in tens of milliseconds; image pulls take minutes: back off
    while True:
        held = queued is not None and queued()
        if held:
            start = time.monotonic()
        report = check_sshd_once(backend, job_name)
        if report.failure is not None:
            raise worker_failure(backend, job_name, report.failure, "before sshd was ready")
        if report.ready:
            return report.probes
        waited = time.monotonic() - start
        if waited >= timeout:
            failing = [p for p in report.probes if not p.ok]
            raise build_not_ready_error(
                backend,
                job_name,
                summarize_not_ready(report.probes, waited, port),
                [probe.host.split(".", 1)[0] for probe in failing],
                [probe.describe(port) for probe in failing],
            )
        # Kubernetes wakes this at the next pod event; locally it is a plain back-off sleep.
        if pause is not None and not held:
            pause(min(delay, max(0.0, timeout - waited)))
        else:
            backend.wait_for_change(job_name, min(delay, max(0.0, timeout - waited)))
        delay = min(delay * 1.5, 1.0)


class QueueWait:
    """The job waits for a gang scheduler or queue to admit it (the rule: ``queueing``)."""

    def __init__(self, backend: QueueAwareBackend, plan: JobPlan, emit: Callable[[str], None]) -> None:
        self.backend, self.plan, self.emit = backend, plan, emit
        self.clock = QueueClock(plan.spec.scheduling.queue_timeout)

    def check(self) -> bool:
        """Whether the job is queued now (noting it, and failing past ``queue_timeout``)."""
        reason = self.backend.queue_status(self.plan.job_name)
        now = time.monotonic()
        self.clock.observe(reason, now)
        if reason is None:
            return False
        note = self.clock.note(self.plan.job_name, reason, now)
        if note is not None:
            self.emit(note)
        if self.clock.expired(now):
            raise JobTimeout(self.clock.timeout_message(self.plan.job_name, reason, now))
        return True

    def wait(self) -> None:
        """Until the job is admitted (returns at once when it is not queued)."""
        while self.check():
            self.backend.wait_for_change(self.plan.job_name, 1.0)


def worker_failure(
    backend: Backend, job_name: str, status: JobStatus, when: str, evidence: Sequence[Diagnosis] = ()
) -> JobFailed:
    """A pod (not the master's mpiexec) ended the job ``when``: the cause its log shows and the
    fix first, then its reason and last lines. ``evidence``: causes already seen in the master's output."""
    pod = status.failed_pod
    tail = backend.pod_log_tail(job_name, pod, TAIL_LINES) if pod else []
    lead = f"MPI job {job_name} failed{' ' + when if when else ''}: "
    diagnoses = merge_diagnoses(diagnose(tail), list(evidence))
    return JobFailed(
        explain(lead, diagnoses, f"{lead}{status.reason}" + format_tail(pod or "", tail)),
        exit_code=status.exit_code,
        pod=pod,
        tail=tail,
        causes=[d.cause.value for d in diagnoses],
    )


def build_not_ready_error(
    backend: Backend, job_name: str, summary: str, pods: Sequence[str], problems: Sequence[str]
) -> SshdNotReady:
    """Workers never accepted ssh: a line per host, led by the cause: what the workers' own logs
    show first (sshd prints why it refuses a key or will not start), else what the probes saw."""
    lines = [line for pod in pods[:DIAGNOSED_PODS] for line in backend.pod_log_tail(job_name, pod, TAIL_LINES)]
    diagnoses = merge_diagnoses(diagnose(lines), diagnose(summary.splitlines()))
    return SshdNotReady(
        explain(f"MPI job {job_name}: workers never accepted ssh: ", diagnoses, summary),
        problems,
        causes=[d.cause.value for d in diagnoses],
    )
