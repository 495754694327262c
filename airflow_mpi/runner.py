"""The job flow, once, for the operator and the CLI: create -> sshd ready -> master -> stream ->
watch -> result, with teardown on every path.

Airflow-free on purpose: ``MPIJobOperator`` and ``airflow-mpi run`` both drive ``JobRunner``;
the sensor shares ``check_sshd_once``/``wait_for_sshd``. Every failure message of a job is built
here, for the synchronous flow and for a deferred operator's trigger events alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from airflow_mpi.backends.base import Backend, PlanningBackend, QueueAwareBackend, ReattachableBackend
from airflow_mpi.diagnosis import Cause, Diagnosis, EvidenceCollector, diagnose, explain, merge_diagnoses
from airflow_mpi.events import STATUS_ERROR, STATUS_FAILED, STATUS_TIMEOUT, WAIT_READY, JobEvent
from airflow_mpi.exceptions import (
    BackendRequestFailed,
    BackendUnreachable,
    JobFailed,
    JobTimeout,
    LaunchError,
    MPIJobError,
    SshdNotReady,
)
from airflow_mpi.logstream import TAIL_LINES, OutputTracker, build_rank_pods, format_tail
from airflow_mpi.masterlog import MasterOutput, OutputPlan
from airflow_mpi.naming import RunIdentity
from airflow_mpi.plan import JobPlan, render_plan
from airflow_mpi.queueing import QueueClock
from airflow_mpi.readiness import HostProbe, summarize_not_ready
from airflow_mpi.spec import MPIJobSpec, Role
from airflow_mpi.status import JobPhase, JobStatus, evaluate_job

log = logging.getLogger(__name__)

WATCH_INTERVAL = 0.5  # how often workers are checked while the master runs
TIMEOUT_GRACE = 3.0  # mpiexec --timeout reports first; past this the task side kills the job
# Causes that can go unnoticed: a nested launcher on CPUs gives every rank its own world of one,
# and the job "succeeds" having trained N separate models.
WARN_ON_SUCCESS = frozenset({Cause.NESTED_LAUNCHER})
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
) -> list[HostProbe]:
    """Until every worker accepts the job key; bounded by ``timeout`` with a reason per host.
    While ``queued()`` says the job waits for admission, the ``timeout`` clock does not run."""
    start = time.monotonic()
    delay = 0.02  # sshd starts in tens of milliseconds; image pulls take minutes: back off
    while True:
        if queued is not None and queued():
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


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class JobResult:
    """What the task returns (XCom): small, no keys, no logs."""

    job_name: str
    exit_code: int
    np: int
    hosts: list[str]
    timings: dict[str, str] = field(default_factory=dict)
    durations_s: dict[str, float] = field(default_factory=dict)
    result: Any = None
    lines: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class JobRunner:
    """Runs one planned job on one backend. ``emit`` receives log records (one or more lines),
    ``warn`` the warnings (a result line that was refused; default: ``emit``).

    ``run()`` does everything; the deferrable operator calls the phases (``create``,
    ``start_master``, ``finish``) from separate resumptions, passing ``marks`` along.
    """

    def __init__(
        self,
        backend: Backend,
        plan: JobPlan,
        emit: Callable[[str], None],
        *,
        marks: dict[str, float] | None = None,
        skip_lines: int = 0,
        on_progress: Callable[[int], None] | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.backend = backend
        self.plan = plan
        self.emit = emit
        self.warn = warn if warn is not None else emit
        # The master's lines into the task log: the same handling as a deferred job's trigger.
        self.master_output = MasterOutput(
            OutputPlan.from_plan(plan), emit, self.warn, skip_lines=skip_lines, on_progress=on_progress
        )
        self.marks: dict[str, float] = dict(marks or {})  # phase -> epoch seconds
        self._teardown_lock = threading.Lock()
        self._torn_down = False

    @property
    def job_name(self) -> str:
        return self.plan.job_name

    @property
    def output(self) -> OutputTracker:
        return self.master_output.output

    @property
    def evidence(self) -> EvidenceCollector:
        return self.master_output.evidence

    def run(self, *, adopted: bool = False) -> JobResult:
        """The whole job, torn down on every path; ``adopted``: the job already runs (reattach)."""
        try:
            if not adopted:
                self.create()
                self.wait_ready()
                self.start_master()
            result = self.finish()
        except BaseException as error:
            self.teardown(error)
            raise
        self.teardown()
        return result

    def teardown(self, error: BaseException | None = None) -> list[str]:
        """Delete the job's pods and objects (once, from whichever path gets here first). Never
        raises: what could not be deleted (or checked) is returned, logged, and noted on the
        ``error`` that ends the task, if any, so the cause stays the task's error."""
        with self._teardown_lock:
            if self._torn_down:
                return []
            self._torn_down = True
            try:
                self.backend.teardown(self.job_name)
                left = self.backend.leftovers(self.job_name)
            except Exception as failure:  # bounded by the backend; the job may still be there
                with contextlib.suppress(Exception):
                    self.backend.release(self.job_name)
                left = [f"job {self.job_name} (could not be deleted: {failure})"]
            if left:
                log.error("teardown of %s left: %s", self.job_name, "; ".join(left))
                if error is not None:
                    error.add_note(f"teardown of MPI job {self.job_name} left: {'; '.join(left)}")
            return left

    def _mark(self, phase: str) -> None:
        self.marks[phase] = time.time()

    def create(self) -> None:
        plan = self.plan
        self._mark("submitted")
        self.emit(
            f"airflow-mpi: job {plan.job_name} on the {self.backend.name} backend: 1 master + "
            f"{len(plan.workers)} worker(s), {plan.topology.np} rank(s)"
        )
        self.backend.create(plan)
        self._mark("created")

    def wait_ready(self) -> None:
        plan, spec = self.plan, self.plan.spec
        queue = QueueWait(self.backend, plan, self.emit) if isinstance(self.backend, QueueAwareBackend) else None
        if queue is not None:
            queue.wait()
            self._mark("admitted")
        if plan.workers:
            wait_for_sshd(
                self.backend,
                plan.job_name,
                spec.startup_timeout,
                port=spec.ssh_port,
                queued=queue.check if queue is not None else None,
            )
        self._mark("sshd_ready")

    def start_master(self) -> None:
        workers, master = len(self.plan.workers), self.plan.master.name
        backend = self.backend
        if isinstance(backend, QueueAwareBackend) and backend.starts_master_with_workers(self.plan):
            self.emit(f"airflow-mpi: sshd ready on {workers} worker(s); mpiexec starts on {master} (started with them)")
        else:
            self.emit(f"airflow-mpi: sshd ready on {workers} worker(s); starting mpiexec on {master}")
        backend.start_master(self.job_name)
        self._mark("mpiexec_started")

    def finish(self, shown_tail: Sequence[str] = ()) -> JobResult:
        """Stream the master's output until it ends, then the result (or the failure).
        ``shown_tail``: the last lines a deferred wait showed, standing in for a log gone since."""
        plan = self.plan
        started = self.marks.get("mpiexec_started", time.time())
        deadline = time.monotonic() + max(0.0, started + plan.spec.timeout - time.time())
        status = self._stream(deadline=deadline, shown_tail=shown_tail)
        self._mark("finished")
        self.emit(f"airflow-mpi: job {plan.job_name} {status.phase.value}")
        if status.phase is not JobPhase.SUCCEEDED:
            raise self._failure(status)
        for diagnosis in self.evidence.diagnoses():
            if diagnosis.cause in WARN_ON_SUCCESS:
                self.emit(explain("airflow-mpi: WARNING: the job succeeded, but ", [diagnosis], "").rstrip("\n"))
        return self.result()

    def result(self) -> JobResult:
        more = self.output.result_error_count - len(self.output.result_errors)
        if more > 0:
            self.warn(f"airflow-mpi: WARNING: {more} more result line(s) were refused (see the first ones above)")
        marks = self.marks
        order = ("submitted", "created", "sshd_ready", "mpiexec_started", "finished")
        spans = {"create": ("submitted", "created"), "sshd_ready": ("created", "sshd_ready")}
        spans.update(mpiexec=("mpiexec_started", "finished"), total=("submitted", "finished"))
        return JobResult(
            job_name=self.plan.job_name,
            exit_code=0,
            np=self.plan.topology.np,
            hosts=[h.host for h in self.plan.topology.rank_hosts],
            timings={phase: _iso(marks[phase]) for phase in order if phase in marks},
            durations_s={
                name: round(marks[b] - marks[a], 3) for name, (a, b) in spans.items() if a in marks and b in marks
            },
            result=self.output.result,
            lines=self.output.lines_seen,
        )

    def _stream(self, deadline: float, shown_tail: Sequence[str] = ()) -> JobStatus:
        """Forward the master's output live and watch the workers, until the master ends."""
        next_watch = time.monotonic() + WATCH_INTERVAL
        for batch in self.backend.follow_master(self.job_name, idle_tick=0.1):
            now = time.monotonic()
            if batch:
                self.master_output.take(batch, now)
            self.master_output.tick(now)
            self._check_ranks(now)
            if now >= deadline + TIMEOUT_GRACE:
                raise self.timeout_failure(self.output.tail)
            if now >= next_watch:
                next_watch = now + WATCH_INTERVAL
                status = evaluate_job(self.backend.pod_states(self.job_name))
                if status.phase is JobPhase.FAILED and status.failed_pod != self.plan.master.name:
                    raise self._worker_failure(status)
        if shown_tail and self.master_output.lines_read == 0:  # the master's log is gone
            self.master_output.take(list(shown_tail), time.monotonic())
        self.master_output.flush(time.monotonic())
        status = evaluate_job(self.backend.pod_states(self.job_name))
        if time.monotonic() >= deadline:
            self.output.timed_out = True
        if status.phase is JobPhase.SUCCEEDED:
            self._check_ranks(time.monotonic(), ended=True)
        return status

    def _worker_failure(self, status: JobStatus) -> JobFailed:
        return worker_failure(self.backend, self.job_name, status, "while training", self.evidence.diagnoses())

    def _check_ranks(self, now: float, *, ended: bool = False) -> None:
        failure = self.master_output.rank_failure(now, ended=ended)
        if failure is not None:
            raise failure

    def timeout_failure(
        self, tail: Sequence[str], *, by_mpiexec: bool = False, exit_code: int | None = None
    ) -> JobTimeout:
        """The job ran past ``spec.timeout``: ended by mpiexec's own ``--timeout``, or killed."""
        how = "(mpiexec --timeout)" if by_mpiexec else "and was killed"
        shown = list(tail[-TAIL_LINES:])
        return JobTimeout(
            f"MPI job {self.job_name} ran past its timeout of {self.plan.spec.timeout}s {how}"
            + format_tail(self.plan.master.name, shown),
            exit_code=exit_code,
            tail=shown,
        )

    def event_failure(self, event: JobEvent) -> MPIJobError | None:
        """The error a deferred wait's event stands for, as the synchronous flow raises it; None
        when the job goes on (workers ready) or the master's own end decides (``finish``)."""
        status, wait_for = event["status"], event["wait_for"]
        if status == STATUS_ERROR:
            cause = BackendUnreachable if event.get("unreachable") else BackendRequestFailed
            return cause(event.get("reason", ""))
        if status == STATUS_TIMEOUT and event.get("queued"):
            return JobTimeout(event.get("reason", ""))
        if status == STATUS_FAILED and event.get("never_starts"):
            return LaunchError(event.get("reason", ""))
        if status == STATUS_TIMEOUT and wait_for == WAIT_READY:
            workers = [worker.name for worker in self.plan.workers]
            return build_not_ready_error(self.backend, self.job_name, event.get("reason", ""), workers, [])
        if status == STATUS_TIMEOUT:
            return self.timeout_failure(self.backend.pod_log_tail(self.job_name, self.plan.master.name, TAIL_LINES))
        if status == STATUS_FAILED and event.get("message"):  # the trigger's world-size check
            return JobFailed(event["message"], pod=event.get("pod"), rank=event.get("rank"))
        if status == STATUS_FAILED and event.get("pod") != self.plan.master.name:
            failed = JobStatus(JobPhase.FAILED, event.get("pod"), event.get("exit_code"), event.get("reason", ""))
            when = "before sshd was ready" if wait_for == WAIT_READY else "while training"
            return worker_failure(self.backend, self.job_name, failed, when)
        return None

    def _failure(self, status: JobStatus) -> JobFailed:
        """Why the job did not succeed, once the master ended: a worker, the timeout, the rank
        mpiexec names, or the master itself."""
        plan, out = self.plan, self.output
        if status.failed_pod and status.failed_pod != plan.master.name:
            return self._worker_failure(status)
        if out.timed_out:
            return self.timeout_failure(out.tail, by_mpiexec=True, exit_code=status.exit_code)
        self.evidence.feed(out.tail, every_line=True)
        lead = f"MPI job {self.job_name} failed: "
        rank = out.failed_rank
        if rank is not None:
            pods = build_rank_pods(plan.spec, plan.topology)
            where = f" on pod {pods[rank]}" if rank < len(pods) else ""
            cause = (
                f"exited with code {out.failed_exit_code}"
                if out.failed_exit_code is not None
                else f"was killed by signal {out.failed_signal}"
                if out.failed_signal is not None
                else "failed"
            )
            tail = out.rank_tail(rank) or out.tail[-TAIL_LINES:]
            self.evidence.feed(tail, every_line=True)
            diagnoses = self.evidence.diagnoses()
            return JobFailed(
                explain(
                    lead,
                    diagnoses,
                    f"{lead}rank {rank}{where} {cause} (mpiexec exit code {status.exit_code})"
                    + format_tail(f"rank {rank}", tail),
                ),
                exit_code=out.failed_exit_code if out.failed_exit_code is not None else status.exit_code,
                pod=pods[rank] if rank < len(pods) else plan.master.name,
                rank=rank,
                tail=tail,
                causes=[d.cause.value for d in diagnoses],
            )
        tail = out.tail[-TAIL_LINES:]
        diagnoses = self.evidence.diagnoses()
        return JobFailed(
            explain(lead, diagnoses, f"{lead}{status.reason}" + format_tail(plan.master.name, tail)),
            exit_code=status.exit_code,
            pod=plan.master.name,
            tail=tail,
            causes=[d.cause.value for d in diagnoses],
        )


def plan_for(backend: Backend, spec: MPIJobSpec, identity: RunIdentity) -> JobPlan:
    """The job's plan as ``backend`` runs it (a controller may fix the master's name and paths)."""
    if isinstance(backend, PlanningBackend):
        return backend.render_plan(spec, identity)
    return render_plan(spec, identity)


def resume_or_clean(backend: Backend, spec: MPIJobSpec, identity: RunIdentity) -> JobPlan | None:
    """On a retry, find the jobs earlier tries of this task instance left (a worker crash leaves
    its job running). Reattach to the newest one that can still give the result (its master runs
    or has ended); remove every other one. Never leaves two jobs for one task."""
    if not isinstance(backend, ReattachableBackend) or identity.try_number <= 1:
        return None
    namespace = backend.namespace_for(spec)
    adopted: JobPlan | None = None
    for found in sorted(backend.find_jobs(identity, namespace), key=lambda job: job.try_number, reverse=True):
        earlier = plan_for(backend, spec, dataclasses.replace(identity, try_number=found.try_number))
        if adopted is None and found.try_number != identity.try_number and earlier.job_name == found.job_name:
            states = backend.adopt(earlier, namespace)
            status = evaluate_job(states)
            master_there = any(state.name == earlier.master.name for state in states)
            master_failed = status.phase is JobPhase.FAILED and status.failed_pod == earlier.master.name
            if master_there and (status.phase in (JobPhase.RUNNING, JobPhase.SUCCEEDED) or master_failed):
                log.info("reattaching to job %s of try %d", found.job_name, found.try_number)
                adopted = earlier
                continue
        log.info("removing job %s left by try %d", found.job_name, found.try_number)
        backend.teardown(found.job_name)
        left = backend.leftovers(found.job_name)
        if left:
            log.error("removing %s left: %s", found.job_name, "; ".join(left))
    return adopted
