"""MPIJobTrigger: primitive serialization, its decisions (the shared state machine), a real watch
against the double, on_kill, and the deferrable operator's failure path under dag.test()."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from airflow_mpi.observe.status import PodTable
from airflow_mpi.triggers.mpi import MPIJobTrigger
from tests.airflow_helpers import task_states
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.k8s.conftest import Scripts, job_objects
from tests.k8s.test_kubernetes_backend import make_plan


def trigger(**changes: Any) -> MPIJobTrigger:
    fields: dict[str, Any] = {
        "job_name": "job-1",
        "namespace": "default",
        "kubernetes_conn_id": "kube_double",
        "wait_for": "ready",
        "deadline": time.time() + 30,
        "worker_pods": ["job-1-worker-0", "job-1-worker-1"],
        "master_pod": "job-1-master-0",
        "timeout": 30.0,
        "try_number": 2,
        "marks": {"created": 1.5},
    }
    fields.update(changes)
    return MPIJobTrigger(**fields)


def test_serialize_round_trip_with_primitives_only() -> None:
    from airflow.sdk.module_loading import import_string

    classpath, kwargs = trigger().serialize()
    assert json.loads(json.dumps(kwargs)) == kwargs  # primitives only
    again = import_string(classpath)(**kwargs)
    assert again.serialize() == (classpath, kwargs)


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
    ready = trigger()
    assert ready.decide(table(pod("job-1-worker-0", "worker", ready=True))) is None
    both = table(pod("job-1-worker-0", "worker", ready=True), pod("job-1-worker-1", "worker", ready=True))
    assert ready.decide(both) == {"status": "ready"}
    pulling = pod(
        "job-1-worker-1",
        "worker",
        phase="Pending",
        containerStatuses=[{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling"}}}],
    )
    failed = ready.decide(table(pod("job-1-worker-0", "worker", ready=True), pulling))
    assert failed is not None and failed["status"] == "failed" and failed["pod"] == "job-1-worker-1"
    late = trigger(deadline=time.time() - 1).decide(table(pod("job-1-worker-0", "worker", ready=True)))
    assert late is not None and late["status"] == "timeout"
    assert "job-1-worker-1.job-1: pod not ready" in late["reason"]
    finished = trigger(wait_for="finished").decide(
        table(
            pod("job-1-worker-0", "worker", ready=True),
            pod("job-1-worker-1", "worker", ready=True),
            pod("job-1-master-0", "master", phase="Succeeded"),
        )
    )
    assert finished == {"status": "finished"}


@pytest.mark.usefixtures("connections")
def test_run_watches_the_double_and_fires_once(double: KubeDouble, scripts: Scripts) -> None:
    # Import the async hook first (seconds, once), so the workers are still starting when the
    # trigger lists them, and it has to watch.
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook  # noqa: F401

    from airflow_mpi.backends.kubernetes import KubernetesBackend
    from tests.k8s.conftest import api_client_for

    scripts.on("-worker-", PodScript(start_delay=3.0))
    backend = KubernetesBackend(api_client=api_client_for(double), namespace="default")
    plan = make_plan(workers=2)
    backend.create(plan)
    try:
        fired = trigger(job_name=plan.job_name, worker_pods=[w.name for w in plan.workers], master_pod=plan.master.name)

        async def first_event() -> Any:
            async for event in fired.run():
                return event.payload

        payload = asyncio.run(first_event())
        assert payload["status"] == "ready" and payload["try_number"] == 2 and payload["marks"] == {"created": 1.5}
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
