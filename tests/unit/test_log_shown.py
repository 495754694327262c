"""The deferred log's shown mark as a Lease holds it (``observe.shown``), and the Lease a job is
created with (``kinds.manifests.render_log_lease``): what is believed, what is not (and says why),
what a write leaves in the Lease. Pure: tables of Leases."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_mpi.exceptions import SpecError
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import render_plan
from airflow_mpi.kinds.manifests import LOG_LEASE, log_lease_name, render_log_lease, render_owner_reference
from airflow_mpi.observe.shown import (
    LEASE_SECONDS,
    LINES_ANNOTATION,
    TRY_ANNOTATION,
    ShownMark,
    build_trigger_owner,
    is_trigger_owner,
    parse_lease_mark,
    render_lease_mark,
)
from airflow_mpi.spec import MPIJobSpec

OWNER = build_trigger_owner("triggerer-0", 4242, "0123456789abcdef")
NOW = "2026-12-05T16:00:00.123456Z"


def lease(count: Any = None, holder: Any = None, try_text: Any = "1", version: str = "7") -> dict[str, Any]:
    annotations = {} if count is None else {LINES_ANNOTATION: count, TRY_ANNOTATION: try_text}
    spec = {} if holder is None else {"holderIdentity": holder}
    return {"metadata": {"name": "j-log", "resourceVersion": version, "annotations": annotations}, "spec": spec}


def test_a_trigger_names_itself_by_host_process_and_a_random_part() -> None:
    assert OWNER == "triggerer-0:4242:01234567"
    assert is_trigger_owner(OWNER)
    for other in ("", "mallory", "host:1:ABCDEF01", "host:pid:01234567", "a b:1:01234567", "h:1:0123456789"):
        assert not is_trigger_owner(other), other


def test_a_new_lease_has_no_mark_and_no_problem() -> None:
    found = parse_lease_mark(lease())
    assert (found.mark, found.problem, found.holder, found.version) == (None, None, "", "7")


def test_a_mark_a_trigger_wrote_is_believed() -> None:
    found = parse_lease_mark(lease("1234", OWNER, "2"))
    assert found.mark == ShownMark(1234, OWNER, 2) and found.problem is None


@pytest.mark.parametrize(
    ("count", "holder", "try_text", "said"),
    [
        ("Infinity", OWNER, "1", "its line count 'Infinity' is not a whole number of lines"),
        ("NaN", OWNER, "1", "its line count 'NaN' is not a whole number of lines"),
        ("-1", OWNER, "1", "its line count '-1' is not a whole number of lines"),
        ("1e9", OWNER, "1", "its line count '1e9' is not a whole number of lines"),
        ("3.0", OWNER, "1", "its line count '3.0' is not a whole number of lines"),
        (" 3", OWNER, "1", "its line count ' 3' is not a whole number of lines"),
        ("9" * 16, OWNER, "1", "is not a whole number of lines"),  # past any log
        (json.dumps({"lines": 3}), OWNER, "1", "is not a whole number of lines"),
        (3, OWNER, "1", "its line count 3 is not a whole number of lines"),  # not a string: not an annotation
        (None, OWNER, "1", "its line count None is not a whole number of lines"),  # a holder, no count
        ("3", OWNER, "x", "its try 'x' is not a try number"),
        ("3", "mallory", "1", "its holder 'mallory' is not an airflow-mpi trigger"),
        ("3", "", "1", "its holder '' is not an airflow-mpi trigger"),
        ("3", 7, "1", "its holder '' is not an airflow-mpi trigger"),
        ("3", "x" * 300, "1", "its holder '" + "x" * 36 + "... is not an airflow-mpi trigger"),  # said short
    ],
)
def test_a_mark_no_trigger_writes_is_not_believed_and_says_why(
    count: Any, holder: Any, try_text: Any, said: str
) -> None:
    found = parse_lease_mark(lease(count, holder, try_text) if count is not None else lease(None, holder))
    assert found.mark is None
    assert found.problem is not None and said in found.problem, found.problem


def test_a_write_sets_holder_count_try_and_times_keeping_the_rest() -> None:
    read = lease("3", OWNER, "1")
    read["metadata"]["labels"] = {"airflow-mpi.io/job": "j"}
    read["spec"].update(leaseTransitions=2, acquireTime="2026-12-05T15:00:00.000000Z")
    same = render_lease_mark(read, ShownMark(10, OWNER, 1), NOW)
    assert same["metadata"]["annotations"] == {LINES_ANNOTATION: "10", TRY_ANNOTATION: "1"}
    assert same["metadata"]["labels"] == {"airflow-mpi.io/job": "j"} and same["metadata"]["resourceVersion"] == "7"
    assert same["spec"] == {
        "holderIdentity": OWNER,
        "leaseDurationSeconds": LEASE_SECONDS,
        "renewTime": NOW,
        "leaseTransitions": 2,
        "acquireTime": "2026-12-05T15:00:00.000000Z",
    }
    other = build_trigger_owner("triggerer-1", 1, "fedcba9876543210")
    taken = render_lease_mark(read, ShownMark(10, other, 1), NOW)
    assert taken["spec"]["leaseTransitions"] == 3 and taken["spec"]["acquireTime"] == NOW
    assert read["spec"]["holderIdentity"] == OWNER and read["metadata"]["annotations"][LINES_ANNOTATION] == "3"
    first = render_lease_mark(lease(), ShownMark(0, OWNER, 1), NOW)
    assert first["spec"]["leaseTransitions"] == 0 and parse_lease_mark(first).mark == ShownMark(0, OWNER, 1)
    tampered = lease("3", "mallory")
    tampered["spec"]["leaseTransitions"] = -5
    assert render_lease_mark(tampered, ShownMark(3, OWNER, 1), NOW)["spec"]["leaseTransitions"] == 1


def test_the_job_lease_is_labelled_and_owned_like_its_objects_without_the_pods_annotations() -> None:
    job = {"name": "marked", "image": "registry.example/train:1", "command": ["python", "train.py"]}
    with pytest.raises(SpecError, match=r"pod\.annotations\.airflow-mpi\.io/log-lines: uses the prefix"):
        MPIJobSpec.from_dict({**job, "pod": {"annotations": {LINES_ANNOTATION: "999999"}}})  # no preset mark
    spec = MPIJobSpec.from_dict({**job, "pod": {"annotations": {"team": "vision"}}})
    plan = render_plan(spec, RunIdentity("dag", "task", "run", -1, 1))
    owner = render_owner_reference(plan, "uid-1")
    manifest = render_log_lease(plan, "training", owner)
    group, version, _, kind = LOG_LEASE
    assert (manifest["apiVersion"], manifest["kind"]) == (f"{group}/{version}", kind)
    metadata = manifest["metadata"]
    assert metadata["name"] == log_lease_name(plan.job_name) == f"{plan.job_name}-log"
    assert metadata["namespace"] == "training" and metadata["ownerReferences"] == [owner]
    assert metadata["labels"] == plan.labels
    assert set(metadata["annotations"]) == {"airflow-mpi.io/dag-id", "airflow-mpi.io/task-id", "airflow-mpi.io/run-id"}
    assert manifest["spec"] == {} and parse_lease_mark(manifest).mark is None
