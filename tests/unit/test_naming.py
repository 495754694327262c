"""Job, pod and host names: deterministic, collision-free, valid DNS labels; safe label values."""

from __future__ import annotations

import random
import re
import string

import pytest

from airflow_mpi.job.naming import (
    LABEL_MAP_INDEX,
    RunIdentity,
    build_job_labels,
    build_job_name,
    build_pod_labels,
    build_pod_name,
    build_run_key,
    run_selector,
    safe_label_value,
)
from airflow_mpi.spec import Role
from tests.doubles.apivalidation import validate_labels

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def test_job_name_is_deterministic_per_try() -> None:
    identity = RunIdentity("dag", "train", "scheduled__2026-01-05", 3, 2)
    assert build_job_name("digits", identity) == build_job_name("digits", identity)
    assert re.fullmatch(r"digits-[a-z2-7]{13}", build_job_name("digits", identity))


def test_job_names_differ_between_runs_tries_tasks_and_map_indexes() -> None:
    base = RunIdentity("dag", "train", "run-1", -1, 1)
    variants = [
        base,
        RunIdentity("dag", "train", "run-2", -1, 1),
        RunIdentity("dag", "train", "run-1", -1, 2),
        RunIdentity("dag", "train", "run-1", 0, 1),
        RunIdentity("dag", "train2", "run-1", -1, 1),
        RunIdentity("dag2", "train", "run-1", -1, 1),
    ]
    names = {build_job_name("digits", v) for v in variants}
    assert len(names) == len(variants)
    # Every try of one task instance shares the run key (used to find an earlier try's job).
    assert build_run_key(base) == build_run_key(RunIdentity("dag", "train", "run-1", -1, 7))
    assert build_run_key(base) != build_run_key(variants[1])


def test_backfill_of_many_runs_never_collides() -> None:
    names = {build_job_name("d", RunIdentity("dag", "t", f"backfill__2026-01-{i:04d}")) for i in range(5000)}
    assert len(names) == 5000


def test_pod_names() -> None:
    assert build_pod_name("job-1", Role.MASTER, 0) == "job-1-master-0"
    assert build_pod_name("job-1", Role.WORKER, 12) == "job-1-worker-12"


def test_safe_label_value_for_any_text() -> None:
    rng = random.Random(7)
    alphabet = string.printable + "äöü:/+"
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))
        value = safe_label_value(text)
        assert len(value) <= 63 and LABEL_VALUE.match(value), (text, value)
    assert safe_label_value("train") == "train"
    assert safe_label_value("manual__2026-01-01T00:00:00+00:00") != safe_label_value(
        "manual__2026-01-01T00:00:00+01:00"
    )


def test_job_labels_carry_run_identity() -> None:
    labels = build_job_labels("digits-1234abcd", RunIdentity("my dag", "train", "manual__x", 4, 2), {"team": "ml"})
    assert labels["airflow-mpi.io/job"] == "digits-1234abcd"
    assert labels["airflow-mpi.io/map-index"] == "4" and labels["airflow-mpi.io/try-number"] == "2"
    assert labels["app.kubernetes.io/managed-by"] == "airflow-mpi"
    assert labels["team"] == "ml"
    assert all(len(v) <= 63 and LABEL_VALUE.match(v) for v in labels.values())


@pytest.mark.parametrize("map_index", [-1, 0, 1, 9, 10, 99, 1000, 10_000])
def test_every_label_is_one_the_apiserver_accepts(map_index: int) -> None:
    identity = RunIdentity("my.dag-1", "train_step.x", "manual__2026-11-30T19:52:07.123456+00:00", map_index, 100)
    job_labels = build_job_labels("digits-1234abcd", identity, {"team": "ml"})
    for labels in (job_labels, build_pod_labels(job_labels, Role.WORKER, 12)):
        assert validate_labels(labels, "metadata.labels") == [], labels


def test_an_unmapped_task_has_no_map_index_label_and_a_mapped_one_has_it() -> None:
    unmapped = RunIdentity("dag", "train", "run", -1)
    assert LABEL_MAP_INDEX not in build_job_labels("job-1", unmapped)
    # not even one a user put in pod.labels: an unmapped task does not claim a map index
    assert LABEL_MAP_INDEX not in build_job_labels("job-1", unmapped, {LABEL_MAP_INDEX: "3"})
    assert build_job_labels("job-1", RunIdentity("dag", "train", "run", 0))[LABEL_MAP_INDEX] == "0"
    # -1 is what a real apiserver refuses: the check used above says so too
    assert validate_labels({LABEL_MAP_INDEX: "-1"}, "metadata.labels")


def test_run_selector_tells_unmapped_from_mapped_tasks_and_keeps_tries_together() -> None:
    selectors = {run_selector(RunIdentity("dag", "train", "run", index, 1)) for index in (-1, 0, 1)}
    assert len(selectors) == 3
    assert run_selector(RunIdentity("dag", "train", "run", -1, 1)) == run_selector(
        RunIdentity("dag", "train", "run", -1, 5)
    )
