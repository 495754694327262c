"""The Kubernetes backend against the API double over real HTTP: the happy path, every fault,
exact log streaming across drops and clock skew, and cleanup after each."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import JobFailed, JobTimeout, SshdNotReady
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.runner.job import JobResult, JobRunner
from airflow_mpi.spec import MPIJobSpec
from tests.doubles.kube_double import LEASES, KubeDouble, PodScript
from tests.k8s.conftest import Scripts, job_objects, unique


def make_plan(workers: int = 2, *, identity: RunIdentity | None = None, **fields: Any) -> JobPlan:
    """A job of an unmapped task (map index -1, as most are) unless ``identity`` says otherwise."""
    data: dict[str, Any] = {
        "name": "kjob",
        "image": "registry.example/train:1",
        "command": ["python", "/app/train.py"],
        "workers": {"replicas": workers},
    }
    data.update(fields)
    return render_plan(MPIJobSpec.from_dict(data), identity or RunIdentity("kdag", "train", unique("run")))


class Log(list[str]):
    def __call__(self, text: str) -> None:
        self.extend(text.splitlines())


def run(backend: KubernetesBackend, plan: JobPlan, log: Log | None = None) -> JobResult:
    return JobRunner(backend, plan, log if log is not None else Log()).run()


@pytest.mark.parametrize("map_index", [-1, 5], ids=["unmapped", "mapped"])
def test_happy_path_costs_n_plus_13_requests(
    backend: KubernetesBackend, double: KubeDouble, scripts: Scripts, map_index: int
) -> None:
    scripts.on(
        "-master-", PodScript(lines=lambda: iter(['[1,0]<stdout>:AIRFLOW_MPI_RESULT {"loss": 0.1}']), exit_code=0)
    )
    plan = make_plan(workers=3, identity=RunIdentity("kdag", "train", unique("run"), map_index))
    result = run(backend, plan)
    assert result.result == {"loss": 0.1} and result.np == 4
    # 13: besides the pods, the check, the objects, one watch and the teardown, the log mark's
    # Lease: created with the job, and asked for among the leftovers.
    assert len(double.requests) == 3 + 13, double.requests
    assert double.request_count("GET", "watch=True") == 1  # one watch, no polling
    # One permission check (the first request: before anything is created), once per namespace.
    assert double.requests[0] == ("POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews")
    run(backend, make_plan(workers=1))
    assert double.request_count("POST", "selfsubjectrulesreviews") == 1
    assert job_objects(double, plan.job_name) == []


@pytest.mark.parametrize("map_index", [-1, 0], ids=["unmapped", "mapped"])
def test_a_retry_finds_the_earlier_try_and_no_other_task_instances_job(
    backend: KubernetesBackend, double: KubeDouble, map_index: int
) -> None:
    run = unique("run")
    first = make_plan(identity=RunIdentity("kdag", "train", run, map_index, try_number=1))
    neighbour = make_plan(identity=RunIdentity("kdag", "train", run, 1 if map_index < 0 else -1, try_number=1))
    for plan in (first, neighbour):
        backend.create(plan)
    try:
        retry = RunIdentity("kdag", "train", run, map_index, try_number=2)
        found = backend.find_jobs(retry, "default")
        assert [(job.job_name, job.try_number) for job in found] == [(first.job_name, 1)]
    finally:
        for plan in (first, neighbour):
            backend.teardown(plan.job_name)
            backend.leftovers(plan.job_name)
    assert job_objects(double) == []


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
def test_every_manifest_sent_passes_strict_schema(backend: KubernetesBackend, double: KubeDouble, version: str) -> None:
    run(backend, make_plan(workers=2, pod={"shm_size": "1Gi", "tolerations": [{"key": "gpu", "operator": "Exists"}]}))
    bodies = [b for b in double.created if b.get("kind") != "Event"]
    assert [b["kind"] for b in bodies] == ["Service", "Secret", "ConfigMap", "Lease", "Pod", "Pod", "Pod"]
    for body in bodies:
        kubernetes_validate.validate(body, version, strict=True)


def test_owner_is_the_service(backend: KubernetesBackend, double: KubeDouble, scripts: Scripts) -> None:
    seen: dict[str, Any] = {}
    scripts.on("-master-", PodScript(lines=lambda: iter(["x"]), exit_code=0))
    plan = make_plan(workers=1)
    original = backend.start_master

    def start_master(job_name: str) -> None:
        original(job_name)
        seen.update(
            {
                f"{p}/{o['metadata']['name']}": o
                for p in ("pods", "secrets", "configmaps", LEASES)
                for o in double.list_objects(p, "default")
            }
        )
        seen["service"] = double.get("services", "default", job_name)

    backend.start_master = start_master  # type: ignore[method-assign]
    run(backend, plan)
    uid = seen.pop("service")["metadata"]["uid"]
    assert seen and all(o["metadata"]["ownerReferences"][0]["uid"] == uid for o in seen.values())
    assert f"{LEASES}/{plan.job_name}-log" in seen


def test_image_pull_error_fails_fast_with_the_pods_reason(
    backend: KubernetesBackend, double: KubeDouble, scripts: Scripts
) -> None:
    scripts.on("-worker-1", PodScript(image_error="ErrImagePull"))
    plan = make_plan(workers=2, startup_timeout=120)
    started = time.monotonic()
    with pytest.raises(JobFailed) as caught:
        run(backend, plan)
    assert time.monotonic() - started < 5
    assert caught.value.pod == f"{plan.job_name}-worker-1"
    assert "ErrImagePull" in str(caught.value) and "Failed to pull image" in str(caught.value)
    assert job_objects(double, plan.job_name) == []


def test_crash_looping_worker_fails_fast(backend: KubernetesBackend, double: KubeDouble, scripts: Scripts) -> None:
    scripts.on("-worker-0", PodScript(crash_loop=True))
    plan = make_plan(workers=1)
    with pytest.raises(JobFailed, match="CrashLoopBackOff"):
        run(backend, plan)
    assert job_objects(double, plan.job_name) == []


def test_unschedulable_past_startup_timeout_names_the_scheduler_message(
    backend: KubernetesBackend, double: KubeDouble, scripts: Scripts
) -> None:
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    scripts.on("-worker-0", PodScript(unschedulable=message))
    plan = make_plan(workers=2, startup_timeout=2)
    started = time.monotonic()
    with pytest.raises(SshdNotReady) as caught:
        run(backend, plan)
    assert 2 <= time.monotonic() - started < 2 + 5
    text = str(caught.value)
    assert "1 of 2 worker host(s)" in text and f"Unschedulable: {message}" in text
    assert job_objects(double, plan.job_name) == []


def test_worker_evicted_mid_run_ends_the_job(backend: KubernetesBackend, double: KubeDouble, scripts: Scripts) -> None:
    scripts.on("-worker-1", PodScript(evicted_after=1.0))
    scripts.on("-master-", PodScript(lines=lambda: iter(["[1,0]<stdout>:training"])))  # runs until deleted
    plan = make_plan(workers=2)
    started = time.monotonic()
    with pytest.raises(JobFailed) as caught:
        run(backend, plan)
    assert time.monotonic() - started < 1.0 + 5
    assert caught.value.pod == f"{plan.job_name}-worker-1" and "Evicted" in str(caught.value)
    assert job_objects(double, plan.job_name) == []  # the master was deleted too


def test_worker_oom_killed_mid_run(backend: KubernetesBackend, double: KubeDouble, scripts: Scripts) -> None:
    scripts.on("-worker-0", PodScript(fail_after=0.5, fail_reason="OOMKilled", fail_exit_code=137))
    scripts.on("-master-", PodScript(lines=lambda: iter(["[1,0]<stdout>:training"])))
    plan = make_plan(workers=1)
    with pytest.raises(JobFailed) as caught:
        run(backend, plan)
    assert "OOMKilled" in str(caught.value) and caught.value.exit_code == 137


def test_master_exit_3_names_the_rank(backend: KubernetesBackend, double: KubeDouble, scripts: Scripts) -> None:
    output = [
        "[1,1]<stderr>:ValueError: bad batch",
        "mpiexec detected that one or more processes exited with non-zero status, thus causing",
        "  Process name: [[36914,1],1]",
        "  Exit code:    3",
    ]
    scripts.on("-master-", PodScript(lines=lambda: iter(output), exit_code=3))
    plan = make_plan(workers=2)
    with pytest.raises(JobFailed) as caught:
        run(backend, plan)
    assert (caught.value.rank, caught.value.exit_code) == (1, 3)
    assert f"rank 1 on pod {plan.job_name}-worker-0 exited with code 3" in str(caught.value)
    assert job_objects(double, plan.job_name) == []


def test_timeout_kills_the_job(backend: KubernetesBackend, double: KubeDouble, scripts: Scripts) -> None:
    scripts.on("-master-", PodScript(lines=lambda: iter(["[1,0]<stdout>:forever"])))
    plan = make_plan(workers=1, timeout=2)
    started = time.monotonic()
    with pytest.raises(JobTimeout):
        run(backend, plan)
    assert time.monotonic() - started < 2 + 5
    assert job_objects(double, plan.job_name) == []


def numbered(count: int) -> Iterator[str]:
    for i in range(count):
        yield f"[1,{i % 3}]<stdout>:line {i:06d}"
        if i % 500 == 0:
            time.sleep(0.001)


@pytest.mark.parametrize("clock_offset", [0.0, 2.5, -2.5])
def test_log_stream_dropped_10_times_loses_and_repeats_nothing(
    backend: KubernetesBackend, double: KubeDouble, scripts: Scripts, clock_offset: float
) -> None:
    double.clock_offset = clock_offset
    double.drop_log_streams(after_lines=700, times=10)
    total = 12_000
    scripts.on("-master-", PodScript(lines=lambda: numbered(total), exit_code=0))
    log = Log()
    run(backend, make_plan(workers=2), log)
    printed = [f"[1,{i % 3}]<stdout>:line {i:06d}" for i in range(total)]
    shown = [line for line in log if "<stdout>:line" in line]
    assert shown == printed  # line by line: 0 duplicates, 0 lost, same order
    assert double.request_count("GET", "/log") == 11  # 1 + 10 resumes


def test_a_master_log_that_keeps_ending_while_the_pod_runs_still_times_out(
    backend: KubernetesBackend, double: KubeDouble, scripts: Scripts
) -> None:
    """Found on the real control plane: a kubelet that lost track of the master's container ends
    every log stream at once while the pod still says Running. Each reconnect must hand control
    back to the runner, or its timeout and worker checks never run again."""
    double.drop_log_streams(after_lines=0, times=10**6)
    scripts.on("-master-", PodScript(lines=lambda: iter(["[1,0]<stdout>:training"])))  # until deleted
    plan = make_plan(workers=1, timeout=2)
    outcome: list[BaseException] = []

    def go() -> None:
        try:
            run(backend, plan)
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=go, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the runner never got control back from the log follow"
    assert isinstance(outcome[0], JobTimeout) and time.monotonic() - started < 2 + 10, outcome
    assert job_objects(double, plan.job_name) == []


def test_api_500_on_create_is_retried(backend: KubernetesBackend, double: KubeDouble) -> None:
    double.fail_requests(method="POST", path="/pods$", status=500, count=2)
    double.fail_requests(method="POST", path="/services$", status=503, count=1)
    plan = make_plan(workers=2)
    result = run(backend, plan)
    assert result.exit_code == 0
    # The permission check, Service (+1 retry), Secret, ConfigMap, Lease, 2 workers + master (+2 retries)
    assert double.request_count("POST") == 1 + 2 + 1 + 1 + 1 + 3 + 2
    assert job_objects(double, plan.job_name) == []


def test_watch_expired_410_is_resumed_with_a_fresh_list(
    backend: KubernetesBackend, double: KubeDouble, scripts: Scripts
) -> None:
    scripts.on(
        "-master-",
        PodScript(
            lines=lambda: iter(["[1,0]<stdout>:a", "[1,0]<stdout>:b"]), exit_code=0, fail_after=None, start_delay=0.5
        ),
    )
    plan = make_plan(workers=2)
    timer = threading.Timer(0.2, double.expire_watches)
    timer.start()
    result = run(backend, plan)
    timer.join()
    assert result.exit_code == 0
    assert double.request_count("GET", "watch=True") >= 2  # watched again after the 410
    assert job_objects(double, plan.job_name) == []


def test_task_killed_removes_everything(backend: KubernetesBackend, double: KubeDouble, scripts: Scripts) -> None:
    scripts.on("-master-", PodScript(lines=lambda: iter(["[1,0]<stdout>:running"])))
    plan = make_plan(workers=2)
    log = Log()
    runner = JobRunner(backend, plan, log)
    errors: list[BaseException] = []

    def go() -> None:
        try:
            runner.run()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=go)
    thread.start()
    deadline = time.monotonic() + 10
    while not any("running" in line for line in log) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert runner.teardown() == []  # on_kill
    thread.join(10)
    assert not thread.is_alive()
    assert job_objects(double, plan.job_name) == []


def test_two_backfill_runs_side_by_side(backend: KubernetesBackend, double: KubeDouble, scripts: Scripts) -> None:
    scripts.on("-master-", PodScript(lines=lambda: iter(["[1,0]<stdout>:x"]), exit_code=0, start_delay=0.3))
    plans = [make_plan(workers=2) for _ in range(2)]
    results: list[Any] = [None, None]

    def go(i: int) -> None:
        results[i] = JobRunner(backend, plans[i], Log()).run()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert all(isinstance(r, JobResult) for r in results)
    assert plans[0].job_name != plans[1].job_name
    assert job_objects(double) == []


@pytest.mark.usefixtures("connections")
def test_sshd_sensor_on_kubernetes_knows_a_job_by_name(
    backend: KubernetesBackend, double: KubeDouble, scripts: Scripts
) -> None:
    from airflow_mpi.sensors.sshd import SshdReadySensor

    scripts.on("-worker-1", PodScript(unschedulable="0/2 nodes are available: 2 Insufficient cpu."))
    plan = make_plan(workers=2)
    backend.create(plan)
    try:
        sensor = SshdReadySensor(task_id="sshd", job_name=plan.job_name, mpi_conn_id="mpi_k8s")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(p.ok for p in sensor._last_probes):
            assert sensor.poke({}) is False  # type: ignore[arg-type]
            time.sleep(0.1)
        problems = {p.host: p for p in sensor._last_probes}
        assert problems[f"{plan.job_name}-worker-0.{plan.job_name}"].ok
        unready = problems[f"{plan.job_name}-worker-1.{plan.job_name}"]
        assert unready.problem.value == "pod not ready" and "Insufficient cpu" in unready.detail
    finally:
        backend.teardown(plan.job_name)
        backend.leftovers(plan.job_name)
