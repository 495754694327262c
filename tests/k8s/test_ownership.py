"""One job never touches another, against the API double: a name another job holds is reported
naming both owners and nothing of that job is deleted; two Airflow deployments with the same run
ids in one namespace both finish; a retry removes the earlier try's job in the namespace that
try ran in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import JobNameTaken
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.kinds.manifests import render_manifests, secret_name
from airflow_mpi.operators.mpi import MPIJobOperator
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import MPIJobSpec
from tests.doubles.kube_double import KubeDouble, PodScript, ScriptedKubelet
from tests.doubles.mpijob_controller import MPIJobController
from tests.k8s.conftest import Scripts, api_client_for, install_connections, job_objects, unique
from tests.k8s.test_gang import _crd_validator
from tests.k8s.test_retries import CHILD, FileStore

SPEC: dict[str, Any] = {
    "name": "owned",
    "image": "registry.example/train:1",
    "command": ["python", "/app/train.py"],
    "workers": {"replicas": 2},
    "startup_timeout": 30,
}
OURS = RunIdentity("etl", "train", "scheduled__2026-12-05T00:00:00+00:00", deployment="staging")
THEIRS = RunIdentity("etl", "train", "scheduled__2026-12-05T00:00:00+00:00", deployment="production")


def plan_of(identity: RunIdentity, backend: KubernetesBackend | None = None) -> JobPlan:
    spec = MPIJobSpec.from_dict(SPEC)
    return backend.render_plan(spec, identity) if backend is not None else render_plan(spec, identity)


def uids(kube: KubeDouble, namespace: str = "default") -> dict[str, str]:
    return {
        f"{plural}/{o['metadata']['name']}": o["metadata"]["uid"]
        for plural in ("services", "secrets", "configmaps", "pods")
        for o in kube.list_objects(plural, namespace)
    }


def test_a_service_name_another_job_holds_is_reported_naming_both_and_left_alone(
    backend: KubernetesBackend, double: KubeDouble
) -> None:
    ours = plan_of(OURS)
    # Another deployment's job under this very name (as a hash collision, or an identity that
    # cannot be told apart, would put it): its Service and the Secret it owns.
    service, secret = render_manifests(plan_of(THEIRS), "default")[:2]
    service["metadata"]["name"], secret["metadata"]["name"] = ours.job_name, secret_name(ours.job_name)
    double.create("services", "default", service)
    double.create("secrets", "default", secret)
    before = uids(double)
    log: list[str] = []
    with pytest.raises(JobNameTaken) as caught:
        JobRunner(backend, ours, log.append).run()
    text = str(caught.value)
    assert f"Service {ours.job_name} in namespace default belongs to another job" in text
    assert "deployment 'production'" in text and "deployment 'staging'" in text  # both owners
    assert "run 'scheduled__2026-12-05T00:00:00+00:00', try 1" in text and "[mpi] deployment" in text
    assert uids(double) == before  # the other job's objects, the very same ones
    assert double.request_count("DELETE") == 0 and double.request_count("POST", "/pods") == 0
    assert not any("teardown" in note for note in getattr(caught.value, "__notes__", []))  # nothing "left"


def test_a_retried_post_answered_409_by_another_jobs_object_is_not_taken_for_ours(
    backend: KubernetesBackend, double: KubeDouble
) -> None:
    """The first POST of the Secret times out unseen, the retried one meets 409: the object there
    is taken as this job's only if it carries this try's owner labels."""
    from airflow_mpi.backends.core_objects import same_job

    ours = render_manifests(plan_of(OURS), "default")[1]
    theirs = render_manifests(plan_of(THEIRS), "default")[1]
    theirs["metadata"]["labels"]["airflow-mpi.io/job"] = ours["metadata"]["labels"]["airflow-mpi.io/job"]
    assert same_job(ours, ours)
    assert not same_job(theirs, ours)  # the same job label, another owner


@pytest.fixture
def mpijob_cluster(scripts: Scripts, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeDouble]:
    kube = KubeDouble(ScriptedKubelet(scripts))
    controller = MPIJobController(kube)
    kube.custom_validator = _crd_validator
    kube.start()
    install_connections(monkeypatch, kube, mpi_conn_id="mpi_mpijob", backend="mpijob")
    yield kube
    controller.stop()
    kube.stop()


def test_an_mpijob_another_job_holds_is_reported_and_neither_deleted_nor_adopted(
    mpijob_cluster: KubeDouble,
) -> None:
    kube = mpijob_cluster
    backend = KubernetesBackend(kind="mpijob", api_client=api_client_for(kube), namespace="default")
    ours, theirs = plan_of(OURS, backend), plan_of(THEIRS, backend)
    top = backend.kind.render(theirs, "default")[0]
    top["metadata"]["name"] = ours.job_name
    kube.create("mpijobs.kubeflow.org", "default", top)
    uid = kube.get("mpijobs.kubeflow.org", "default", ours.job_name)["metadata"]["uid"]  # type: ignore[index]
    with pytest.raises(JobNameTaken, match=r"MPIJob .* belongs to another job .*'production'.*'staging'"):
        JobRunner(backend, ours, [].append).run()
    still = kube.get("mpijobs.kubeflow.org", "default", ours.job_name)
    assert still is not None and still["metadata"]["uid"] == uid and "deletionTimestamp" not in still["metadata"]
    assert kube.request_count("DELETE") == 0
    kube.delete("mpijobs.kubeflow.org", "default", ours.job_name)


def slow_master(steps: int) -> PodScript:
    def lines() -> Iterator[str]:
        for i in range(steps):
            yield f"[1,0]<stdout>:step {i}"
            time.sleep(0.05)
        yield '[1,0]<stdout>:AIRFLOW_MPI_RESULT {"done": true}'

    return PodScript(lines=lines, exit_code=0)


@pytest.mark.usefixtures("connections")
def test_two_deployments_with_the_same_run_ids_in_one_namespace_both_finish(
    double: KubeDouble, scripts: Scripts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staging's job runs on while production's, with the same DAG, task and run id, starts and
    finishes beside it in the same namespace; then staging's finishes too."""
    staging_job = plan_of(OURS).job_name
    scripts.on("-master-", slow_master(5))
    scripts.on(f"{staging_job}-master-", slow_master(200))  # 10 s: still running when production ends
    ti = SimpleNamespace(dag_id=OURS.dag_id, task_id=OURS.task_id, run_id=OURS.run_id, try_number=1)
    results: dict[str, Any] = {}

    def staging() -> None:
        operator = MPIJobOperator(task_id="train", job=SPEC, mpi_conn_id="mpi_k8s")
        results["staging"] = operator.execute({"ti": ti})  # type: ignore[arg-type]

    monkeypatch.setenv("AIRFLOW__MPI__DEPLOYMENT", "staging")
    first = threading.Thread(target=staging)
    first.start()
    deadline = time.monotonic() + 60
    while double.get("pods", "default", f"{staging_job}-master-0") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    monkeypatch.setenv("AIRFLOW__MPI__DEPLOYMENT", "production")
    production = MPIJobOperator(task_id="train", job=SPEC, mpi_conn_id="mpi_k8s")
    results["production"] = production.execute({"ti": ti})  # type: ignore[arg-type]
    assert first.is_alive() and double.get("services", "default", staging_job) is not None
    first.join(120)
    assert results["staging"]["job_name"] == staging_job
    assert results["production"]["job_name"] == plan_of(THEIRS).job_name
    assert results["staging"]["result"] == results["production"]["result"] == {"done": True}
    assert job_objects(double) == []


def test_a_retry_removes_the_earlier_tries_job_in_the_namespace_that_try_ran_in(
    double: KubeDouble, scripts: Scripts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first try's spec put the job in team-a (a pod.namespace template rendered so then);
    the retry's spec renders to the connection's namespace. The first try recorded team-a in the
    task's state store: the retry removes its job there, then runs its own."""
    install_connections(monkeypatch, double)
    double.create_namespace("team-a")
    scripts.on("-worker-", PodScript(start_delay=0.3))
    scripts.on("-master-", slow_master(5))
    run_id, store = unique("moved"), tmp_path / "store.json"
    first_spec = {**SPEC, "pod": {"namespace": "team-a"}}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(first_spec), run_id, str(store), str(Path(__file__).parent), "-1"],
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120  # the child imports Airflow
    while double.request_count("POST", "/pods") < 2 and time.monotonic() < deadline:
        assert child.poll() is None, "the first try ended by itself"
        time.sleep(0.02)
    child.kill()  # a worker that dies: no finally, the job stays (without its master)
    child.wait()
    assert FileStore(str(store)).get("airflow_mpi")["namespace"] == "team-a"
    assert [o["metadata"]["name"] for o in double.list_objects("services", "team-a")]
    operator = MPIJobOperator(task_id="train", job=SPEC, mpi_conn_id="mpi_k8s")
    ti = SimpleNamespace(dag_id="kdag", task_id="train", run_id=run_id, map_index=-1, try_number=2)
    result = operator.execute({"ti": ti, "task_state_store": FileStore(str(store))})  # type: ignore[arg-type]
    assert result["result"] == {"done": True}
    assert uids(double, "team-a") == {}  # the earlier try's job, removed where it ran
    assert job_objects(double) == []
