"""Did every rank start, on the pods the plan puts it? The world-size check.

The rank wrapper's first line on each rank is ``AIRFLOW_MPI_RANK_START rank=R size=N host=POD``
(docs/contract.md#rank-start); the launch script prints ``[airflow-mpi] starting mpiexec`` just
before it execs mpiexec. Fed the master's lines with the (monotonic) time they arrived, this
says what is wrong: a world size other than the plan's NP (at once), ranks that did not report
within ``rank_start_timeout`` of mpiexec's start, a rank on a host that is no pod of the job.
Pure: the runner fails the job with the message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from airflow_mpi.contract import MPIEXEC_START_LINE, RANK_START_PREFIX
from airflow_mpi.observe.output import parse_tag
from airflow_mpi.spec import MPIJobSpec

RANK_START = re.compile(r"^AIRFLOW_MPI_RANK_START rank=(\d{1,9}) size=(\d{1,9}) host=(\S{1,253})\s*$")
RANK_START_TIMEOUT = 120.0  # the most seconds ranks get to start (startup_timeout if lower)
DOC = "docs/contract.md#rank-start"


def rank_start_timeout(spec: MPIJobSpec) -> float:
    """Seconds every rank gets to report after mpiexec starts: ``startup_timeout``, at most 120.
    The report is the wrapper's first line, before the user's command imports anything."""
    return min(float(spec.startup_timeout), RANK_START_TIMEOUT)


@dataclass
class RankStartCheck:
    """Collects the rank-start reports of one job; ``problem()`` says when the check fails."""

    np: int
    rank_pods: Sequence[str]  # the pod each rank should run on ([]: the mapping is not known)
    job_pods: Sequence[str]  # every pod of the job
    timeout: float
    mpiexec_started: float | None = None  # when the launch script said it execs mpiexec
    hosts: dict[int, str] = field(default_factory=dict)  # rank -> the pod it reported
    wrong_size: tuple[int, int, str] | None = None  # (rank, size, host): a size that is not np
    unknown_host: tuple[int, str] | None = None  # (rank, host): a host that is no pod of the job
    last_report: float | None = None
    _summarized: bool = False

    def feed(self, lines: Iterable[str], now: float) -> list[str]:
        """The lines minus the rank-start reports (they are summed up in ``summary``)."""
        kept = []
        for line in lines:
            if RANK_START_PREFIX in line:  # a substring test first: most lines are none of these
                report = self._parse_report(line)
                if report is not None:
                    self._report(*report, now)
                    continue
            elif self.mpiexec_started is None and line.startswith(MPIEXEC_START_LINE):
                self.mpiexec_started = now
            kept.append(line)
        return kept

    def _parse_report(self, line: str) -> tuple[int, int, str] | None:
        """(rank, size, host) of a rank's own report: in the tagged lines of that very rank (the
        wrapper's first line), or untagged output; another rank's text is no report."""
        rank, text = parse_tag(line, self.np)
        match = RANK_START.match(text)
        if match is None or int(match.group(1)) >= self.np or (rank is not None and rank != int(match.group(1))):
            return None
        return int(match.group(1)), int(match.group(2)), match.group(3)

    def _report(self, rank: int, size: int, host: str, now: float) -> None:
        self.hosts.setdefault(rank, host)
        self.last_report = now
        if size != self.np and self.wrong_size is None:
            self.wrong_size = (rank, size, host)
        if self.job_pods and host not in self.job_pods and self.unknown_host is None:
            self.unknown_host = (rank, host)

    @property
    def complete(self) -> bool:
        return all(rank in self.hosts for rank in range(self.np))

    def problem(self, now: float, *, ended: bool = False) -> str | None:
        """Why the job must fail, or None. ``ended``: the master's output is over (a job that
        ended well must have started every rank, once mpiexec was started)."""
        if self.wrong_size is not None:
            rank, size, host = self.wrong_size
            return (
                f"mpiexec started {size} rank(s) but the job has {self.np}: rank {rank} on {host} reports a "
                f"world size of {size}. The pods' platform variables or /etc/mpi files differ from what "
                f"airflow-mpi rendered (changed by hand, or by an admission webhook?): run the job again "
                f"from its spec, and see {DOC}"
            )
        if self.unknown_host is not None:
            rank, host = self.unknown_host
            return (
                f"rank {rank} started on {host}, which is no pod of this job ({', '.join(self.job_pods)}): "
                f"a host name resolves to another machine; check the pods' /etc/hosts and DNS ({DOC})"
            )
        if self.mpiexec_started is None or self.complete:
            return None
        waited = now - self.mpiexec_started
        if waited < self.timeout and not ended:
            return None
        within = f"within {self.timeout:g} s of mpiexec's start" if waited >= self.timeout else "before mpiexec ended"
        return (
            f"{len(self.hosts)} of {self.np} ranks started {within}; missing {self._missing()}. Each rank "
            "reports first thing in the rank wrapper, so these never started or hang before it: see that pod "
            "(overloaded, out of memory, a shell startup file such as BASH_ENV that blocks) and mpiexec's "
            f"lines above ({DOC})"
        )

    def missing_ranks(self) -> list[int]:
        return [rank for rank in range(self.np) if rank not in self.hosts]

    def _missing(self) -> str:
        missing = self.missing_ranks()
        if len(self.rank_pods) != self.np:
            return f"rank(s) {format_ranks(missing)}"
        by_pod: dict[str, list[int]] = {}
        for rank in missing:
            by_pod.setdefault(self.rank_pods[rank], []).append(rank)
        return "; ".join(f"rank(s) {format_ranks(ranks)} expected on pod {pod}" for pod, ranks in by_pod.items())

    def summary(self) -> str | None:
        """One line, once, when every rank has reported: how long they took, where they run."""
        if self._summarized or not self.complete:
            return None
        self._summarized = True
        by_pod: dict[str, list[int]] = {}
        for rank in range(self.np):
            by_pod.setdefault(self.hosts[rank], []).append(rank)
        places = [f"{format_ranks(ranks)} on {pod}" for pod, ranks in by_pod.items()]
        shown = ", ".join(places[:8]) + (f", ... ({len(places)} pods)" if len(places) > 8 else "")
        took = ""
        if self.mpiexec_started is not None and self.last_report is not None:
            took = f" within {max(0.0, self.last_report - self.mpiexec_started):.1f} s"
        line = f"airflow-mpi: all {self.np} rank(s) started{took}: {shown}"
        expected = _counts(self.rank_pods) if len(self.rank_pods) == self.np else None
        if expected is not None and expected != _counts([self.hosts[rank] for rank in range(self.np)]):
            plan = ", ".join(f"{count} on {pod}" for pod, count in expected.items())
            line += f" (the plan puts {plan}: mpi.extra_args may change the mapping)"
        return line


def format_ranks(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"``."""
    runs: list[str] = []
    start = prev = None
    for rank in sorted(ranks):
        if start is not None and prev is not None and rank == prev + 1:
            prev = rank
            continue
        if start is not None:
            runs.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = rank
    if start is not None:
        runs.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(runs)


def _counts(pods: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pod in pods:
        counts[pod] = counts.get(pod, 0) + 1
    return counts
