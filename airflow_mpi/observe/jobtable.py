"""The jobs in a namespace as ``airflow-mpi jobs`` and ``gc`` show them, from their objects alone.

The CLI may not reach Airflow's database, so everything here comes from what the cluster holds:
the job's Secret, which every Kubernetes backend creates (its labels and annotations name the run
identity; its creation time is the job's age), and its pods' states as the job's backend reads
them (the phase, how many are ready). ``gc_verdict`` decides from the same facts whether a job is
finished or abandoned and may go, and says why, whichever backend made it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from airflow_mpi.job.naming import (
    LABEL_DAG_ID,
    LABEL_JOB,
    LABEL_MAP_INDEX,
    LABEL_PREFIX,
    LABEL_RUN_ID,
    LABEL_TASK_ID,
    LABEL_TRY_NUMBER,
    MANAGED_BY,
)
from airflow_mpi.observe.status import FATAL_WAITING_REASONS, PodPhase, PodState, pod_state_from_k8s
from airflow_mpi.spec import Role

MANAGED_SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"
COLUMNS = ("NAME", "DAG", "TASK", "RUN", "TRY", "PHASE", "AGE", "READY", "BACKEND")
_DURATION_PART = re.compile(r"(\d+)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class JobRow:
    """One job: its identity, phase, pods ready and age."""

    name: str
    dag_id: str
    task_id: str  # with ``[map index]`` for a mapped task
    run_id: str
    try_number: str
    phase: str
    pods_ready: int
    pods: int
    age_s: float
    why: str  # the phase in words: which pod ended how, what is missing
    backend: str = "pods"  # what made the pods: pods (plain pods), volcano (a Volcano Job), mpijob

    @property
    def ready(self) -> str:
        return f"{self.pods_ready}/{self.pods}"

    def cells(self) -> tuple[str, ...]:
        return (
            self.name,
            self.dag_id,
            self.task_id,
            self.run_id,
            self.try_number,
            self.phase,
            format_age(self.age_s),
            self.ready,
            self.backend,
        )


def summarize_job(
    anchor: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    now: float,
    *,
    states: Sequence[PodState] | None = None,
    backend: str = "pods",
) -> JobRow:
    """A job's row from the object its identity is read from (its Secret; plain JSON, as the API
    returns it) and its pods, or the states its backend made of them."""
    meta = anchor.get("metadata") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    task = notes.get(f"{LABEL_PREFIX}/task-id") or labels.get(LABEL_TASK_ID, "")
    if labels.get(LABEL_MAP_INDEX):
        task = f"{task}[{labels[LABEL_MAP_INDEX]}]"
    states = [pod_state_from_k8s(pod) for pod in pods] if states is None else list(states)
    phase, why = job_phase(states, deleting=bool(meta.get("deletionTimestamp")))
    created = parse_timestamp(meta.get("creationTimestamp"))
    return JobRow(
        name=labels.get(LABEL_JOB) or meta.get("name", ""),
        dag_id=notes.get(f"{LABEL_PREFIX}/dag-id") or labels.get(LABEL_DAG_ID, ""),
        task_id=task,
        run_id=notes.get(f"{LABEL_PREFIX}/run-id") or labels.get(LABEL_RUN_ID, ""),
        try_number=labels.get(LABEL_TRY_NUMBER, ""),
        phase=phase,
        pods_ready=sum(1 for state in states if state.ready),
        pods=len(states),
        age_s=max(0.0, now - created) if created is not None else 0.0,
        why=why,
        backend=backend,
    )


def job_phase(states: Sequence[PodState], *, deleting: bool = False) -> tuple[str, str]:
    """(phase, why): Deleting, NoPods, Succeeded, Failed, Running, Starting (workers, no master
    yet) or Pending, the master's end deciding over the workers' (they are stopped after it)."""
    if deleting:
        return "Deleting", "it is being deleted"
    if not states:
        return "NoPods", "no pods: its task is gone (the job was never started or its pods were removed)"
    master = next((s for s in states if s.role is Role.MASTER), None)
    if master is not None and master.phase is PodPhase.SUCCEEDED:
        return "Succeeded", "the master succeeded"
    failed = [s for s in states if s.phase is PodPhase.FAILED or s.reason in FATAL_WAITING_REASONS]
    if failed:
        return "Failed", failed[0].describe()
    if master is None:
        ready = sum(1 for s in states if s.ready)
        return "Starting", f"no master pod yet ({ready} of {len(states)} workers ready)"
    if master.phase is PodPhase.RUNNING:
        return "Running", "the master is running"
    return "Pending", master.describe()


def gc_verdict(row: JobRow, older_than_s: float) -> tuple[bool, str]:
    """Whether ``gc`` removes this job, and why (or why not). Finished jobs (the master ended,
    a pod failed), jobs without pods and jobs whose master never started go once older than
    ``older_than_s``; a running job stays: a retry of its task may reattach to it."""
    if row.age_s < older_than_s:
        return False, f"younger than {format_duration(older_than_s)}"
    if row.phase == "Deleting":
        return False, "already being deleted"
    if row.phase in ("Succeeded", "Failed"):
        return True, f"finished: {row.why}"
    if row.phase == "NoPods":
        return True, row.why
    if row.phase == "Starting":
        return True, f"{row.why} after {format_age(row.age_s)}: its task is gone or gave up waiting"
    return False, (
        f"{row.phase.lower()}: {row.why}; a retry of its task may reattach to it "
        f"(`airflow-mpi delete {row.name}` if its task is gone)"
    )


def render_table(rows: Sequence[JobRow]) -> list[str]:
    """Rows under ``COLUMNS``, each column as wide as its widest cell (as kubectl prints)."""
    cells = [COLUMNS, *(row.cells() for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return ["   ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in cells]


def format_age(seconds: float) -> str:
    """An age as kubectl shows it: 45s, 12m, 5h, 3d."""
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 2 * 3600:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def format_duration(seconds: float) -> str:
    """A duration in its largest whole unit, as ``--older-than`` takes it: 90s, 30m, 2h, 1d."""
    whole = int(seconds)
    for unit in ("d", "h", "m"):
        if whole and whole % _UNIT_SECONDS[unit] == 0:
            return f"{whole // _UNIT_SECONDS[unit]}{unit}"
    return f"{whole}s"


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``2h``, ``1d``, ``1h30m`` -> seconds; ``ValueError`` saying the form."""
    cleaned = text.strip().lower()
    if not cleaned or _DURATION_PART.sub("", cleaned):
        raise ValueError(f"{text!r} is not a duration: give a number with a unit, e.g. 90s, 30m, 2h, 1d or 1h30m")
    return float(sum(int(number) * _UNIT_SECONDS[unit] for number, unit in _DURATION_PART.findall(cleaned)))


def parse_timestamp(text: object) -> float | None:
    """An API timestamp (RFC 3339, ``2026-01-02T03:04:05Z``) -> Unix seconds; None if absent."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
