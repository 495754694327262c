"""The master's output on its way into a task log, once for every path that shows it: the
waiting runner (``runner.JobRunner``) and the deferred trigger (``triggers.mpi``).

``MasterOutput`` takes the backend's batches of lines (whole lines and ``PartialLine``
progress snapshots) and: skips what an earlier reader already showed (counted in whole lines, so a
replay of the same log from its start is tracked but not shown again), thins progress bars, folds
the rank-start reports into one line and checks the world size, tracks the tails, the failed rank
and the result, collects diagnosis evidence, and warns about refused result lines. It writes
through ``emit``/``warn``; it reads no clock (callers pass ``now``, monotonic seconds). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_mpi.exceptions import JobFailed
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.observe.diagnosis import EvidenceCollector
from airflow_mpi.observe.lines import PartialLine
from airflow_mpi.observe.output import (
    TAIL_LINES,
    OutputTracker,
    ProgressFilter,
    build_log_records,
    build_rank_pods,
    format_tail,
)
from airflow_mpi.observe.progress import Hang, ProgressWatch
from airflow_mpi.observe.worldsize import RankStartCheck, rank_start_timeout


@dataclass(frozen=True)
class OutputPlan:
    """What reading one job's master output needs of its plan: primitives only (no keys), so a
    trigger's serialized kwargs can carry it."""

    job_name: str
    master: str
    np: int
    rank_pods: tuple[str, ...]  # the pod each rank should run on (empty: the mapping is not known)
    job_pods: tuple[str, ...]
    rank_timeout: float  # seconds every rank gets to report after mpiexec starts
    progress_timeout: float | None = None  # the hang watchdog (``observe.progress``); None: off
    progress_pattern: str | None = None

    @classmethod
    def from_plan(cls, plan: JobPlan) -> OutputPlan:
        return cls(
            job_name=plan.job_name,
            master=plan.master.name,
            np=plan.topology.np,
            rank_pods=tuple(build_rank_pods(plan.spec, plan.topology)),
            job_pods=tuple(pod.name for pod in plan.pods),
            rank_timeout=rank_start_timeout(plan.spec),
            progress_timeout=plan.spec.progress_timeout,
            progress_pattern=plan.spec.progress_pattern,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_name": self.job_name,
            "master": self.master,
            "np": self.np,
            "rank_pods": list(self.rank_pods),
            "job_pods": list(self.job_pods),
            "rank_timeout": self.rank_timeout,
            "progress_timeout": self.progress_timeout,
            "progress_pattern": self.progress_pattern,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OutputPlan:
        return cls(
            job_name=str(data["job_name"]),
            master=str(data["master"]),
            np=int(data["np"]),
            rank_pods=tuple(str(pod) for pod in data.get("rank_pods", ())),
            job_pods=tuple(str(pod) for pod in data.get("job_pods", ())),
            rank_timeout=float(data["rank_timeout"]),
            progress_timeout=None if data.get("progress_timeout") is None else float(data["progress_timeout"]),
            progress_pattern=data.get("progress_pattern") or None,
        )


class MasterOutput:
    """One job's master output into one log. ``emit`` gets log records (one or more lines),
    ``warn`` the warnings; ``skip_lines``: whole lines an earlier reader of the same log showed
    (they are tracked, not shown); ``on_progress(lines)``: after each batch that showed new lines,
    the whole lines read so far (what the next reader skips)."""

    def __init__(
        self,
        plan: OutputPlan,
        emit: Callable[[str], None],
        warn: Callable[[str], None] | None = None,
        *,
        skip_lines: int = 0,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        self.plan = plan
        self.emit = emit
        self.warn = warn if warn is not None else emit
        self.skip_lines = skip_lines
        self.on_progress = on_progress
        # Each reader knows the world size: a tag of no rank of the job is text, so what they
        # keep per rank stays bounded whatever the ranks print.
        self.output = OutputTracker(np=plan.np)
        self.evidence = EvidenceCollector()  # known causes seen in the master's output
        self.progress_bars = ProgressFilter(np=plan.np)
        self.rank_starts = RankStartCheck(
            np=plan.np, rank_pods=plan.rank_pods, job_pods=plan.job_pods, timeout=plan.rank_timeout
        )
        self.watch = ProgressWatch(plan.progress_timeout, plan.progress_pattern, plan.np)
        self.lines_read = 0  # whole lines the backend gave (progress snapshots are no lines)
        self._warned = 0  # result problems warned about

    @property
    def replaying(self) -> bool:
        """Still within the lines an earlier reader showed."""
        return self.lines_read < self.skip_lines

    def take(self, batch: Sequence[str], now: float) -> None:
        """A batch from the backend: lines an earlier reader already showed are only tracked;
        the rest go to the log."""
        replayed: list[str] = []
        fresh: list[str] = []
        for line in batch:
            partial = isinstance(line, PartialLine)
            if self.lines_read < self.skip_lines:
                if not partial:  # a progress snapshot of a replayed line is dropped
                    self.lines_read += 1
                    replayed.append(line)
                continue
            self.lines_read += 0 if partial else 1
            fresh.append(line)
        self.watch.feed(batch, now)  # a progress bar's snapshot is progress too
        if replayed:
            self.show(replayed, now, replay=True)
        if fresh:
            self.show(fresh, now)
            if self.on_progress is not None:
                self.on_progress(self.lines_read)

    def tick(self, now: float) -> None:
        """Progress-bar states held back long enough are shown (call it when nothing arrives too)."""
        self.show(self.progress_bars.due(now), now)

    def flush(self, now: float) -> None:
        """The output ended: every state still held back is shown."""
        self.show(self.progress_bars.flush(), now)

    def show(self, lines: list[str], now: float, *, replay: bool = False) -> None:
        """Lines into the log: progress bars thinned, rank-start reports folded into one line,
        refused result lines warned about; the tracker sees what the log shows."""
        if not lines:
            return
        lines = self.rank_starts.feed(self.progress_bars.feed(lines, now), now)
        self.output.feed(lines)
        self.evidence.feed(lines)
        if not replay:
            for record in build_log_records(lines):
                self.emit(record)
        summary = self.rank_starts.summary()
        if summary is not None and not replay:
            self.emit(summary)
        self._warn_results(replay)

    def _warn_results(self, replay: bool) -> None:
        errors = self.output.result_errors
        if not replay:
            for problem in errors[self._warned :]:
                self.warn(f"airflow-mpi: WARNING: {problem}")
        self._warned = len(errors)

    def hang(self, now: float) -> Hang | None:
        """The hang watchdog's verdict (``progress_timeout``): None while the job makes progress."""
        return self.watch.hang(now)

    def rank_failure(self, now: float, *, ended: bool = False) -> JobFailed | None:
        """The world-size check's failure (wrong size, a rank on a foreign host, ranks that never
        started), naming the rank, its pod and the master's last lines; None while all is well."""
        problem = self.rank_starts.problem(now, ended=ended)
        if problem is None:
            return None
        missing = self.rank_starts.missing_ranks()
        pods = self.rank_starts.rank_pods
        rank = missing[0] if missing else None
        master = self.plan.master
        pod = pods[rank] if rank is not None and rank < len(pods) else master
        tail = self.output.tail[-TAIL_LINES:]
        return JobFailed(
            f"MPI job {self.plan.job_name} failed: {problem}" + format_tail(master, tail),
            pod=pod,
            rank=rank,
            tail=tail,
        )
