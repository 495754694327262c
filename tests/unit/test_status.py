"""The one state machine: pod states -> job phase and cause."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_mpi.observe.status import JobPhase, PodPhase, PodState, WatchLoop, evaluate_job
from airflow_mpi.spec import Role

M, W = Role.MASTER, Role.WORKER


def pod(name: str, role: Role, phase: PodPhase, **kw: object) -> PodState:
    return PodState(name, role, phase, **kw)  # type: ignore[arg-type]


CASES = [
    (
        "workers starting",
        [pod("w0", W, PodPhase.PENDING), pod("w1", W, PodPhase.RUNNING, ready=True)],
        JobPhase.STARTING,
        None,
    ),
    ("workers ready", [pod("w0", W, PodPhase.RUNNING, ready=True)], JobPhase.READY, None),
    ("no workers", [], JobPhase.READY, None),
    (
        "master pending",
        [pod("m", M, PodPhase.PENDING), pod("w0", W, PodPhase.RUNNING, ready=True)],
        JobPhase.RUNNING,
        None,
    ),
    (
        "master running",
        [pod("m", M, PodPhase.RUNNING), pod("w0", W, PodPhase.RUNNING, ready=True)],
        JobPhase.RUNNING,
        None,
    ),
    (
        "master done",
        [pod("m", M, PodPhase.SUCCEEDED, exit_code=0), pod("w0", W, PodPhase.RUNNING)],
        JobPhase.SUCCEEDED,
        None,
    ),
    (
        "master failed",
        [pod("m", M, PodPhase.FAILED, exit_code=3), pod("w0", W, PodPhase.RUNNING)],
        JobPhase.FAILED,
        "m",
    ),
    (
        "worker lost while master runs",
        [pod("m", M, PodPhase.RUNNING), pod("w0", W, PodPhase.FAILED, exit_code=137, reason="OOMKilled")],
        JobPhase.FAILED,
        "w0",
    ),
    (
        "worker lost beats master failure",
        [pod("m", M, PodPhase.FAILED, exit_code=1), pod("w0", W, PodPhase.FAILED, reason="Evicted")],
        JobPhase.FAILED,
        "w0",
    ),
    ("worker exits 0 early", [pod("w0", W, PodPhase.SUCCEEDED, exit_code=0)], JobPhase.FAILED, "w0"),
    (
        "image pull",
        [pod("w0", W, PodPhase.PENDING, reason="ImagePullBackOff", message="no such image")],
        JobPhase.FAILED,
        "w0",
    ),
    ("crash loop", [pod("w1", W, PodPhase.RUNNING, reason="CrashLoopBackOff")], JobPhase.FAILED, "w1"),
]


@pytest.mark.parametrize(("case", "pods", "phase", "failed"), CASES, ids=[c[0] for c in CASES])
def test_evaluate_job(case: str, pods: list[PodState], phase: JobPhase, failed: str | None) -> None:
    status = evaluate_job(pods)
    assert status.phase is phase
    assert status.failed_pod == failed
    if failed:
        assert failed in status.reason


def test_describe_names_reason_and_code() -> None:
    text = pod("w0", W, PodPhase.FAILED, exit_code=137, reason="OOMKilled").describe()
    assert text == "pod w0 (worker) failed, exit code 137, OOMKilled"


def watch_event(kind: str, name: str, rv: str) -> dict[str, object]:
    return {"type": kind, "object": {"metadata": {"name": name, "resourceVersion": rv}, "status": {"phase": "Running"}}}


def test_watch_loop_lists_first_then_watches_from_the_listed_version() -> None:
    loop = WatchLoop()
    assert loop.must_list
    loop.listed([{"metadata": {"name": "w0", "resourceVersion": "3"}}], "7")
    assert not loop.must_list and loop.table.resource_version == "7"
    assert loop.apply(watch_event("ADDED", "w1", "8"))
    assert loop.apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}})
    assert set(loop.table.pods) == {"w0", "w1"} and loop.table.resource_version == "9"


def test_watch_loop_relists_after_410_gone_in_the_stream_or_as_an_answer() -> None:
    loop = WatchLoop()
    loop.listed([], "7")
    assert not loop.apply({"type": "ERROR", "object": {"code": 410, "message": "too old"}})
    assert loop.must_list
    loop.listed([], "20")
    loop.failed(gone=False)
    assert not loop.must_list  # any other failure: watch again from the same version
    loop.failed(gone=True)
    assert loop.must_list


def test_watch_loop_backs_off_doubling_to_a_cap_and_a_finished_watch_resets_it() -> None:
    loop = WatchLoop(first_backoff=0.2, max_backoff=1.0)
    assert [loop.failed(gone=False) for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    loop.watch_ended()
    assert loop.failed(gone=False) == 0.2


def _pod(name: str, role: str, created: str, phase: str = "Running") -> dict[str, object]:
    labels = {"airflow-mpi.io/role": role}
    return {"metadata": {"name": name, "labels": labels, "creationTimestamp": created}, "status": {"phase": phase}}


def test_a_pod_a_controller_generated_for_an_expected_name_counts_as_it() -> None:
    """A batch Job names its pod ``<job>-<random>``: the newest such pod of the expected role is
    the expected pod (under the expected name, its own in the message); older ones drop out."""
    loop = WatchLoop()
    old = _pod("j-launcher-aaaaa", "master", "2026-01-01T00:00:01Z", "Failed")
    new = _pod("j-launcher-bbbbb", "master", "2026-01-01T00:00:05Z", "Succeeded")
    worker = _pod("j-worker-0", "worker", "2026-01-01T00:00:00Z")
    loop.listed([old, new, worker], "1")
    expected = {"j-launcher": Role.MASTER, "j-worker-0": Role.WORKER, "j-worker-1": Role.WORKER}
    states = {state.name: state for state in loop.table.states(expected)}
    assert set(states) == {"j-launcher", "j-worker-0", "j-worker-1"}
    assert states["j-launcher"].phase is PodPhase.SUCCEEDED and "pod j-launcher-bbbbb" in states["j-launcher"].message
    assert states["j-worker-1"].phase is PodPhase.PENDING  # not seen yet: not a generated pod
    assert loop.table.generated("j-launcher", Role.MASTER) == ["j-launcher-aaaaa", "j-launcher-bbbbb"]
    assert loop.table.generated("j-launcher", Role.WORKER) == []
    # Once the generated pod is deleted, the expected one counts as deleted, not as pending.
    loop.listed([worker], "2")
    gone = {state.name: state for state in loop.table.states(expected)}["j-launcher"]
    assert (gone.phase, gone.reason) == (PodPhase.FAILED, "Deleted")


def _running_pod(ready: str, containers_ready: list[bool], reason: str = "") -> dict[str, object]:
    return {
        "metadata": {"name": "job-worker-1", "labels": {"airflow-mpi.io/role": "worker"}},
        "spec": {"nodeName": "node-1"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": ready, **({"reason": reason} if reason else {})}],
            "containerStatuses": [
                {"name": f"c{i}", "ready": r, "state": {"running": {}}} for i, r in enumerate(containers_ready)
            ],
        },
    }


def test_a_pod_whose_node_stopped_reporting_fails_the_job_naming_the_node() -> None:
    """The node lifecycle controller's mark (Ready False, the kubelet's last word: all ready)."""
    from airflow_mpi.observe.status import NODE_LOST, pod_state_from_k8s, slim_pod

    lost = pod_state_from_k8s(slim_pod(_running_pod("False", [True])))
    assert (lost.reason, lost.node) == (NODE_LOST, "node-1")
    status = evaluate_job([pod("m", M, PodPhase.RUNNING), lost])
    assert status.phase is JobPhase.FAILED and status.failed_pod == "job-worker-1"
    assert "Node node-1 stopped reporting" in status.reason


@pytest.mark.parametrize(
    ("ready", "containers", "reason"),
    [
        ("True", [True], ""),
        ("False", [False], "ContainersNotReady"),
        ("False", [], ""),
        ("False", [True, False], ""),
        ("False", [True], "ReadinessGatesNotReady"),
    ],
    ids=["ready", "kubelet says not ready", "no container status yet", "one container not ready", "readiness gate"],
)
def test_not_ready_by_the_kubelets_own_account_is_not_a_lost_node(
    ready: str, containers: list[bool], reason: str
) -> None:
    from airflow_mpi.observe.status import NODE_LOST, pod_state_from_k8s

    assert pod_state_from_k8s(_running_pod(ready, containers, reason)).reason != NODE_LOST


def _evicted(pod: dict[str, Any], reason: str = "DeletionByTaintManager") -> dict[str, Any]:
    """``pod`` as the taint eviction controller leaves it: a DisruptionTarget condition, then deleted."""
    disruption = {"type": "DisruptionTarget", "status": "True", "reason": reason,
                  "message": "Taint manager: deleting due to NoExecute taint"}  # fmt: skip
    pod["status"]["conditions"].append(disruption)
    pod["metadata"]["deletionTimestamp"] = "2026-12-07T12:00:00Z"
    return pod


def test_a_pod_never_ready_when_its_node_went_silent_fails_once_the_cluster_evicts_it() -> None:
    """The node lifecycle controller leaves a never-Ready pod's Ready False as it was: the only
    word is the taint eviction controller's (the job's pods tolerate the node-lost taints 20 s)."""
    from airflow_mpi.observe.status import NODE_EVICTED, pod_state_from_k8s, slim_pod

    starting = _running_pod("False", [False], "ContainersNotReady")
    assert pod_state_from_k8s(starting).reason == ""  # before the eviction: nothing to tell
    evicted = pod_state_from_k8s(slim_pod(_evicted(starting)))
    assert (evicted.reason, evicted.node) == (NODE_EVICTED, "node-1")
    status = evaluate_job([pod("m", M, PodPhase.RUNNING), evicted])
    assert status.phase is JobPhase.FAILED and status.failed_pod == "job-worker-1"
    assert "from Node node-1 for a NoExecute taint" in status.reason
    assert "kubectl describe node node-1" in status.reason


def test_other_disruptions_and_ended_pods_are_not_read_as_a_lost_node() -> None:
    from airflow_mpi.observe.status import NODE_EVICTED, pod_state_from_k8s

    preempted = _evicted(_running_pod("True", [True]), reason="PreemptionByScheduler")
    assert pod_state_from_k8s(preempted).reason != NODE_EVICTED
    ended = _evicted(_running_pod("False", [False], "PodCompleted"))
    ended["status"]["phase"] = "Succeeded"
    assert pod_state_from_k8s(ended).reason != NODE_EVICTED


def test_a_rank_killed_by_sigkill_is_told_as_the_oom_killer_with_the_limit() -> None:
    from airflow_mpi.runner.job import killed_cause

    assert "memory limit, 256Mi" in killed_cause(9, "256Mi") and "exit 137" in killed_cause(9, "256Mi")
    assert "node's memory" in killed_cause(9, None)
    assert killed_cause(15, "1Gi") == "was killed by signal 15"
