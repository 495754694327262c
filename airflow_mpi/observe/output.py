"""What the master printed: bounded tails per rank, the rank that failed, the job's result, and
progress bars thinned for the task log.

Pure: it reads lines (mpiexec ``--tag-output`` style, ``[1,R]<stdout>:text``, as
``podlog.RankLineSplitter`` reassembles them) and remembers only bounded amounts, whatever the
volume. Also turns line batches into log records and formats the "last lines" of failure messages.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_mpi.contract import RANK_EXIT_PREFIX, RESULT_MAX_BYTES, RESULT_PREFIX
from airflow_mpi.job.topology import Topology
from airflow_mpi.observe.lines import CUT_MARK, is_rank_tag
from airflow_mpi.spec import MPIJobSpec

# Every number read from the output has at most 9 digits: int() refuses 4301 or more, and no
# rank, exit code or signal has more.
TAG = re.compile(r"^\[(0|[1-9][0-9]{0,8}),(0|[1-9][0-9]{0,8})\]<(?:stdout|stderr)>:(.*)$", re.DOTALL)
# Open MPI 4 names a process [[jobid,vpid],rank]; Open MPI 5 (PRRTE) [<nspace>@jobid,rank].
FAILED_PROCESS = re.compile(r"Process name:\s*\[(?:\[\d+,\d+\]|[^\]\s@]{1,255}@\d{1,9}),(\d{1,9})\]")
EXIT_CODE = re.compile(r"^\s*Exit code:\s*(-?\d{1,9})\b")
RANK_EXIT = re.compile(rf"^{RANK_EXIT_PREFIX}rank=(\d{{1,9}}) code=(\d{{1,9}}) host=(\S+)$")
SIGNALED = re.compile(r"process rank (\d{1,9}) with PID \d+ on node (\S+) exited on signal (\d{1,9})\b")
ABORTED = re.compile(r"MPI_ABORT was invoked on rank (\d{1,9}) in communicator")
ABORT_CODE = re.compile(r"^\s*with errorcode (-?\d{1,9})\b")
# MPICH's and Intel MPI's library, on the stderr of a rank that called MPI_Abort (``python -m
# mpi4py`` does for a rank that exits non-zero): Hydra then kills every rank, the rank wrapper
# too, before it can tell its own exit.
HYDRA_ABORTED = re.compile(
    r"^Abort\((-?\d{1,9})\) on node \d{1,9} \(rank (\d{1,9}) in comm \d{1,9}\): application called MPI_Abort"
)
TIMEOUT_MARKS = ("The user-provided time limit for job execution has been reached", "MPIEXEC_TIMEOUT")
MAX_RECORD_LINES = 5000
PROGRESS_INTERVAL = 1.0  # seconds between two progress-bar states of one rank in the task log
TAIL_LINES = 15  # lines of a pod or rank shown in a failure message
MAX_RESULT_ERRORS = 5  # refused result lines described one by one; the rest are counted
TAG_TEXT = re.compile(r"\[(0|[1-9][0-9]{0,8}),(0|[1-9][0-9]{0,8})\]<std(?:out|err|diag)>:")


@dataclass
class OutputTracker:
    """Feed it every line of the master; ask it what happened."""

    tail_lines: int = 40
    rank_tail_lines: int = 20
    np: int | None = None  # the job's world size: a tag of another rank is text
    lines_seen: int = 0
    failed_rank: int | None = None
    failed_exit_code: int | None = None
    failed_signal: int | None = None
    failed_node: str | None = None
    timed_out: bool = False
    result_errors: list[str] = field(default_factory=list)  # the first MAX_RESULT_ERRORS problems
    result_error_count: int = 0  # every result line that was refused
    _tail: deque[str] = field(init=False)
    _rank_tails: dict[int, deque[str]] = field(default_factory=dict)
    _results: dict[int, Any] = field(default_factory=dict)
    _expect_exit_code: bool = False
    _tagged: bool = False  # a rank-tagged line was seen: untagged text is no rank's

    def __post_init__(self) -> None:
        self._tail = deque(maxlen=self.tail_lines)

    def feed(self, lines: Iterable[str]) -> None:
        lines = list(lines)
        self.lines_seen += len(lines)
        self._tail.extend(lines)
        for line in lines:
            rank, text = parse_tag(line, self.np)
            if rank is not None:
                self._tagged = True
                tail = self._rank_tails.get(rank)
                if tail is None:
                    tail = self._rank_tails[rank] = deque(maxlen=self.rank_tail_lines)
                tail.append(text)
                if text.startswith(RESULT_PREFIX):  # every rank's is checked; rank 0's is the result
                    self._parse_result(rank, text)
                elif text.startswith(RANK_EXIT_PREFIX) and self.failed_rank is None:
                    self._parse_rank_exit(rank, text)
                elif text.startswith("Abort(") and self.failed_rank is None:
                    self._parse_hydra_abort(rank, text)
                continue
            if line.startswith(RESULT_PREFIX) and not self._tagged:
                self._parse_result(-1, line)
            elif line.startswith(RANK_EXIT_PREFIX) and not self._tagged and self.failed_rank is None:
                self._parse_rank_exit(None, line)  # tag_output: false: the line names its rank itself
            elif line.startswith("Abort(") and not self._tagged and self.failed_rank is None:
                self._parse_hydra_abort(None, line)
            self._parse_mpiexec(line)

    def _parse_result(self, rank: int, text: str) -> None:
        problem = parse_result(text[len(RESULT_PREFIX) :])
        if isinstance(problem, str):
            self.result_error_count += 1
            if len(self.result_errors) < MAX_RESULT_ERRORS:
                who = f"rank {rank}" if rank >= 0 else "untagged output"
                self.result_errors.append(f"{who}: {problem}")
            return
        self._results[rank] = problem.value

    def _parse_rank_exit(self, rank: int | None, text: str) -> None:
        """The rank wrapper's own line under Hydra: its rank, exit code (128+N: signal N) and host.
        ``rank``: the rank whose tag the line had (None: untagged output)."""
        found = RANK_EXIT.match(text.rstrip("\r\n"))
        if found is None or (rank is not None and int(found.group(1)) != rank):
            return  # another rank's text that only looks like it
        code = int(found.group(2))
        self.failed_rank, self.failed_node = int(found.group(1)), found.group(3)
        if 128 < code < 160:
            self.failed_signal = code - 128
        else:
            self.failed_exit_code = code

    def _parse_hydra_abort(self, rank: int | None, text: str) -> None:
        """MPICH's or Intel MPI's own line of a rank's MPI_Abort (``HYDRA_ABORTED``): its rank and
        code. ``rank``: the rank whose tag the line had (None: untagged output)."""
        found = HYDRA_ABORTED.match(text)
        if found is None or (rank is not None and int(found.group(2)) != rank):
            return  # another rank's text that only looks like it
        self.failed_rank, self.failed_exit_code = int(found.group(2)), int(found.group(1))

    def _parse_mpiexec(self, line: str) -> None:
        if any(mark in line for mark in TIMEOUT_MARKS):
            self.timed_out = True
        failed = FAILED_PROCESS.search(line)
        if failed and self.failed_rank is None:
            self.failed_rank = int(failed.group(1))
            self._expect_exit_code = True
            return
        aborted = ABORTED.search(line)
        if aborted and self.failed_rank is None:
            self.failed_rank = int(aborted.group(1))
            self._expect_exit_code = True
            return
        code = EXIT_CODE.match(line) or ABORT_CODE.match(line)
        if code and self._expect_exit_code:
            self.failed_exit_code = int(code.group(1))
            self._expect_exit_code = False
            return
        signaled = SIGNALED.search(line)
        if signaled and self.failed_rank is None:
            self.failed_rank = int(signaled.group(1))
            self.failed_node = signaled.group(2)
            self.failed_signal = int(signaled.group(3))

    @property
    def tail(self) -> list[str]:
        return list(self._tail)

    def rank_tail(self, rank: int) -> list[str]:
        return list(self._rank_tails.get(rank, ()))

    @property
    def result(self) -> Any:
        """The JSON rank 0 printed after ``AIRFLOW_MPI_RESULT`` (in its own tagged lines); with
        untagged output (``tag_output: false``), the untagged line's. None if there is none."""
        if 0 in self._results:
            return self._results[0]
        return None if self._tagged else self._results.get(-1)


class ProgressFilter:
    """Thins progress output for the task log. Of each rank's carriage-return states (lines whose
    text starts with ``\r``: rewritten lines and ``PartialLine`` snapshots) at most one per
    ``interval`` seconds is shown, the latest, without its ``\r``; a state held back is shown
    once ``interval`` has passed (``due``), before that rank's next plain line (stdout or
    stderr), or at the end (``flush``), so the last state of a bar is always shown, in order.
    Other lines pass unchanged."""

    def __init__(self, interval: float = PROGRESS_INTERVAL, np: int | None = None) -> None:
        self.interval = interval
        self.np = np  # a tag of no rank of the job is text, so at most one entry per rank
        self._held: dict[str, str] = {}  # rank ("[1,0]"; "" untagged) -> its latest state not shown yet
        self._shown_at: dict[str, float] = {}  # rank -> when it last showed a state

    def feed(self, lines: Iterable[str], now: float) -> list[str]:
        shown: list[str] = []
        for line in lines:
            if "\r" not in line and not self._held:
                shown.append(line)
                continue
            tag, text = split_tag(line, self.np)
            rank = tag[: tag.find("<")]
            if text.startswith("\r"):
                state = tag + text[1:]
                last = self._shown_at.get(rank)
                if last is None or now - last >= self.interval:
                    self._held.pop(rank, None)
                    self._shown_at[rank] = now
                    shown.append(state)
                else:
                    self._held[rank] = state
                continue
            held = self._held.pop(rank, None)
            if held is not None:
                self._shown_at[rank] = now
                shown.append(held)
            shown.append(line)
        return shown

    def due(self, now: float) -> list[str]:
        """States held back for ``interval`` or longer."""
        ready = [rank for rank in self._held if now - self._shown_at.get(rank, now) >= self.interval]
        for rank in ready:
            self._shown_at[rank] = now
        return [self._held.pop(rank) for rank in ready]

    def flush(self) -> list[str]:
        """Every state still held back (the output ended)."""
        held, self._held = list(self._held.values()), {}
        return held


def split_tag(line: str, np: int | None = None) -> tuple[str, str]:
    """``"[1,0]<stdout>:text"`` -> (``"[1,0]<stdout>:"``, ``"text"``); untagged, or tagged with no
    rank of a job of ``np`` ranks: ("", line)."""
    match = TAG_TEXT.match(line)
    if match is None or not is_rank_tag(match.group(1), match.group(2), np):
        return "", line
    return line[: match.end()], line[match.end() :]


def parse_tag(line: str, np: int | None = None) -> tuple[int | None, str]:
    """A rank's stdout or stderr line -> (rank, text); anything else -> (None, line)."""
    match = TAG.match(line)
    if match is None or not is_rank_tag(match.group(1), match.group(2), np):
        return None, line
    return int(match.group(2)), match.group(3)


@dataclass(frozen=True)
class ResultValue:
    value: Any


def parse_result(payload: str) -> ResultValue | str:
    """The value of an ``AIRFLOW_MPI_RESULT`` line, or why it is refused, with the fix."""
    if payload.endswith(CUT_MARK):
        return (
            f"its {RESULT_PREFIX.strip()} line was cut at the 64 KiB line cap, so the result is ignored; "
            f"keep the result under {RESULT_MAX_BYTES // 1024} KiB of JSON (write large outputs to a file "
            "and return its path)"
        )
    size = len(payload.encode("utf-8", "replace"))
    if size > RESULT_MAX_BYTES:
        return (
            f"its {RESULT_PREFIX.strip()} line holds {size} bytes, over the {RESULT_MAX_BYTES // 1024} KiB "
            "limit, so the result is ignored; return a summary (write large outputs to a file and return its path)"
        )
    try:
        return ResultValue(json.loads(payload))
    except ValueError as error:
        return (
            f"its {RESULT_PREFIX.strip()} line is not JSON ({error}), so the result is ignored; print "
            f"'{RESULT_PREFIX}' + json.dumps(value) on one line"
        )


def build_log_records(lines: Sequence[str], max_lines: int = MAX_RECORD_LINES) -> Iterator[str]:
    """Coalesce a batch of lines into few log records: the task logger keeps up with a flood
    (~25-30k records/s at one line each, >1M lines/s at 100 lines per record)."""
    for start in range(0, len(lines), max_lines):
        yield "\n".join(lines[start : start + max_lines])


def format_tail(source: str, lines: Sequence[str]) -> str:
    """The "last lines of <pod or rank>" block of a failure message ("" when there are none)."""
    if not lines:
        return ""
    shown = "\n".join(f"  | {line}" for line in lines[-TAIL_LINES:])
    return f"\nlast lines of {source}:\n{shown}"


def build_rank_pods(spec: MPIJobSpec, topology: Topology) -> list[str]:
    """Which pod runs each rank, for the default mappings; [] when the mapping is not known."""
    hosts = topology.rank_hosts
    mapping = spec.mpi.map_by.split(":", 1)[0].lower()
    pods: list[str] = []
    if spec.mpi.npernode is not None:
        for host in hosts:
            pods += [host.pod] * spec.mpi.npernode
    elif mapping == "slot":
        for host in hosts:
            pods += [host.pod] * host.slots
    elif mapping == "node":
        remaining = {h.pod: h.slots for h in hosts}
        while any(remaining.values()) and len(pods) < topology.np:
            for host in hosts:
                if remaining[host.pod]:
                    pods.append(host.pod)
                    remaining[host.pod] -= 1
    else:
        return []
    if spec.mpi.oversubscribe and pods:
        while len(pods) < topology.np:
            pods += pods[: topology.np - len(pods)]
    return pods[: topology.np]
