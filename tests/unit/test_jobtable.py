"""What `airflow-mpi jobs` and `gc` make of a job's Secret and pods: phase, age, backend, and the verdict."""

from __future__ import annotations

import re
from typing import Any

import pytest

from airflow_mpi.observe.jobtable import (
    JobRow,
    format_age,
    format_duration,
    gc_verdict,
    parse_duration,
    render_table,
    summarize_job,
)
from airflow_mpi.observe.status import pod_state_from_k8s

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def secret(name: str = "train-0123abcd", created: str = "2027-01-15T06:00:00Z", **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{name}-ssh",
            "creationTimestamp": created,
            "labels": {"airflow-mpi.io/job": name, "airflow-mpi.io/try-number": "2", "airflow-mpi.io/map-index": "4"},
            "annotations": {
                "airflow-mpi.io/dag-id": "etl",
                "airflow-mpi.io/task-id": "train",
                "airflow-mpi.io/run-id": "manual__2027-01-15T05:00:00+00:00",
            },
            **meta,
        }
    }


def pod(role: str, index: int, phase: str, ready: bool = False, exit_code: int | None = None) -> dict[str, Any]:
    state = {"terminated": {"exitCode": exit_code, "reason": "Error"}} if exit_code is not None else {"running": {}}
    return {
        "metadata": {"name": f"train-0123abcd-{role}-{index}", "labels": {"airflow-mpi.io/role": role}},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"state": state}],
        },
    }


WORKERS = [pod("worker", 0, "Running", ready=True), pod("worker", 1, "Running", ready=True)]


@pytest.mark.parametrize(
    ("pods", "phase", "why"),
    [
        ([], "NoPods", "no pods: its task is gone"),
        ([*WORKERS, pod("master", 0, "Succeeded", exit_code=0)], "Succeeded", "the master succeeded"),
        ([*WORKERS, pod("master", 0, "Failed", exit_code=3)], "Failed", "pod train-0123abcd-master-0 (master) failed"),
        ([pod("worker", 0, "Failed", exit_code=137), *WORKERS[1:]], "Failed", "pod train-0123abcd-worker-0 (worker)"),
        (WORKERS, "Starting", "no master pod yet (2 of 2 workers ready)"),
        ([*WORKERS, pod("master", 0, "Running")], "Running", "the master is running"),
        ([*WORKERS, pod("master", 0, "Pending")], "Pending", "pod train-0123abcd-master-0 (master) pending"),
    ],
)
def test_phase_from_the_pods(pods: list[dict[str, Any]], phase: str, why: str) -> None:
    row = summarize_job(secret(), pods, NOW)
    assert row.phase == phase and row.why.startswith(why)
    assert row.pods == len(pods) and row.pods_ready == sum(
        p["status"]["conditions"][0]["status"] == "True" for p in pods
    )


def test_identity_comes_from_the_annotations_exactly_and_the_age_from_the_secret() -> None:
    row = summarize_job(secret(), WORKERS, NOW)
    assert row.cells() == (
        "train-0123abcd", "etl", "train[4]", "manual__2027-01-15T05:00:00+00:00", "2", "Starting", "2h", "2/2", "pods"
    )  # fmt: skip
    assert summarize_job(secret(deletionTimestamp="2027-01-15T07:00:00Z"), WORKERS, NOW).phase == "Deleting"


def test_the_backends_states_decide_the_phase_and_its_kind_is_shown() -> None:
    """A backend may read the pods its own way (an MPIJob: only the newest launcher counts)."""
    old, new = pod("master", 0, "Failed", exit_code=1), pod("master", 1, "Running")
    newest = [state for state in map(pod_state_from_k8s, [old, new]) if state.name == new["metadata"]["name"]]
    assert summarize_job(secret(), [old, new], NOW).phase == "Failed"
    row = summarize_job(secret(), [old, new], NOW, states=newest, backend="mpijob")
    assert (row.phase, row.ready, row.backend, row.cells()[-1]) == ("Running", "0/1", "mpijob", "mpijob")


def test_gc_removes_only_finished_or_abandoned_jobs_older_than_the_limit() -> None:
    def verdict(pods: list[dict[str, Any]], older_than: float = 3600) -> tuple[bool, str]:
        return gc_verdict(summarize_job(secret(), pods, NOW), older_than)

    assert verdict([*WORKERS, pod("master", 0, "Succeeded", exit_code=0)]) == (True, "finished: the master succeeded")
    assert verdict([*WORKERS, pod("master", 0, "Succeeded", exit_code=0)], 3 * 3600) == (False, "younger than 3h")
    assert verdict([])[0] and verdict(WORKERS)[0]
    keep, why = verdict([*WORKERS, pod("master", 0, "Running")])
    assert not keep and "a retry of its task may reattach" in why and "airflow-mpi delete train-0123abcd" in why


def test_table_columns_line_up() -> None:
    rows = [
        JobRow("a-0123abcd", "etl", "t", "r", "1", "Running", 3, 3, 45, ""),
        JobRow("longer-name-0123abcd", "d", "train", "run", "2", "Failed", 0, 3, 7200, "", "volcano"),
    ]
    lines = render_table(rows)
    assert [line.index(("PHASE", "Running", "Failed")[i]) for i, line in enumerate(lines)] == [
        lines[0].index("PHASE")
    ] * 3
    assert lines[1].split() == ["a-0123abcd", "etl", "t", "r", "1", "Running", "45s", "3/3", "pods"]
    assert lines[2].split()[-1] == "volcano" and lines[0].split()[-1] == "BACKEND"


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("1h30m", 5400), ("0s", 0)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5", "1w", "-1h", "1h 30x"])
def test_bad_durations_say_the_form(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape("e.g. 90s, 30m, 2h, 1d or 1h30m")):
        parse_duration(text)


def test_ages_as_kubectl_shows_them() -> None:
    assert [format_age(s) for s in (5, 119, 120, 7199, 7200, 2 * 86400 + 5)] == ["5s", "119s", "2m", "119m", "2h", "2d"]
