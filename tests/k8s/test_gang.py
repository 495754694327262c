"""Gang scheduling and queues through the API double: the Volcano Job backend and the Kubernetes
backend with each gang setting; failures name their cause; two jobs that cannot both fit run one
after the other instead of deadlocking.

What the real Volcano and Kueue run (tests/cluster/test_volcano_real.py, test_kueue_real.py) is
not repeated here: a case stays in this tier only for a gang setting the real tier does not run
(coscheduling has no scheduler plugin built here) or what the double alone can do (the waits and
merges of the deferred path, CRD checks of every object sent)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import JobFailed, JobTimeout, MPIJobError
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.runner.job import JobResult, JobRunner
from airflow_mpi.spec import MPIJobSpec
from tests.doubles.crd_schema import crd_dir, crd_errors, known_kinds
from tests.doubles.gang_controllers import GangControllers
from tests.doubles.kube_double import KubeDouble, PodScript, ScriptedKubelet
from tests.k8s.conftest import Scripts, api_client_for, job_objects, unique

COSCHEDULING = pytest.param({"gang": "coscheduling"}, id="coscheduling")
KUEUE = pytest.param({"gang": "kueue", "queue": "training"}, id="kueue")
GANGS = [pytest.param({"gang": "volcano", "queue": "training"}, id="volcano"), COSCHEDULING, KUEUE]
CUSTOM_PLURALS = ("jobs.batch.volcano.sh", "podgroups.scheduling.volcano.sh", "podgroups.scheduling.x-k8s.io")


class Log(list[str]):
    def __call__(self, text: str) -> None:
        self.extend(text.splitlines())


def _crd_validator(obj: dict[str, Any]) -> list[str]:
    """The apiserver's check of a custom object against its CRD (when the CRDs are at hand)."""
    if crd_dir() is None or (obj.get("apiVersion"), obj.get("kind")) not in known_kinds():
        return []
    return crd_errors(obj)


@pytest.fixture
def cluster(scripts: Scripts) -> Iterator[tuple[KubeDouble, GangControllers]]:
    """The double with one node of 4 GPUs and the gang controllers."""
    kube = KubeDouble(ScriptedKubelet(scripts))
    controllers = GangControllers(kube, gpus_per_node=[4])
    kube.custom_validator = _crd_validator
    kube.start()
    yield kube, controllers
    controllers.stop()
    kube.stop()


def make_plan(scheduling: dict[str, Any] | None = None, workers: int = 2, **fields: Any) -> JobPlan:
    data: dict[str, Any] = {
        "name": "gjob",
        "image": "registry.example/train:1",
        "command": ["python", "/app/train.py"],
        "master": {"gpus": 1},
        "workers": {"replicas": workers, "gpus": 1},
        "scheduling": scheduling or {},
    }
    data.update(fields)
    return render_plan(MPIJobSpec.from_dict(data), RunIdentity("gdag", "train", unique("run")))


def volcano_backend(kube: KubeDouble) -> KubernetesBackend:
    return KubernetesBackend(kind="volcano", api_client=api_client_for(kube), namespace="default")


def kubernetes_backend(kube: KubeDouble) -> KubernetesBackend:
    return KubernetesBackend(api_client=api_client_for(kube), namespace="default")


def backend_for(kube: KubeDouble, scheduling: dict[str, Any] | None) -> KubernetesBackend:
    """The Volcano backend for ``None``, else the Kubernetes backend with that gang setting."""
    return volcano_backend(kube) if scheduling is None else kubernetes_backend(kube)


def run(backend: KubernetesBackend, plan: JobPlan, log: Log | None = None) -> JobResult:
    return JobRunner(backend, plan, log if log is not None else Log()).run()


def nothing_left(kube: KubeDouble, job_name: str) -> list[str]:
    left = job_objects(kube, job_name)
    for plural in (*CUSTOM_PLURALS, "workloads.kueue.x-k8s.io"):
        left += [f"{plural}/{o['metadata']['name']}" for o in kube.list_objects(plural, "default")]
    return left


def added_pods(kube: KubeDouble) -> list[dict[str, Any]]:
    """Every pod created, by anyone (the backend or a controller), in order."""
    return [obj for _, event, plural, obj in kube.history if plural == "pods" and event == "ADDED"]


@pytest.mark.parametrize("scheduling", [COSCHEDULING])
def test_rank_failure_names_the_rank(
    cluster: tuple[KubeDouble, GangControllers], scripts: Scripts, scheduling: dict[str, Any] | None
) -> None:
    kube, _ = cluster
    output = ["[1,2]<stderr>:RuntimeError: NCCL error", "  Process name: [[1,1],2]", "  Exit code:    3"]
    scripts.on("-master-", PodScript(lines=lambda: iter(output), exit_code=3))
    plan = make_plan(scheduling, workers=2)
    with pytest.raises(JobFailed) as caught:
        run(backend_for(kube, scheduling), plan)
    assert caught.value.rank == 2 and caught.value.exit_code == 3
    assert f"rank 2 on pod {plan.job_name}-worker-1" in str(caught.value)
    assert nothing_left(kube, plan.job_name) == []


@pytest.mark.parametrize("scheduling", [COSCHEDULING, KUEUE])
def test_evicted_worker_names_the_pod(
    cluster: tuple[KubeDouble, GangControllers], scripts: Scripts, scheduling: dict[str, Any] | None
) -> None:
    kube, controllers = cluster
    scripts.on("-worker-1", PodScript(evicted_after=0.5))
    scripts.on("-master-", PodScript(lines=lambda: iter(["[1,0]<stdout>:training"])))  # until deleted
    plan = make_plan(scheduling, workers=2)
    with pytest.raises(JobFailed) as caught:
        run(backend_for(kube, scheduling), plan)
    assert caught.value.pod == f"{plan.job_name}-worker-1" and "Evicted" in str(caught.value)
    if scheduling is None:
        assert f"{plan.job_name}: TerminateJob" in controllers.log
    assert nothing_left(kube, plan.job_name) == []


@pytest.mark.parametrize("scheduling", GANGS)
def test_timeout_ends_the_job(
    cluster: tuple[KubeDouble, GangControllers], scripts: Scripts, scheduling: dict[str, Any] | None
) -> None:
    kube, _ = cluster
    scripts.on("-master-", PodScript(lines=lambda: iter(["[1,0]<stdout>:forever"])))
    plan = make_plan(scheduling, workers=1, timeout=2)
    with pytest.raises(JobTimeout, match="ran past its timeout of 2s"):
        run(backend_for(kube, scheduling), plan)
    assert nothing_left(kube, plan.job_name) == []


@pytest.mark.parametrize("scheduling", GANGS)
def test_kubernetes_backend_with_each_gang_setting(
    cluster: tuple[KubeDouble, GangControllers], scheduling: dict[str, Any]
) -> None:
    kube, controllers = cluster
    plan = make_plan(scheduling, workers=2)
    log = Log()
    result = run(kubernetes_backend(kube), plan, log)
    assert result.exit_code == 0
    assert f"admitted {plan.job_name}" in controllers.log  # the group was admitted whole
    # The master was created before any worker was Ready: it is not held back behind them.
    events = [(event, obj) for _, event, plural, obj in kube.history if plural == "pods"]
    master_added = next(
        i for i, (e, o) in enumerate(events) if e == "ADDED" and o["metadata"]["name"] == plan.master.name
    )
    first_ready = next(
        i
        for i, (_, o) in enumerate(events)
        if "-worker-" in o["metadata"]["name"]
        and any(c["type"] == "Ready" and c["status"] == "True" for c in o["status"].get("conditions", []))
    )
    assert master_added < first_ready
    assert nothing_left(kube, plan.job_name) == []


@pytest.mark.parametrize("scheduling", [COSCHEDULING])
def test_queued_past_queue_timeout_fails_naming_the_queue_wait(
    cluster: tuple[KubeDouble, GangControllers], scheduling: dict[str, Any] | None
) -> None:
    kube, controllers = cluster
    controllers.hold_admission(60)
    plan = make_plan({**(scheduling or {}), "queue_timeout": 2}, workers=1, startup_timeout=1)
    backend = volcano_backend(kube) if scheduling is None else kubernetes_backend(kube)
    log = Log()
    started = time.monotonic()
    with pytest.raises(JobTimeout, match="queue_timeout") as caught:
        run(backend, plan, log)
    # startup_timeout (1s) did not run while queued: the queue's bound (2s) ended it.
    assert 2 <= time.monotonic() - started < 2 + 5
    assert any("waits for admission" in line for line in log), log
    assert "queue_timeout" in str(caught.value)
    assert nothing_left(kube, plan.job_name) == []


@pytest.mark.parametrize("scheduling", [pytest.param({"gang": "volcano"}, id="volcano-gang")])
def test_two_jobs_needing_3_of_4_gpus_run_one_after_the_other(
    cluster: tuple[KubeDouble, GangControllers], scripts: Scripts, scheduling: dict[str, Any] | None
) -> None:
    kube, controllers = cluster

    def slow() -> Iterator[str]:
        time.sleep(1.5)
        yield "[1,0]<stdout>:trained"

    scripts.on("-master-", PodScript(lines=slow, exit_code=0))
    plans = [make_plan(scheduling, workers=2, startup_timeout=2) for _ in range(2)]
    results: dict[str, Any] = {}
    logs = {plan.job_name: Log() for plan in plans}

    def one(plan: JobPlan) -> None:
        backend = volcano_backend(kube) if scheduling is None else kubernetes_backend(kube)
        try:
            results[plan.job_name] = run(backend, plan, logs[plan.job_name])
        except MPIJobError as error:
            results[plan.job_name] = error

    threads = [threading.Thread(target=one, args=(plan,)) for plan in plans]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(isinstance(results.get(p.job_name), JobResult) for p in plans), results
    (first_at, _), (second_at, second) = controllers.admissions
    # One at a time: the second gang of 3 GPUs was admitted only once the first had ended (its
    # master trains 1.5 s), and in the meantime its task log said it was queued.
    assert second_at - first_at >= 1.5
    later = next(p.job_name for p in plans if second.startswith(p.job_name))
    assert any("waits for admission" in line for line in logs[later]), logs[later]
    for plan in plans:
        assert nothing_left(kube, plan.job_name) == []


def test_custom_objects_sent_pass_their_crd(cluster: tuple[KubeDouble, GangControllers]) -> None:
    if crd_dir() is None:
        pytest.skip("no CRDs beside the checkout")
    kube, _ = cluster
    run(volcano_backend(kube), make_plan(workers=1))
    run(kubernetes_backend(kube), make_plan({"gang": "volcano", "queue": "training"}, workers=1))
    custom = [o for o in kube.created if o.get("apiVersion", "v1") not in ("v1", "coordination.k8s.io/v1")]
    assert {o["kind"] for o in custom} == {"Job", "PodGroup"}
    assert all(crd_errors(o) == [] for o in custom)


def _waiting_pod(name: str, role: str) -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "pod group waits"}
    return {
        "metadata": {"name": name, "resourceVersion": "5", "labels": {"airflow-mpi.io/role": role}},
        "status": {"phase": "Pending", "conditions": [condition]},
    }


def test_a_deferred_gang_waits_queued_without_its_deadline_and_until_queue_timeout() -> None:
    from airflow_mpi.observe.status import PodTable
    from airflow_mpi.triggers.mpi import MPIJobTrigger

    fields: dict[str, Any] = {
        "job_name": "job-1",
        "namespace": "default",
        "kubernetes_conn_id": "kube_double",
        "deadline": time.time() - 5,  # the job's timeout (and mpiexec's grace) has passed...
        "worker_pods": ["job-1-worker-0"],
        "master_pod": "job-1-master-0",
        "timeout": 30.0,
        "gang": True,
    }
    table = PodTable()
    table.replace([_waiting_pod("job-1-master-0", "master"), _waiting_pod("job-1-worker-0", "worker")], "5")
    trigger = MPIJobTrigger(contract={"api_timeout": 60.0, **fields})
    assert trigger.decide(table) is None  # ...but the job is queued, not stuck
    assert trigger.deadline > time.time() + 25
    assert trigger.decide(PodTable()) is None  # no pods yet (Volcano: before admission)
    bounded = MPIJobTrigger(
        contract={"api_timeout": 60.0, **fields, "queue_timeout": 1.0, "created_at": time.time() - 2}
    )
    outcome = bounded.decide(table)
    assert outcome is not None and outcome["status"] == "timeout"
    assert "scheduling.queue_timeout" in outcome["reason"] and "pod group waits" in outcome["reason"]
    assert MPIJobTrigger(contract={"api_timeout": 60.0, **fields, "gang": False}).decide(table) == {
        "outcome": "job_timeout",
        "status": "timeout",
        "reason": "the job ran past its timeout of 30s",
    }


@pytest.mark.parametrize("scheduling", [pytest.param(None, id="volcano-backend"), GANGS[2]])
def test_killing_a_deferred_gang_job_deletes_its_custom_objects_too(
    cluster: tuple[KubeDouble, GangControllers], monkeypatch: pytest.MonkeyPatch, scheduling: dict[str, Any] | None
) -> None:
    import asyncio

    from airflow_mpi.triggers.mpi import MPIJobTrigger
    from tests.k8s.conftest import install_connections

    kube, controllers = cluster
    install_connections(monkeypatch, kube)
    controllers.hold_admission(60)  # killed while queued
    backend = volcano_backend(kube) if scheduling is None else kubernetes_backend(kube)
    plan = make_plan(scheduling, workers=1)
    backend.create(plan)
    deadline = time.monotonic() + 10
    while not any(kube.list_objects(p, "default") for p in (*CUSTOM_PLURALS, "workloads.kueue.x-k8s.io")):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    trigger = MPIJobTrigger(
        contract={
            "job_name": plan.job_name,
            "namespace": "default",
            "kubernetes_conn_id": "kube_double",
            "deadline": time.time() + 30,
            "worker_pods": [plan.workers[0].name],
            "master_pod": plan.master.name,
            "timeout": 30.0,
            "api_timeout": 60.0,
            "gang": True,
            "custom_objects": [list(kind) for kind in backend.custom_objects_to_delete(plan)],
        }
    )
    asyncio.run(trigger.on_kill())
    deadline = time.monotonic() + 10
    while nothing_left(kube, plan.job_name) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert nothing_left(kube, plan.job_name) == []
    backend.release(plan.job_name)


def test_a_retry_finds_and_reattaches_to_the_earlier_tries_volcano_job(
    cluster: tuple[KubeDouble, GangControllers], scripts: Scripts
) -> None:
    import dataclasses

    from airflow_mpi.runner.retries import resume_or_clean

    kube, _ = cluster

    def slow() -> Iterator[str]:
        time.sleep(1.0)
        yield "[1,0]<stdout>:done"

    scripts.on("-master-", PodScript(lines=slow, exit_code=0))
    first = make_plan(workers=1)
    volcano_backend(kube).create(first)  # then the first try's Airflow worker dies
    while not any(p["metadata"]["name"] == first.master.name for p in kube.list_objects("pods", "default")):
        time.sleep(0.05)
    retry = dataclasses.replace(first.identity, try_number=2)
    backend = volcano_backend(kube)
    adopted = resume_or_clean(backend, first.spec, retry)
    assert adopted is not None and adopted.job_name == first.job_name
    result = JobRunner(backend, adopted, Log()).run(adopted=True)
    assert result.exit_code == 0 and result.job_name == first.job_name
    assert nothing_left(kube, first.job_name) == []
