"""Every rank's Python stack, as ``launch.sh stacks`` reports it from each pod, into lines for the
task log and the CLI, and who did not answer (docs/contract.md#stacks).

Each pod's report is one block per registered Python process: a header line
``AIRFLOW_MPI_STACK rank=R pid=P host=H state=S proc=C``, then faulthandler's dump when
``S`` is ``answered``. Pure: the backends run the command, this reads what it printed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

STACK_HEADER = re.compile(r"^AIRFLOW_MPI_STACK rank=(\d{1,9}) pid=(\d{1,9}) host=(\S+) state=(\w+) proc=(\S+)\s*$")
STACK_WAIT = 5  # seconds each pod waits for its processes to dump
WHY_NOT = {
    "stopped": "did not answer: the process is stopped (SIGSTOP or a debugger)",
    "silent": "did not answer in time: stuck outside Python (in the kernel, or a C call that blocks signals)",
    "uncaught": "was not asked: the process no longer handles SIGUSR2 (it replaced the handler)",
}


@dataclass(frozen=True)
class ProcessStack:
    """One Python process of one rank: its dump, or why there is none."""

    rank: int
    pid: int
    host: str
    state: str  # answered | stopped | silent | uncaught
    proc: str  # the kernel's one-letter process state when asked
    lines: tuple[str, ...] = ()

    @property
    def answered(self) -> bool:
        return self.state == "answered"


@dataclass(frozen=True)
class StackReport:
    """What every pod of a job answered; ``errors``: pods that could not be asked, and why."""

    stacks: tuple[ProcessStack, ...]
    errors: Mapping[str, str]

    def by_rank(self) -> dict[int, list[ProcessStack]]:
        found: dict[int, list[ProcessStack]] = {}
        for stack in self.stacks:
            found.setdefault(stack.rank, []).append(stack)
        return found

    def silent_ranks(self, np: int = 0) -> list[int]:
        """Ranks none of whose processes answered (those never registered too, up to ``np``)."""
        ranks = self.by_rank()
        every = sorted(set(ranks) | set(range(np)))
        return [r for r in every if not any(s.answered for s in ranks.get(r, []))]

    def render(self, rank_pods: Sequence[str] = (), np: int = 0) -> list[str]:
        """The report as log lines: per rank, each process's stack or why it did not answer."""
        out: list[str] = []
        ranks = self.by_rank()
        for rank in sorted(set(ranks) | set(range(np))):
            pod = f" on pod {rank_pods[rank]}" if rank < len(rank_pods) else ""
            processes = ranks.get(rank, [])
            if not processes:
                out.append(f"--- rank {rank}{pod}: no Python process registered for stacks")
                if not self.errors:
                    out.append("    (not a Python rank, or Python started with -S or -I, which skip sitecustomize)")
                continue
            for stack in processes:
                where = pod or f" on {stack.host}"
                if stack.answered:
                    out.append(f"--- rank {rank}{where}, pid {stack.pid}:")
                    out.extend(f"    {line}" for line in stack.lines)
                else:
                    out.append(f"--- rank {rank}{where}, pid {stack.pid} {WHY_NOT.get(stack.state, stack.state)}")
        for pod, error in sorted(self.errors.items()):
            out.append(f"--- pod {pod}: could not be asked for stacks: {error}")
        return out


def parse_stacks(text: str) -> list[ProcessStack]:
    """One pod's ``launch.sh stacks`` output -> its processes' stacks (other lines are dropped)."""
    found: list[ProcessStack] = []
    header: re.Match[str] | None = None
    lines: list[str] = []

    def close() -> None:
        if header is not None:
            while lines and not lines[-1].strip():
                lines.pop()
            rank, pid, host, state, proc = header.groups()
            found.append(ProcessStack(int(rank), int(pid), host, state, proc, tuple(lines)))

    for line in text.splitlines():
        match = STACK_HEADER.match(line)
        if match:
            close()
            header, lines = match, []
        elif header is not None:
            lines.append(line)
    close()
    return found


def build_report(outputs: Mapping[str, str], errors: Mapping[str, str]) -> StackReport:
    """Each pod's output (pod -> text) and the pods that could not be asked -> one report."""
    stacks: list[ProcessStack] = [s for pod in sorted(outputs) for s in parse_stacks(outputs[pod])]
    return StackReport(tuple(sorted(stacks, key=lambda s: (s.rank, s.pid))), dict(errors))


def stacks_command(launch_script: str, wait: int = STACK_WAIT) -> list[str]:
    """What each pod runs: the launch script's ``stacks`` (the same file every pod has)."""
    return ["bash", launch_script, "stacks", str(wait)]


def describe_silent(report: StackReport, ranks: Iterable[int], rank_pods: Sequence[str]) -> list[str]:
    """'rank R on pod P <why>' for each rank that did not answer."""
    by_rank = report.by_rank()
    out = []
    for rank in ranks:
        pod = f" on pod {rank_pods[rank]}" if rank < len(rank_pods) else ""
        processes = by_rank.get(rank, [])
        why = WHY_NOT.get(processes[0].state, processes[0].state) if processes else "has no Python process registered"
        out.append(f"rank {rank}{pod} {why}")
    return out
