"""Is the job still making progress? The hang watchdog's rule, from the master's lines alone.

A hung MPI job fails nothing: a stopped peer, a skipped collective or a data loader stuck on a
mount leaves every rank waiting, and the job burns its whole ``timeout``. Its output goes quiet,
and the master's output is tagged by rank (``[1,R]<stdout>:``), so silence is seen here:

- no rank printed a progress line for ``progress_timeout`` seconds: the job is hung;
- with a ``progress_pattern``, each rank that has printed a matching line is also watched on its
  own: one silent that long while another printed within it is hung.

Without a pattern every line counts and the job is judged as a whole: most jobs print from rank 0
only, and a stopped peer stops rank 0's collectives, so its lines stop too. The clock starts when
the launch script says it starts mpiexec (before, ``startup_timeout`` bounds the wait). Pure: fed
lines with the monotonic time they arrived; the runner and the trigger act on ``hang()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_mpi.contract import MPIEXEC_START_LINE
from airflow_mpi.observe.output import parse_tag
from airflow_mpi.spec.patterns import Pattern, PatternError, compile_pattern

LAST_LINE_CHARS = 300  # of each rank's last line, in the failure message


@dataclass(frozen=True)
class Silence:
    """One rank (None: the untagged output as a whole) and how long it has been quiet."""

    rank: int | None
    seconds: float
    last_line: str | None  # the last line it printed; None: nothing since mpiexec started


@dataclass(frozen=True)
class Hang:
    """The watchdog's verdict: which ranks are silent, quietest first."""

    timeout: float
    silent: tuple[Silence, ...]
    whole_job: bool  # no rank printed for ``timeout``; else some ranks stopped while others go on
    patterned: bool = False  # only lines matching ``progress_pattern`` counted

    def to_dict(self) -> dict[str, Any]:
        """Primitives, for a trigger's event."""
        silent = [{"rank": s.rank, "seconds": round(s.seconds, 3), "last_line": s.last_line} for s in self.silent]
        return {"timeout": self.timeout, "silent": silent, "whole_job": self.whole_job, "patterned": self.patterned}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Hang:
        silent = tuple(
            Silence(None if s.get("rank") is None else int(s["rank"]), float(s["seconds"]), s.get("last_line"))
            for s in data.get("silent", ())
        )
        return cls(float(data["timeout"]), silent, bool(data["whole_job"]), bool(data.get("patterned")))

    @property
    def ranks(self) -> list[int]:
        return [s.rank for s in self.silent if s.rank is not None]

    def summary(self) -> str:
        what = "line matching progress_pattern" if self.patterned else "line"
        if self.whole_job:
            return f"no rank printed a {what} for {self.timeout:g}s (progress_timeout)"
        ranks = ", ".join(str(r) for r in self.ranks)
        return f"rank(s) {ranks} printed no {what} for {self.timeout:g}s (progress_timeout) while others went on"


@dataclass
class ProgressWatch:
    """Feed it the master's lines; ``hang(now)`` says when the job has been silent too long."""

    timeout: float | None  # None: the watchdog is off
    pattern: str | None = None
    np: int = 0
    started: float | None = None  # when mpiexec started (the clock's zero)
    last_any: float | None = None  # the last progress line of any rank
    last_progress: dict[int | None, float] = field(default_factory=dict)
    last_line: dict[int | None, str] = field(default_factory=dict)
    _regex: Pattern | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        # RE2, linear in the line: this runs on every line, in the triggerer's event loop too.
        # The spec was refused if RE2 cannot run the pattern; one that reaches here anyway (a
        # trigger deferred by an older version) counts every line, which never fakes a hang.
        try:
            self._regex = compile_pattern(self.pattern) if self.pattern else None
        except PatternError:
            self._regex = None

    @property
    def enabled(self) -> bool:
        return self.timeout is not None

    def feed(self, lines: Iterable[str], now: float) -> None:
        if self.timeout is None:
            return
        for line in lines:
            if self.started is None:
                if line.startswith(MPIEXEC_START_LINE):
                    self.started = now
                continue
            rank, text = parse_tag(line, self.np or None)
            if rank is None and line.startswith("[airflow-mpi]"):
                continue  # the product's own notes are no progress of the job
            self.last_line[rank] = text[:LAST_LINE_CHARS]
            if self._regex is not None and not self._regex.search(text):
                continue
            self.last_progress[rank] = now
            self.last_any = now

    def hang(self, now: float) -> Hang | None:
        """The verdict at ``now``; None while the job makes progress (or before mpiexec starts)."""
        if self.timeout is None or self.started is None:
            return None
        since_any = now - (self.last_any if self.last_any is not None else self.started)
        if since_any >= self.timeout:
            return Hang(self.timeout, self._silences(now, self._ranks()), True, self._regex is not None)
        if self._regex is None:
            return None
        quiet = [r for r, t in self.last_progress.items() if r is not None and now - t >= self.timeout]
        if not quiet:
            return None
        return Hang(self.timeout, self._silences(now, quiet), False, True)

    def _ranks(self) -> list[int | None]:
        """Every rank of the job (those that never printed too), or the untagged output."""
        tagged = {r for r in (*self.last_line, *self.last_progress) if r is not None}
        if not tagged and None in self.last_line:  # untagged output (mpi.tag_output off)
            return [None]
        ranks: list[int | None] = [*sorted(tagged | set(range(self.np)))]
        return ranks or [None]

    def _silences(self, now: float, ranks: Sequence[int | None]) -> tuple[Silence, ...]:
        assert self.started is not None
        found = [
            Silence(rank, now - self.last_progress.get(rank, self.started), self.last_line.get(rank)) for rank in ranks
        ]
        return tuple(sorted(found, key=lambda s: (-s.seconds, -1 if s.rank is None else s.rank)))
