"""Readiness probes: each failing host named with its problem and the fix."""

from __future__ import annotations

from airflow_mpi.observe.readiness import HostProbe, HostProblem, classify_ssh_result, ready_since, summarize_not_ready


def test_success() -> None:
    assert classify_ssh_result("w", 0, "").ok


def test_summary_has_a_line_per_failing_host() -> None:
    probes = [
        HostProbe("w-0.job", HostProblem.OK),
        classify_ssh_result("w-1.job", 255, "ssh: connect to host w-1.job port 22: Connection refused\n"),
        classify_ssh_result("w-2.job", 255, "root@w-2.job: Permission denied (publickey).\n"),
    ]
    text = summarize_not_ready(probes, 30.2, port=22)
    lines = text.splitlines()
    assert lines[0] == "2 of 3 worker host(s) did not accept ssh within 30s:"
    assert lines[1].startswith("  w-1.job: port closed: nothing listens on port 22")
    assert "mpirun prints nothing or hangs" in lines[1]
    assert lines[2].startswith("  w-2.job: key refused") and "Permission denied (publickey)" in lines[2]
    assert "authorized_keys" in lines[2] and "0600" in lines[2]  # the fix, not a document to look up


def test_ready_since_is_the_last_pods_ready_moment_or_none_while_one_does_not_say() -> None:
    def pod(*conditions: dict[str, str]) -> dict[str, object]:
        return {"status": {"conditions": list(conditions)}}

    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    first = pod(scheduled, {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"})
    last = pod({"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:03+00:00"})
    assert ready_since([first, last]) == ready_since([last, first]) == 1767225603.0
    assert ready_since([first, pod({"type": "Ready", "status": "False", "lastTransitionTime": "x"})]) is None
    assert ready_since([first, pod({"type": "Ready", "status": "True", "lastTransitionTime": "soon"})]) is None
    assert ready_since([first, {"status": None}, {}]) is None
    assert ready_since([]) is None
