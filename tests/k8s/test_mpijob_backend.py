"""The MPIJob backend end to end against the API double and its mpi-operator controller: the job
succeeds, a rank failure, an evicted worker and a timeout end it naming the cause, a job Kueue
holds suspended is queued (not stuck), a job the controller refuses or never sees fails at once,
a retry after the Airflow worker died reattaches to the running MPIJob, and nothing is left."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import JobFailed, JobTimeout, LaunchError
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.kinds.mpijob import MPIJOB
from airflow_mpi.runner.job import JobResult, JobRunner
from airflow_mpi.spec import MPIJobSpec
from tests.airflow_helpers import task_states, xcom
from tests.doubles.kube_double import LEASES, KubeDouble, PodScript, ScriptedKubelet
from tests.doubles.mpijob_controller import MPIJobController
from tests.k8s.conftest import Scripts, api_client_for, install_connections, unique
from tests.k8s.test_gang import _crd_validator

NS = "default"
# Every kind an MPIJob makes: ours, the controller's, the launcher Job.
LEFT_KINDS = ("pods", "services", "secrets", "configmaps", LEASES, "jobs.batch", "mpijobs.kubeflow.org")
LAUNCHER = "-launcher-"


@pytest.fixture
def cluster(scripts: Scripts, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[KubeDouble, MPIJobController]]:
    kube = KubeDouble(ScriptedKubelet(scripts))
    controller = MPIJobController(kube)
    kube.custom_validator = _crd_validator
    kube.start()
    install_connections(monkeypatch, kube, mpi_conn_id="mpi_mpijob", backend="mpijob")
    yield kube, controller
    controller.stop()
    kube.stop()


@pytest.fixture
def backend(cluster: tuple[KubeDouble, MPIJobController]) -> KubernetesBackend:
    return KubernetesBackend(kind="mpijob", api_client=api_client_for(cluster[0]), namespace=NS)


def left(kube: KubeDouble) -> list[str]:
    return [f"{plural}/{o['metadata']['name']}" for plural in LEFT_KINDS for o in kube.list_objects(plural, NS)]


def make_plan(backend: KubernetesBackend, workers: int = 2, *, try_number: int = 1, **fields: Any) -> JobPlan:
    data: dict[str, Any] = {
        "name": "mj",
        "image": "registry.example/train:1",
        "command": ["python", "/app/train.py"],
        "workers": {"replicas": workers},
        "startup_timeout": 20,
    }
    data.update(fields)
    identity = RunIdentity("mdag", "train", unique("run"), try_number=try_number)
    return backend.render_plan(MPIJobSpec.from_dict(data), identity)


def run(backend: KubernetesBackend, plan: JobPlan, log: list[str] | None = None) -> JobResult:
    return JobRunner(backend, plan, (log if log is not None else []).append).run()


def hello(*extra: str, exit_code: int = 0, delay: float = 0.0) -> PodScript:
    return PodScript(lines=lambda: iter(["[1,0]<stdout>:hello", *extra]), exit_code=exit_code, start_delay=delay)


def test_a_job_succeeds_and_nothing_is_left(
    backend: KubernetesBackend, cluster: tuple[KubeDouble, MPIJobController], scripts: Scripts
) -> None:
    kube, controller = cluster
    scripts.on(LAUNCHER, hello('[1,0]<stdout>:AIRFLOW_MPI_RESULT {"loss": 0.1}'))
    plan = make_plan(backend, workers=2)
    log: list[str] = []
    result = run(backend, plan, log)
    assert result.exit_code == 0 and result.result == {"loss": 0.1}
    assert any("hello" in line for line in log)
    assert kube.request_count("POST", "/mpijobs") == 1
    # The controller made the launcher Job, the Service and its own objects, without a warning.
    job = plan.job_name
    for done in (f"create jobs.batch/{job}-launcher", f"create secrets/{job}-ssh", f"create services/{job}"):
        assert f"{job}: {done}" in controller.log, "\n".join(controller.log)
    assert not [line for line in controller.log if "Warning" in line], controller.log
    assert left(kube) == []


def test_a_rank_failure_names_the_rank_and_its_pod(
    backend: KubernetesBackend, cluster: tuple[KubeDouble, MPIJobController], scripts: Scripts
) -> None:
    output = (
        "[1,1]<stderr>:ValueError: bad batch",
        "mpiexec detected that one or more processes exited with non-zero status, thus causing",
        "  Process name: [[36914,1],1]",
        "  Exit code:    3",
    )
    scripts.on(LAUNCHER, PodScript(lines=lambda: iter(output), exit_code=3))
    plan = make_plan(backend, workers=2)
    with pytest.raises(JobFailed) as caught:
        run(backend, plan)
    assert (caught.value.rank, caught.value.exit_code) == (1, 3)
    assert f"rank 1 on pod {plan.job_name}-worker-0 exited with code 3" in str(caught.value)
    assert left(cluster[0]) == []


def test_an_evicted_worker_ends_the_job_naming_it(
    backend: KubernetesBackend, cluster: tuple[KubeDouble, MPIJobController], scripts: Scripts
) -> None:
    kube, controller = cluster
    scripts.on(LAUNCHER, PodScript(lines=lambda: iter(["[1,0]<stdout>:training"])))  # runs until ended
    plan = make_plan(backend, workers=2)
    runner = JobRunner(backend, plan, [].append)
    runner.create()
    runner.wait_ready()
    runner.start_master()
    threading.Timer(0.5, controller.evict_worker, (NS, plan.job_name, 1)).start()
    with pytest.raises(JobFailed) as caught:
        runner.finish()
    runner.teardown(caught.value)
    assert f"{plan.job_name}-worker-1" in str(caught.value) and "Evicted" in str(caught.value)
    assert left(kube) == []


def test_a_job_past_its_timeout_ends_naming_the_timeout(
    backend: KubernetesBackend, cluster: tuple[KubeDouble, MPIJobController], scripts: Scripts
) -> None:
    scripts.on(LAUNCHER, PodScript(lines=lambda: iter(["[1,0]<stdout>:still going"])))  # never ends by itself
    plan = make_plan(backend, workers=1, timeout=2)
    started = time.monotonic()
    with pytest.raises(JobTimeout) as caught:
        run(backend, plan)
    assert "ran past its timeout of 2s" in str(caught.value)
    assert time.monotonic() - started < 30
    assert left(cluster[0]) == []


def test_a_suspended_mpijob_is_queued_until_resumed(
    backend: KubernetesBackend,
    cluster: tuple[KubeDouble, MPIJobController],
    scripts: Scripts,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kueue submits an MPIJob suspended and resumes it once admitted: until then no pod exists
    and the task says it waits for admission, whatever startup_timeout says."""
    import airflow_mpi.kinds.mpijob as module

    kube, _ = cluster
    scripts.on(LAUNCHER, hello())
    original = module.render_mpijob_manifests

    def suspended(plan: JobPlan, namespace: str, **kwargs: Any) -> list[dict[str, Any]]:
        objects = original(plan, namespace, **kwargs)
        objects[0]["spec"]["runPolicy"]["suspend"] = True  # what Kueue's webhook does to a queued MPIJob
        return objects

    monkeypatch.setattr(module, "render_mpijob_manifests", suspended)
    plan = make_plan(backend, workers=1, startup_timeout=1, scheduling={"gang": "kueue", "queue": "training"})
    log: list[str] = []
    runner = JobRunner(backend, plan, log.append)
    runner.create()
    time.sleep(0.5)
    assert kube.list_objects("pods", NS) == []
    assert "suspended in queue 'training'" in (backend.queue_status(plan.job_name) or "")
    # Ours, created before the MPIJob (its pods must find them), are owned by it now.
    uid = kube.list_objects("mpijobs.kubeflow.org", NS)[0]["metadata"]["uid"]
    for plural, name in (
        ("secrets", f"{plan.job_name}-airflow-ssh"),
        ("configmaps", f"{plan.job_name}-airflow-config"),
    ):
        owners = kube.get(plural, NS, name)["metadata"]["ownerReferences"]
        assert [(o["kind"], o["uid"], o["controller"]) for o in owners] == [("MPIJob", uid, True)]
    threading.Timer(2.5, _set_suspend, (kube, plan.job_name, False)).start()
    runner.wait_ready()  # past startup_timeout (1 s) while suspended: queued, not stuck
    runner.start_master()
    result = runner.finish()
    runner.teardown()
    assert result.exit_code == 0
    assert any("waits for admission" in line and "suspended" in line for line in log), log
    assert left(kube) == []


def _set_suspend(kube: KubeDouble, name: str, suspend: bool) -> None:
    api = api_client_for(kube)
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    for _ in range(50):
        job = custom.get_namespaced_custom_object(*MPIJOB[:2], NS, MPIJOB[2], name)
        job["spec"]["runPolicy"]["suspend"] = suspend
        try:
            custom.replace_namespaced_custom_object(*MPIJOB[:2], NS, MPIJOB[2], name, job)
            return
        except client.ApiException as error:
            if error.status != 409:
                raise
    raise AssertionError(f"MPIJob {name} kept changing")


def test_an_mpijob_the_controller_refuses_fails_with_its_event(
    backend: KubernetesBackend, cluster: tuple[KubeDouble, MPIJobController], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spec the controller rejects gets only a ValidationError event: the task fails with it at
    once instead of waiting for pods that never come."""
    import airflow_mpi.kinds.mpijob as module

    original = module.render_mpijob_manifests

    def with_two_launchers(plan: JobPlan, namespace: str, **kwargs: Any) -> list[dict[str, Any]]:
        objects = original(plan, namespace, **kwargs)
        objects[0]["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"] = 2  # the schema allows it
        return objects

    monkeypatch.setattr(module, "render_mpijob_manifests", with_two_launchers)
    plan = make_plan(backend, workers=1)
    with pytest.raises(LaunchError, match="ValidationError"):
        run(backend, plan)
    assert left(cluster[0]) == []


def test_no_controller_fails_after_the_grace_instead_of_waiting_forever(
    backend: KubernetesBackend, cluster: tuple[KubeDouble, MPIJobController], monkeypatch: pytest.MonkeyPatch
) -> None:
    import airflow_mpi.kinds.controller as module

    cluster[1].stop()
    monkeypatch.setattr(module, "CONTROLLER_GRACE", 1.0)
    plan = make_plan(backend, workers=1)
    with pytest.raises(LaunchError, match="mpi-operator has not acted on it"):
        run(backend, plan)
    assert left(cluster[0]) == []


def test_a_retry_after_the_worker_died_reattaches_to_the_running_mpijob(
    cluster: tuple[KubeDouble, MPIJobController], scripts: Scripts
) -> None:
    from airflow_mpi.operators.mpi import MPIJobOperator, deployment_identity

    kube, _ = cluster
    gate = threading.Event()

    def slow() -> Iterator[str]:
        for i in range(40):
            yield f"[1,0]<stdout>:step {i:02d}"
            if i == 10:
                gate.wait(30)
        yield '[1,0]<stdout>:AIRFLOW_MPI_RESULT {"steps": 40}'

    scripts.on(LAUNCHER, PodScript(lines=slow, exit_code=0))
    spec = {
        "name": "mjr",
        "image": "registry.example/train:1",
        "command": ["python", "/app/train.py"],
        "workers": {"replicas": 2},
        "startup_timeout": 20,
    }
    run_id = unique("crash")
    # The first try: created the MPIJob and streamed part of the log, then its process died
    # (nothing of it runs on; the MPIJob does).
    first = KubernetesBackend(kind="mpijob", api_client=api_client_for(kube), namespace=NS)
    # The same deployment as the operator's retry below: a try of this Airflow's.
    identity = RunIdentity("mdag", "train", run_id, try_number=1, deployment=deployment_identity())
    plan = first.render_plan(MPIJobSpec.from_dict(spec), identity)
    runner = JobRunner(first, plan, [].append)
    runner.create()
    runner.wait_ready()
    first.release(plan.job_name)
    assert kube.list_objects("mpijobs.kubeflow.org", NS)
    operator = MPIJobOperator(task_id="train", job=spec, mpi_conn_id="mpi_mpijob")
    ti = SimpleNamespace(dag_id="mdag", task_id="train", run_id=run_id, map_index=-1, try_number=2)
    gate.set()
    result = operator.execute({"ti": ti})  # type: ignore[arg-type]
    assert result["job_name"] == plan.job_name and result["result"] == {"steps": 40}
    assert kube.request_count("POST", "/mpijobs") == 1  # reattached: no second MPIJob
    assert left(kube) == []


def test_jobs_succeed_through_airflow_waiting_and_deferred_in_host_and_hostfile_mode(
    dagbag: Any, cluster: tuple[KubeDouble, MPIJobController], scripts: Scripts
) -> None:
    kube, _ = cluster
    scripts.on(LAUNCHER, hello('[1,0]<stdout>:AIRFLOW_MPI_RESULT {"ok": true}'))
    dag_run = dagbag.get_dag("mpi_test_mpijob").test()
    states = task_states(dag_run)
    assert states == dict.fromkeys(
        ("host_waiting", "hostfile_waiting", "host_deferred", "hostfile_deferred"), "success"
    )
    for task_id in states:
        result = xcom(dag_run, task_id)
        assert result["exit_code"] == 0 and result["result"] == {"ok": True}, (task_id, result)
    assert kube.request_count("POST", "/mpijobs") == 4
    assert left(kube) == []


def test_the_launcher_jobs_deadline_ends_the_task_with_the_mpijobs_reason(
    backend: KubernetesBackend,
    cluster: tuple[KubeDouble, MPIJobController],
    scripts: Scripts,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past ``runPolicy.activeDeadlineSeconds`` the launcher Job deletes its pod: the task names
    the MPIJob's Failed reason, not just a deleted pod."""
    import airflow_mpi.kinds.mpijob as module

    original = module.render_mpijob_manifests

    def short_deadline(plan: JobPlan, namespace: str, **kwargs: Any) -> list[dict[str, Any]]:
        objects = original(plan, namespace, **kwargs)
        objects[0]["spec"]["runPolicy"]["activeDeadlineSeconds"] = 2
        return objects

    monkeypatch.setattr(module, "render_mpijob_manifests", short_deadline)
    scripts.on(LAUNCHER, PodScript(lines=lambda: iter(["[1,0]<stdout>:still going"])))  # never ends by itself
    plan = make_plan(backend, workers=1, timeout=60)
    with pytest.raises(JobFailed) as caught:
        run(backend, plan)
    assert "MPIJob failed: DeadlineExceeded" in str(caught.value)
    assert left(cluster[0]) == []


def test_a_sensor_in_another_task_finds_the_job_by_name(
    backend: KubernetesBackend, cluster: tuple[KubeDouble, MPIJobController], scripts: Scripts
) -> None:
    """``SshdReadySensor`` asks a backend that did not create the job (by its name alone)."""
    from airflow_mpi.runner.waits import check_sshd_once

    kube, _ = cluster
    scripts.on(LAUNCHER, PodScript(lines=lambda: iter(["[1,0]<stdout>:training"])))
    plan = make_plan(backend, workers=2)
    runner = JobRunner(backend, plan, [].append)
    runner.create()
    try:
        runner.wait_ready()
        other = KubernetesBackend(kind="mpijob", api_client=api_client_for(kube), namespace=NS)
        report = check_sshd_once(other, plan.job_name)
        other.release(plan.job_name)
        assert report.ready and report.failure is None
        assert sorted(probe.host for probe in report.probes) == [
            f"{plan.job_name}-worker-{i}.{plan.job_name}" for i in range(2)
        ]
    finally:
        runner.teardown()
    assert left(kube) == []


def test_a_create_that_fails_after_the_secret_leaves_no_secret(
    backend: KubernetesBackend, cluster: tuple[KubeDouble, MPIJobController]
) -> None:
    """Our Secret is created owned by the MPIJob, right after it; the ConfigMap refused next, the
    create deletes the MPIJob and the Secret itself (it never waits for the garbage collector)."""
    kube, _ = cluster
    plan = make_plan(backend, workers=1)
    kube.fail_requests(method="POST", path=r"/configmaps$", status=422, count=1)
    with pytest.raises(LaunchError):
        backend.create(plan)
    posts = [path for method, path in kube.requests if method == "POST"]
    secret_at = next(i for i, path in enumerate(posts) if path.endswith("/secrets"))
    mpijob_at = next(i for i, path in enumerate(posts) if path.endswith("/mpijobs"))
    assert mpijob_at < secret_at, posts  # never a Secret that nothing owns
    ours = [s["metadata"]["name"] for s in kube.list_objects("secrets", NS) if plan.job_name in s["metadata"]["name"]]
    assert ours == [], left(kube)
