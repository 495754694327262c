"""MPIJobTrigger: primitive serialization, its decisions (the shared state machine), a real watch
against the double, on_kill, and the deferrable operator's failure path under dag.test()."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_mpi.events import WaitContract
from airflow_mpi.observe.status import PodTable
from airflow_mpi.triggers.mpi import MPIJobTrigger
from tests.airflow_helpers import task_states
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.k8s.conftest import Scripts, job_objects, unique
from tests.k8s.test_kubernetes_backend import make_plan


def trigger(**changes: Any) -> MPIJobTrigger:
    fields: dict[str, Any] = {
        "job_name": "job-1",
        "namespace": "default",
        "kubernetes_conn_id": "kube_double",
        "deadline": time.time() + 30,
        "worker_pods": ["job-1-worker-0", "job-1-worker-1"],
        "master_pod": "job-1-master-0",
        "timeout": 30.0,
        "try_number": 2,
        "marks": {"created": 1.5},
    }
    fields.update(changes)
    return MPIJobTrigger(contract={"api_timeout": 60.0, **fields})


def test_serialize_round_trip_with_primitives_only() -> None:
    from airflow.sdk.module_loading import import_string

    classpath, kwargs = trigger(custom_objects=[["kubeflow.org", "v2beta1", "mpijobs"]]).serialize()
    assert list(kwargs) == ["contract"]  # the wait, whole
    assert json.loads(json.dumps(kwargs)) == kwargs  # primitives only
    again = import_string(classpath)(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert again.contract == WaitContract.from_dict(kwargs["contract"])


def test_an_unknown_wait_field_is_refused_by_name() -> None:
    made = trigger()
    with pytest.raises(TypeError, match="unknown wait contract field"):
        MPIJobTrigger(contract={**made.contract.to_dict(), "surprise": 1})


def pod(name: str, role: str, *, phase: str = "Running", ready: bool = False, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "5", "labels": {"airflow-mpi.io/role": role}},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}], **status},
    }


def table(*pods: dict[str, Any]) -> PodTable:
    result = PodTable()
    result.replace(list(pods), "5")
    return result


def test_decisions() -> None:
    ready = trigger(startup_timeout=60.0)
    assert ready.decide(table(pod("job-1-worker-0", "worker", ready=True))) is None
    both = table(pod("job-1-worker-0", "worker", ready=True), pod("job-1-worker-1", "worker", ready=True))
    assert trigger().decide(both) is None  # every worker Ready: the master's end is waited for
    pulling = pod(
        "job-1-worker-1",
        "worker",
        phase="Pending",
        containerStatuses=[{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling"}}}],
    )
    failed = ready.decide(table(pod("job-1-worker-0", "worker", ready=True), pulling))
    assert failed is not None and failed["outcome"] == "pod_failed" and failed["pod"] == "job-1-worker-1"
    assert failed["starting"]  # before every worker was Ready
    late = trigger(deadline=time.time() - 5).decide(both)
    assert late is not None and late["outcome"] == "job_timeout"
    finished = trigger().decide(
        table(
            pod("job-1-worker-0", "worker", ready=True),
            pod("job-1-worker-1", "worker", ready=True),
            pod("job-1-master-0", "master", phase="Succeeded"),
        )
    )
    assert finished == {"outcome": "finished", "status": "finished"}


IMPORT_ON_A_LOOP = """
import asyncio, sys, time
from airflow_mpi.triggers.api_client import import_client
assert "kubernetes_asyncio.client" not in sys.modules
async def main():
    gaps, last = [0.0], time.monotonic()
    async def tick():
        nonlocal last
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now
    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)  # the ticker runs
    started = time.monotonic()
    await import_client()
    took = time.monotonic() - started
    await asyncio.sleep(0.05)  # the ticker sees the gap, if the import made one
    print(took, max(gaps))
    ticker.cancel()
asyncio.run(main())
"""


def test_the_async_client_is_imported_off_the_event_loop() -> None:
    # The first trigger of a triggerer imports kubernetes_asyncio: seconds, during which every
    # other trigger on that loop would stand still (Airflow warns above 0.2 s).
    run = subprocess.run([sys.executable, "-c", IMPORT_ON_A_LOOP], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    took, longest_gap = map(float, run.stdout.split())
    assert longest_gap < min(1.0, took / 2), (took, longest_gap)


def test_waiting_for_the_end_bounds_the_workers_start() -> None:
    one_ready = table(pod("job-1-worker-0", "worker", ready=True), pod("job-1-master-0", "master"))
    waiting = trigger(startup_timeout=60.0)
    assert waiting.decide(one_ready) is None  # within startup_timeout: the master's script waits too
    waiting.startup_deadline = time.time() - 1
    late = waiting.decide(one_ready)
    assert late is not None and late["outcome"] == "startup_timeout"
    assert late["reason"].splitlines() == [
        "1 of 2 worker host(s) did not accept ssh within 60s:",
        "  job-1-worker-1.job-1: pod not ready: the pod is not running yet [pod not running yet]",
    ]
    # Once every worker was Ready the bound is lifted: the job's own timeout rules from then on.
    started = trigger(startup_timeout=60.0)
    both = table(
        pod("job-1-worker-0", "worker", ready=True),
        pod("job-1-worker-1", "worker", ready=True),
        pod("job-1-master-0", "master"),
    )
    assert started.decide(both) is None and started.startup_deadline is None
    # Without the bound (a job whose workers were Ready before it deferred): nothing to time.
    assert trigger().startup_deadline is None


def ready_at(made: dict[str, Any], when: float) -> dict[str, Any]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
    made["status"]["conditions"][0]["lastTransitionTime"] = stamp
    return made


def test_the_timeout_counts_from_the_workers_ready_and_mpiexec_reports_first() -> None:
    """As the waiting path: ``timeout`` runs from mpiexec's start (the last worker Ready, read
    from the pods: a trigger started again elsewhere finds the same moment), and the job is
    ended TIMEOUT_GRACE past it, so that mpiexec's own --timeout report comes first."""
    from airflow_mpi.job.mpirun import TIMEOUT_GRACE

    now = time.time()
    deferred_at, ready = now - 100, now - 40  # sshd took 60 s of the 100 s timeout
    made = trigger(startup_timeout=120.0, timeout=100.0, deadline=deferred_at + 100)
    pods = table(
        ready_at(pod("job-1-worker-0", "worker", ready=True), ready - 5),
        ready_at(pod("job-1-worker-1", "worker", ready=True), ready),
        pod("job-1-master-0", "master"),
    )
    assert made.decide(pods) is None  # the timeout has 60 s to go, not 0
    assert abs(made.deadline - (ready + 100)) < 1.5
    assert abs(made._wake() - (ready + 100 + TIMEOUT_GRACE)) < 1.5
    made.deadline = time.time() - TIMEOUT_GRACE / 2
    assert made.decide(pods) is None  # mpiexec's own --timeout reports within the grace
    made.deadline = time.time() - TIMEOUT_GRACE - 0.1
    fired = made.decide(pods)
    assert fired is not None and fired["outcome"] == "job_timeout"


@pytest.mark.usefixtures("connections")
def test_a_deferrable_task_creates_the_job_whole_and_defers_once(double: KubeDouble) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_mpi.operators.mpi import MPIJobOperator

    job = {"name": "whole", "image": "registry.example/train:1", "command": ["python", "t.py"]}
    operator = MPIJobOperator(task_id="t", job={**job, "workers": {"replicas": 2}}, mpi_conn_id="mpi_k8s")
    operator.deferrable = True
    ti = SimpleNamespace(dag_id="d", task_id="t", run_id=unique("whole"), map_index=-1, try_number=1)
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute({"ti": ti})
    fired = deferred.value.trigger
    try:
        assert isinstance(fired, MPIJobTrigger)
        assert fired.contract.startup_timeout == 300
        assert fired.contract.master_log is not None  # the master's lines are followed from the start
        pods = [name for name in job_objects(double, fired.job_name) if name.startswith("pods/")]
        assert sorted(pods) == sorted(
            f"pods/{name}" for name in [fired.contract.master_pod, *fired.contract.worker_pods]
        )
    finally:
        asyncio.run(fired.on_kill())
        deadline = time.monotonic() + 10
        while job_objects(double, fired.job_name) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert job_objects(double, fired.job_name) == []


@pytest.mark.usefixtures("connections")
def test_run_watches_the_double_and_fires_once(double: KubeDouble, scripts: Scripts) -> None:
    # Import the async hook first (seconds, once), so the workers are still starting when the
    # trigger lists them, and it has to watch.
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook  # noqa: F401

    from airflow_mpi.backends.kubernetes import KubernetesBackend
    from tests.k8s.conftest import api_client_for

    scripts.on("-worker-", PodScript(start_delay=3.0))
    scripts.on("-master-", PodScript(start_delay=3.0, exit_code=0))
    backend = KubernetesBackend(api_client=api_client_for(double), namespace="default")
    plan = make_plan(workers=2)
    backend.create(plan)
    backend.start_master(plan.job_name)
    try:
        fired = trigger(job_name=plan.job_name, worker_pods=[w.name for w in plan.workers], master_pod=plan.master.name)

        async def first_event() -> Any:
            async for event in fired.run():
                return event.payload

        payload = asyncio.run(first_event())
        assert payload["outcome"] == "finished" and payload["try_number"] == 2 and payload["marks"] == {"created": 1.5}
        assert double.request_count("GET", "watch=True") >= 2, double.requests  # the backend's and the trigger's
    finally:
        backend.teardown(plan.job_name)
        backend.leftovers(plan.job_name)


@pytest.mark.usefixtures("connections")
def test_on_kill_deletes_the_job(double: KubeDouble) -> None:
    from airflow_mpi.backends.kubernetes import KubernetesBackend
    from tests.k8s.conftest import api_client_for

    backend = KubernetesBackend(api_client=api_client_for(double), namespace="default")
    plan = make_plan(workers=1)
    backend.create(plan)
    asyncio.run(trigger(job_name=plan.job_name).on_kill())
    deadline = time.monotonic() + 10
    while job_objects(double, plan.job_name) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job_objects(double, plan.job_name) == []
    backend._jobs[plan.job_name].watcher.stop()


@pytest.mark.usefixtures("connections")
def test_deferred_job_whose_worker_is_evicted_fails_and_is_removed(
    dagbag: Any, double: KubeDouble, scripts: Scripts, capfd: pytest.CaptureFixture[str]
) -> None:
    scripts.on("-worker-1", PodScript(evicted_after=1.0))
    scripts.on("-master-", PodScript(lines=lambda: iter(["[1,0]<stdout>:training"])))
    dag_run = dagbag.get_dag("mpi_test_k8s_deferred").test()
    assert task_states(dag_run) == {"train": "failed"}
    out = capfd.readouterr().out
    assert "worker-1 (worker) failed" in out and "Evicted" in out
    assert job_objects(double) == []
