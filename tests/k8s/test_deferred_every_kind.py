"""Every failure the waiting path reports, also run deferred on every job kind, must end the task
with the same message: a rank's non-zero exit (on Volcano its policy deletes the other pods
first), an evicted worker, the job timeout, the queue timeout, and an MPIJob launcher's deadline.
Through Airflow (dag.test(): the operator, its trigger, its resumption) against the API double
with Volcano's and mpi-operator's controllers. The trigger reads the pods through the same kind
functions as the waiting backend (``kinds``): a message that differs is a rule the two read apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi.job.plan import JobPlan
from tests.airflow_helpers import task_states
from tests.doubles.gang_controllers import GangControllers
from tests.doubles.kube_double import LEASES, KubeDouble, PodScript, ScriptedKubelet
from tests.doubles.kueue_mpijobs import KueueMPIJobs
from tests.doubles.mpijob_controller import MPIJobController
from tests.k8s.conftest import install_connections
from tests.k8s.test_gang import _crd_validator

CASE = re.compile(r"^(rank|evict|tmout|queue|deadl)")
JOB_NAME = re.compile(r"\b(?:rank|evict|tmout|queue|deadl)(?:pod|vol|mpi)[wd]-[a-z2-7]+")
RANK_FAILURE = (
    "[1,1]<stderr>:ValueError: bad batch",
    "mpiexec detected that one or more processes exited with non-zero status, thus causing",
    "  Process name: [[36914,1],1]",
    "  Exit code:    3",
)
# What each case's message must name (so a match is the right failure, not any failure).
NAMES = {
    "rank": "rank 1",
    "evict": "Evicted",
    "tmout": "ran past its timeout of 3s",
    "queue": "scheduling.queue_timeout",
    "deadl": "DeadlineExceeded",
}


def behaviour(pod: dict[str, Any]) -> PodScript:
    """What a pod does, by the case its job's name starts with and its role."""
    name = pod["metadata"]["name"]
    master = (pod["metadata"].get("labels") or {}).get("airflow-mpi.io/role") == "master"
    case = CASE.match(name)
    training = PodScript(lines=lambda: iter(["[1,0]<stdout>:training"]))  # until deleted
    if case is None:
        return PodScript()
    if case[1] == "rank" and master:
        return PodScript(lines=lambda: iter(RANK_FAILURE), exit_code=3)
    if case[1] == "evict":
        # Late enough that the master runs in both modes (a deferred task resumes to start it).
        return training if master else PodScript(evicted_after=4.0) if name.endswith("-worker-1") else PodScript()
    if case[1] in ("tmout", "deadl") and master:
        return training
    return PodScript(lines=lambda: iter(["[1,0]<stdout>:hello"]), exit_code=0) if master else PodScript()


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeDouble]:
    """The double with one node of 4 GPUs, Volcano's and the gang controllers, and mpi-operator
    with Kueue's MPIJob integration holding every queued MPIJob; a connection per kind."""
    double = KubeDouble(ScriptedKubelet(behaviour))
    gangs, operator = GangControllers(double, gpus_per_node=[4]), MPIJobController(double)
    kueue = KueueMPIJobs(double, operator)
    double.custom_validator = _crd_validator
    double.start()
    kueue.hold_admission(3600)
    install_connections(monkeypatch, double, mpi_conn_id="mpi_pods")
    install_connections(monkeypatch, double, mpi_conn_id="mpi_volcano", backend="volcano")
    install_connections(monkeypatch, double, mpi_conn_id="mpi_mpijob", backend="mpijob")
    yield double
    kueue.stop()
    operator.stop()
    gangs.stop()
    double.stop()


def short_launcher_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``deadl`` jobs' launcher Job gets a 2 s ``activeDeadlineSeconds``."""
    import airflow_mpi.kinds.mpijob as kinds

    original = kinds.render_mpijob_manifests

    def render(plan: JobPlan, namespace: str, **kwargs: Any) -> Any:
        objects = original(plan, namespace, **kwargs)
        if plan.spec.name.startswith("deadl"):
            objects[0]["spec"]["runPolicy"]["activeDeadlineSeconds"] = 2
        return objects

    monkeypatch.setattr(kinds, "render_mpijob_manifests", render)


def same_shape(message: str) -> str:
    """A message with what must differ between two runs masked: the job's name, durations."""
    return re.sub(r"\b\d+s\b", "Ns", JOB_NAME.sub("JOB", message))


def test_every_failure_ends_a_deferred_task_as_it_ends_a_waiting_one_on_every_kind(
    dagbag: Any, kube: KubeDouble, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    failures = tmp_path / "failures.jsonl"
    monkeypatch.setenv("AIRFLOW_MPI_FAILURE_LOG", str(failures))
    short_launcher_deadline(monkeypatch)
    dag_run = dagbag.get_dag("mpi_test_every_kind").test()
    states = task_states(dag_run)
    assert {task: state for task, state in states.items() if state != "failed"} == {}
    errors = {row["task"]: row["error"] for row in map(json.loads, failures.read_text().splitlines())}
    assert set(errors) == set(states)
    for task_id in sorted(t for t in errors if t.endswith("_waiting")):
        case = task_id.split("_", 1)[0]
        waiting, deferred = errors[task_id], errors[task_id.replace("_waiting", "_deferred")]
        assert NAMES[case] in waiting, (task_id, waiting)
        assert same_shape(deferred) == same_shape(waiting), (task_id, waiting, deferred)
    assert [f"{p}/{o['metadata']['name']}" for p in ("pods", "services", "secrets", "configmaps", LEASES)
            for o in kube.list_objects(p, "default")] == []  # fmt: skip
