"""The job flow, once, for the operator and the CLI: create -> sshd ready -> master -> stream ->
watch -> result, with teardown on every path.

Airflow-free on purpose: ``MPIJobOperator`` and ``airflow-mpi run`` both drive ``JobRunner``;
the sensor shares ``waits.check_sshd_once``. Every failure message of a job is built here (or in
``waits``), for the synchronous flow and for a deferred operator's trigger events alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from airflow_mpi import events
from airflow_mpi.backends.base import Backend, NoticeBackend, QueueAwareBackend, StackBackend
from airflow_mpi.events import JobEvent, outcome_of
from airflow_mpi.exceptions import (
    BackendRequestFailed,
    BackendUnreachable,
    JobFailed,
    JobHung,
    JobTimeout,
    LaunchError,
    MPIJobError,
)
from airflow_mpi.job.mpirun import TIMEOUT_GRACE
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.observe.diagnosis import Cause, EvidenceCollector, explain
from airflow_mpi.observe.master_output import MasterOutput, OutputPlan
from airflow_mpi.observe.output import TAIL_LINES, OutputTracker, build_rank_pods, format_tail
from airflow_mpi.observe.progress import Hang
from airflow_mpi.observe.stacks import STACK_WAIT, StackReport, build_report, describe_silent
from airflow_mpi.observe.status import JobPhase, JobStatus, evaluate_job
from airflow_mpi.runner.waits import QueueWait, build_not_ready_error, wait_for_sshd, worker_failure

log = logging.getLogger(__name__)

WATCH_INTERVAL = 0.5  # how often workers are checked while the master runs
# Causes that can go unnoticed: a nested launcher on CPUs gives every rank its own world of one,
# and the job "succeeds" having trained N separate models.
WARN_ON_SUCCESS = frozenset({Cause.NESTED_LAUNCHER})


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds")


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)`` (Python 3.11+); on 3.10 the same ``__notes__`` list by hand, which
    its traceback does not show (the teardown logs what it left as well)."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # pragma: no cover (3.10: the compatibility tier)
        notes = getattr(error, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
            error.__notes__ = notes  # type: ignore[attr-defined]
        notes.append(note)


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
        self._follow: Iterator[list[str]] | None = None  # the master's log, once opened

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
            self._close_follow()
            self.teardown(error)
            raise
        self.teardown()
        return result

    def _master_lines(self) -> Iterator[list[str]]:
        """The master's log as batches of lines: one follow for the whole job, opened on first use."""
        if self._follow is None:
            self._follow = self.backend.follow_master(self.job_name, idle_tick=0.1)
        return self._follow

    def _close_follow(self) -> None:
        """Ends the follow (its stream and reader) now, not when the runner is collected."""
        follow, self._follow = self._follow, None
        close = getattr(follow, "close", None)
        if close is not None:
            close()

    def _show_master_while(self, seconds: float) -> None:
        """The readiness wait's pause when the master started with its workers: its launch script
        runs mpiexec once its own ssh check passes, so its lines (ranks included) are shown as they
        come instead of after the last worker is seen Ready. Returns after ``seconds`` (at most
        0.25, so readiness is checked as often as a pod event would wake it), or when the master's
        log has ended (the master ended: the readiness check sees it)."""
        end = time.monotonic() + min(seconds, 0.25)
        for batch in self._master_lines():
            now = time.monotonic()
            if batch:
                self.master_output.take(batch, now)
            if now >= end:
                return
        self.backend.wait_for_change(self.job_name, seconds)  # the log ended (e.g. the master was deleted)

    def teardown(self, error: BaseException | None = None, *, notice: bool = False) -> list[str]:
        """Delete the job's pods and objects (once, from whichever path gets here first). Never
        raises: what could not be deleted (or checked) is returned, logged, and noted on the
        ``error`` that ends the task, if any, so the cause stays the task's error. ``notice``
        (the task is being killed): first every rank gets SIGTERM and ``termination_grace``
        seconds to save, where the backend can tell them."""
        with self._teardown_lock:
            if self._torn_down:
                return []
            self._torn_down = True
            if notice:
                self._give_notice()
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
                    add_note(error, f"teardown of MPI job {self.job_name} left: {'; '.join(left)}")
            return left

    def _give_notice(self) -> None:
        grace = self.plan.spec.termination_grace
        if grace <= 0 or not isinstance(self.backend, NoticeBackend):
            return
        started = time.monotonic()
        try:
            lines = self.backend.give_notice(self.job_name, grace)
        except Exception as failure:  # the teardown that follows removes the job all the same
            log.warning("could not give MPI job %s's ranks notice: %s", self.job_name, failure)
            return
        for line in lines:
            log.info("%s", line)
        log.info(
            "MPI job %s: ranks given SIGTERM and up to %ss to save; %.1fs later, removing the job. Its last lines:\n%s",
            self.job_name, grace, time.monotonic() - started,
            "\n".join(self.backend.pod_log_tail(self.job_name, self.plan.master.name, lines=10)),
        )  # fmt: skip

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
        with_workers = isinstance(self.backend, QueueAwareBackend) and self.backend.starts_master_with_workers(plan)
        if plan.workers:
            wait_for_sshd(
                self.backend,
                plan.job_name,
                spec.startup_timeout,
                port=spec.ssh_port,
                queued=queue.check if queue is not None else None,
                pause=self._show_master_while if with_workers else None,
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

    def start_master_with_workers(self) -> None:
        """Create the master now, beside workers that may not answer yet: its launch script waits
        for their sshd (a deferred job starts whole, as a gang does)."""
        workers, master = len(self.plan.workers), self.plan.master.name
        self.emit(
            f"airflow-mpi: mpiexec starts on {master} once sshd answers on {workers} worker(s) "
            f"(its launch script waits up to {self.plan.spec.startup_timeout}s)"
        )
        self.backend.start_master(self.job_name)

    def finish(self, shown_tail: Sequence[str] = ()) -> JobResult:
        """Stream the master's output until it ends, then the result (or the failure).
        ``shown_tail``: the last lines a deferred wait showed, standing in for a log gone since."""
        plan = self.plan
        started = self.marks.get("mpiexec_started", time.time())
        deadline = time.monotonic() + max(0.0, started + plan.spec.timeout - time.time())
        try:
            status = self._stream(deadline=deadline, shown_tail=shown_tail)
        finally:
            self._close_follow()
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
        for batch in self._master_lines():
            now = time.monotonic()
            if batch:
                self.master_output.take(batch, now)
            self.master_output.tick(now)
            self._check_ranks(now)
            hang = self.master_output.hang(now)
            if hang is not None:
                raise self.hang_failure(hang)
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

    def take_stacks(self, wait: int = STACK_WAIT) -> StackReport | None:
        """Every running rank's Python stack, without stopping the job (None: the backend cannot)."""
        if not isinstance(self.backend, StackBackend):
            return None
        outputs, errors = self.backend.take_stacks(self.job_name, wait)
        return build_report(outputs, errors)

    def hang_failure(self, hang: Hang) -> JobHung:
        """The job is judged hung: the evidence first (every rank's stack into the log, the ranks
        that did not answer), then the error naming the silent ranks and their last lines. The
        caller tears the job down, as for any failure."""
        plan = self.plan
        pods = build_rank_pods(plan.spec, plan.topology)
        np = plan.topology.np
        self.emit(
            f"airflow-mpi: job {self.job_name} looks hung: {hang.summary()}; "
            "asking every rank for its Python stack, then ending it"
        )
        report = self.take_stacks()
        if report is not None:
            self.emit("\n".join([f"airflow-mpi: Python stacks of job {self.job_name}:", *report.render(pods, np)]))
        unanswered = report.silent_ranks(np) if report is not None else []
        lines = [f"MPI job {self.job_name} hung: {hang.summary()}; it was ended"]
        if report is None:
            lines[0] += f" (the {self.backend.name} backend cannot take stacks)"
        else:
            lines[0] += " after every rank's Python stack went into the log above"
        if unanswered:
            lines.append("Did not answer the stack request:")
            lines += [f"  {line}" for line in describe_silent(report, unanswered, pods)] if report else []
        lines.append("Silent, quietest first:")
        for silence in hang.silent:
            who = "the output" if silence.rank is None else f"rank {silence.rank}"
            where = f" on pod {pods[silence.rank]}" if silence.rank is not None and silence.rank < len(pods) else ""
            last = f"last line: {silence.last_line}" if silence.last_line is not None else "nothing printed"
            lines.append(f"  {who}{where}: quiet for {silence.seconds:.0f}s; {last}")
        lines.append(
            "A rank that did not answer, or whose stack is not in a collective while the others' are, "
            "is where to look; raise progress_timeout if the job is only slow (docs/guides/troubleshooting.md#hangs)"
        )
        named = unanswered[0] if unanswered else next(iter(hang.ranks), None)
        return JobHung(
            "\n".join(lines),
            pod=pods[named] if named is not None and named < len(pods) else plan.master.name,
            rank=named,
            tail=self.output.tail[-TAIL_LINES:],
        )

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
        outcome = outcome_of(event)
        if outcome["outcome"] == events.API_UNREACHABLE:
            return BackendUnreachable(outcome["reason"])
        if outcome["outcome"] == events.API_REFUSED:
            return BackendRequestFailed(outcome["reason"])
        if outcome["outcome"] == events.QUEUE_TIMEOUT:
            return JobTimeout(outcome["reason"])
        if outcome["outcome"] == events.NEVER_STARTS:
            return LaunchError(outcome["reason"])
        if outcome["outcome"] == events.STARTUP_TIMEOUT:
            workers = [worker.name for worker in self.plan.workers]
            return build_not_ready_error(self.backend, self.job_name, outcome["reason"], workers, [])
        if outcome["outcome"] == events.JOB_TIMEOUT:
            return self.timeout_failure(self.backend.pod_log_tail(self.job_name, self.plan.master.name, TAIL_LINES))
        if outcome["outcome"] == events.HUNG:  # the trigger's hang watchdog
            return self.hang_failure(Hang.from_dict(outcome["hung"]))
        if outcome["outcome"] == events.RANK_FAILED:  # the trigger's world-size check
            return JobFailed(outcome["message"], pod=outcome["pod"], rank=outcome["rank"])
        if outcome["outcome"] == events.POD_FAILED and outcome["pod"] != self.plan.master.name:
            failed = JobStatus(JobPhase.FAILED, outcome["pod"], outcome["exit_code"], outcome["reason"])
            when = "before sshd was ready" if outcome["starting"] else "while training"
            return worker_failure(self.backend, self.job_name, failed, when)
        return None  # ready, finished, or the master failed: its log says how

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
            role = plan.spec.master if rank < len(pods) and pods[rank] == plan.master.name else plan.spec.workers
            cause = (
                f"exited with code {out.failed_exit_code}"
                if out.failed_exit_code is not None
                else killed_cause(out.failed_signal, role.memory)
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


def killed_cause(signal: int, memory: str | None) -> str:
    """How a rank killed by ``signal`` is told: SIGKILL out of nowhere is most often the kernel's
    OOM killer at the pod's memory limit (on cgroup v1 it kills the rank alone, so no pod says
    OOMKilled)."""
    cause = f"was killed by signal {signal}"
    if signal != 9:
        return cause
    oom = f"{cause} (SIGKILL, exit 137: most often the out-of-memory killer"
    if memory:
        return f"{oom} at the pod's memory limit, {memory}; raise the role's memory or use less)"
    return f"{oom}; check the node's memory)"
