"""Every wait ends: the API server refusing (401, 403 on each verb the job uses, a namespace that
does not exist) or not answering (connection refused, a server that accepts and never replies)
ends a Kubernetes job within its bound, waiting and deferred, with a message that says what to
change, and nothing is left where cleanup is possible. Each test records its fault-table row.

The operator runs as Airflow would run it: ``execute``, and for a deferral the trigger (after a
serialize round trip) driven by asyncio, then the method it names on a fresh operator.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import BackendRequestFailed, BackendUnreachable, LaunchError
from airflow_mpi.operators.mpi import MPIJobOperator
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.faults import FaultRow
from tests.k8s.conftest import Scripts, first_trigger_event, install_connections, job_objects, unique

API_TIMEOUT = 3.0  # the connection's api_timeout in these tests
SLACK = 3.0  # scheduling on a loaded 2-core machine, and one back-off step
REFUSAL_BOUND = 5.0  # a refusal ends the task at once: well under any bound
MODES = ("waiting", "deferrable")
SPEC: dict[str, Any] = {
    "name": "faulty",
    "image": "registry.example/train:1",
    "command": ["python", "/app/train.py"],
    "workers": {"replicas": 2},
    "startup_timeout": 60,  # far past the API bound: the bound must be what ends the wait
    "timeout": 120,
}
TRAINING = PodScript(lines=lambda: iter(["[1,0]<stdout>:training"]))  # runs until deleted
FINISHES = PodScript(lines=lambda: iter(["[1,0]<stdout>:done"]), exit_code=0)

pytestmark = pytest.mark.fault


TEARDOWNS: list[float] = []  # when each teardown began: the moment a failure was detected


@pytest.fixture(scope="module", autouse=True)
def _imported() -> None:
    """What a task process has imported before it runs: the seconds measured are the fault's."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook, KubernetesHook  # noqa: F401
    from kubernetes_asyncio.client import CoreV1Api  # noqa: F401


@pytest.fixture(autouse=True)
def _connections(double: KubeDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    install_connections(monkeypatch, double, api_timeout=API_TIMEOUT)
    original = KubernetesBackend.teardown

    def teardown(self: KubernetesBackend, job_name: str) -> None:
        TEARDOWNS.append(time.monotonic())
        original(self, job_name)

    TEARDOWNS.clear()
    monkeypatch.setattr(KubernetesBackend, "teardown", teardown)


@dataclass
class Task:
    """One task instance run to its end: its state, error, and when the fault took effect."""

    state: str = "running"
    error: BaseException | None = None
    fault_at: float = 0.0
    ended_at: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)
    event_times: list[float] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        """From the fault to its detection: a trigger's error event, else the teardown that the
        failure started (a bounded teardown may then take longer), else the task's end."""
        ends = ("failed", "timeout", "error")
        errors = [at for at, e in zip(self.event_times, self.events, strict=True) if e["status"] in ends]
        detected = [at for at in (*errors, *TEARDOWNS) if at >= self.fault_at]
        return min(detected, default=self.ended_at) - self.fault_at

    @property
    def message(self) -> str:
        return str(self.error) if self.error is not None else ""


def run_task(
    mode: str,
    spec: dict[str, Any] | None = None,
    *,
    on_deferred: Callable[[Task, Any], None] | None = None,
    on_event: Callable[[Task, dict[str, Any]], None] | None = None,
) -> Task:
    """The task, as Airflow runs it: ``fault_at`` is its start unless a hook moves it."""
    task = Task(fault_at=time.monotonic())
    ti = SimpleNamespace(dag_id="faults", task_id="train", run_id=unique("run"), map_index=-1, try_number=1)
    context: Any = {"ti": ti}

    def operator() -> MPIJobOperator:
        return MPIJobOperator(
            task_id="train", job=spec or SPEC, mpi_conn_id="mpi_k8s", deferrable=mode == "deferrable", reattach=False
        )

    try:
        try:
            operator().execute(context)
        except TaskDeferred as deferred:
            pending = deferred
            while True:
                if on_deferred is not None:
                    on_deferred(task, pending.trigger)
                event = first_trigger_event(pending.trigger)
                task.events.append(event)
                task.event_times.append(time.monotonic())
                if on_event is not None:
                    on_event(task, event)
                try:
                    getattr(operator(), pending.method_name)(context, event)
                    break
                except TaskDeferred as again:
                    pending = again
        task.state = "success"
    except Exception as error:
        task.state, task.error = "failed", error
    task.ended_at = time.monotonic()
    return task


def settled_objects(double: KubeDouble, seconds: float = 5.0) -> list[str]:
    """The job objects still there once the garbage collector has had ``seconds``."""
    deadline = time.monotonic() + seconds
    while job_objects(double) and time.monotonic() < deadline:
        time.sleep(0.05)
    return job_objects(double)


def record(fault_row: FaultRow, double: KubeDouble, fault: str, mode: str, task: Task) -> list[str]:
    left = settled_objects(double)
    fault_row(fault, "kubernetes", mode, task.state, task.seconds, task.message, left)
    return left


def when_master_runs(double: KubeDouble, then: Callable[[], None], task: Task) -> threading.Thread:
    """Call ``then`` (the fault) once the master pod is Running; ``task.fault_at`` is that moment."""

    def wait() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            masters = [p for p in double.list_objects("pods", "default") if "-master-" in p["metadata"]["name"]]
            if masters and masters[0].get("status", {}).get("phase") == "Running":
                break
            time.sleep(0.02)
        task.fault_at = time.monotonic()
        then()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def outage_then_back(double: KubeDouble, start: Callable[[], None], end: Callable[[], None]) -> Callable[[], None]:
    """The API goes down now and comes back past the bound, so the task fails first and its
    teardown (bounded too) can still delete the job."""

    def go() -> None:
        start()
        threading.Timer(API_TIMEOUT + 1.5, end).start()

    return go


# --- 403: the Role lacks a verb ----------------------------------------------------------------
# Each request's own 403, as a cluster whose rules review cannot tell in advance (a webhook
# authorizer) answers it; the check before create that a complete review allows is proven on the
# real control plane (tests/cluster/test_security_real.py).


def deny_unreviewed(double: KubeDouble, verb: str, resource: str) -> None:
    double.rules_review_incomplete = True
    double.deny(verb, resource)


@pytest.mark.parametrize("mode", MODES)
def test_403_on_create_pods(mode: str, double: KubeDouble, fault_row: FaultRow) -> None:
    deny_unreviewed(double, "create", "pods")
    task = run_task(mode)
    assert task.state == "failed" and isinstance(task.error, LaunchError)
    assert task.message == (
        "the service account airflow/airflow-worker cannot `create` `pods` in namespace default (403 Forbidden): "
        "add `create` on `pods` to the Role bound to it; see docs/guides/rbac.md"
    )
    assert task.seconds < REFUSAL_BOUND
    assert task.events == []  # failed before any deferral
    assert record(fault_row, double, "403 create pods", mode, task) == []


@pytest.mark.parametrize("mode", MODES)
def test_403_on_watch_pods(mode: str, double: KubeDouble, scripts: Scripts, fault_row: FaultRow) -> None:
    deny_unreviewed(double, "watch", "pods")
    # Not started at the first list (the master starts with the workers): the trigger must watch.
    scripts.on("-worker-", PodScript(start_delay=1.0))
    scripts.on("-master-", PodScript(start_delay=1.0))
    task = run_task(mode)
    assert task.state == "failed" and isinstance(task.error, BackendRequestFailed)
    assert "cannot `watch` `pods` in namespace default (403 Forbidden)" in task.message
    assert "see docs/guides/rbac.md" in task.message
    assert task.seconds < REFUSAL_BOUND
    if mode == "deferrable":
        assert [e["status"] for e in task.events] == ["error"]  # the trigger's own watch was refused
    assert record(fault_row, double, "403 watch pods", mode, task) == []


@pytest.mark.parametrize("mode", MODES)
def test_403_on_list_pods(mode: str, double: KubeDouble, scripts: Scripts, fault_row: FaultRow) -> None:
    deny_unreviewed(double, "list", "pods")
    if mode == "waiting":
        # The backend watches from the Service's version and lists only when the watch expires
        # (etcd compaction does that every few minutes): provoke the relist mid-training.
        scripts.on("-master-", TRAINING)
        task_box: list[Task] = [Task()]
        waiter = when_master_runs(double, double.expire_watches, task_box[0])
        task = run_task(mode)
        waiter.join()
        task.fault_at = task_box[0].fault_at
    else:
        task = run_task(mode)  # the trigger lists first
    assert task.state == "failed"
    assert "cannot `list` `pods` in namespace default (403 Forbidden)" in task.message
    assert task.seconds < REFUSAL_BOUND
    assert record(fault_row, double, "403 list pods", mode, task) == []


@pytest.mark.parametrize("mode", MODES)
def test_403_on_the_masters_log(mode: str, double: KubeDouble, scripts: Scripts, fault_row: FaultRow) -> None:
    deny_unreviewed(double, "get", "pods/log")
    scripts.on("-master-", FINISHES if mode == "deferrable" else TRAINING)
    task = run_task(mode)
    assert task.state == "failed" and isinstance(task.error, BackendRequestFailed)
    assert task.message == (
        "the service account airflow/airflow-worker cannot `get` `pods/log` in namespace default (403 Forbidden): "
        "add `get` on `pods/log` to the Role bound to it; see docs/guides/rbac.md"
    )
    assert task.seconds < REFUSAL_BOUND + 2  # the whole job up to the master's first line
    assert record(fault_row, double, "403 get pods/log", mode, task) == []


# --- 401: credentials refused ------------------------------------------------------------------


def test_401_waiting(double: KubeDouble, fault_row: FaultRow) -> None:
    double.expire_credentials()
    task = run_task("waiting")
    assert task.state == "failed" and isinstance(task.error, LaunchError)
    assert task.message.startswith(f"the Kubernetes API at {double.url} refused the credentials (401 Unauthorized)")
    assert "renew it" in task.message
    assert task.seconds < REFUSAL_BOUND
    assert record(fault_row, double, "401 credentials refused", "waiting", task) == []


def test_401_deferrable_the_triggerers_credentials(double: KubeDouble, fault_row: FaultRow) -> None:
    """The triggerer runs elsewhere (often with another service account or token): its
    credentials are refused while the worker's are fine."""

    def refuse(task: Task, trigger: Any) -> None:
        task.fault_at = time.monotonic()
        double.expire_credentials()

    def renew(task: Task, event: dict[str, Any]) -> None:
        double.expire_credentials(False)  # the worker that resumes the task has its own

    task = run_task("deferrable", on_deferred=refuse, on_event=renew)
    assert [e["status"] for e in task.events] == ["error"]
    assert task.state == "failed" and isinstance(task.error, BackendRequestFailed)
    assert "refused the credentials (401 Unauthorized) while listing pods in namespace default" in task.message
    assert task.seconds < REFUSAL_BOUND
    assert record(fault_row, double, "401 credentials refused (triggerer)", "deferrable", task) == []


# --- namespaces --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_namespace_that_does_not_exist(mode: str, double: KubeDouble, fault_row: FaultRow) -> None:
    task = run_task(mode, {**SPEC, "pod": {"namespace": "trainnig"}})
    assert task.state == "failed" and isinstance(task.error, LaunchError)
    assert task.message.startswith("namespace trainnig does not exist (404 NotFound while creating service")
    assert "kubectl create namespace trainnig" in task.message
    assert task.seconds < REFUSAL_BOUND
    assert record(fault_row, double, "namespace does not exist", mode, task) == []


def test_namespace_deleted_while_deferred(double: KubeDouble, fault_row: FaultRow) -> None:
    def delete(task: Task, trigger: Any) -> None:
        task.fault_at = time.monotonic()
        double.delete_namespace("default")

    task = run_task("deferrable", on_deferred=delete)
    assert [e["status"] for e in task.events] == ["error"]
    assert task.state == "failed"
    assert "no pod of MPI job" in task.message and "is left in namespace default" in task.message
    assert task.seconds < REFUSAL_BOUND
    assert record(fault_row, double, "namespace deleted while deferred", "deferrable", task) == []


# --- outages: connection refused, no reply -----------------------------------------------------


OUTAGES = {
    "connection refused": (KubeDouble.refuse_connections, KubeDouble.accept_connections, "connection refused"),
    "accepts, never replies": (KubeDouble.hang, KubeDouble.answer, "no reply"),
}


@pytest.mark.parametrize("outage", OUTAGES)
def test_api_down_while_training(outage: str, double: KubeDouble, scripts: Scripts, fault_row: FaultRow) -> None:
    start, end, cause = OUTAGES[outage]
    scripts.on("-master-", TRAINING)
    task_box = Task()
    waiter = when_master_runs(double, outage_then_back(double, lambda: start(double), lambda: end(double)), task_box)
    task = run_task("waiting")
    waiter.join()
    task.fault_at = task_box.fault_at
    assert task.state == "failed" and isinstance(task.error, BackendUnreachable)
    assert task.message.startswith(f"the Kubernetes API at {double.url} did not answer for ")
    assert f"({cause})" in task.message
    assert API_TIMEOUT - 0.5 <= task.seconds <= API_TIMEOUT + SLACK
    assert record(fault_row, double, f"API down: {outage}", "waiting", task) == []


@pytest.mark.parametrize("outage", OUTAGES)
def test_api_down_while_deferred(outage: str, double: KubeDouble, fault_row: FaultRow) -> None:
    start, end, cause = OUTAGES[outage]

    def down(task: Task, trigger: Any) -> None:
        task.fault_at = time.monotonic()
        outage_then_back(double, lambda: start(double), lambda: end(double))()

    task = run_task("deferrable", on_deferred=down)
    assert [e["outcome"] for e in task.events] == ["api_unreachable"]
    assert API_TIMEOUT - 0.5 <= task.seconds <= API_TIMEOUT + SLACK  # the trigger's own bound
    assert task.state == "failed" and isinstance(task.error, BackendUnreachable)
    assert task.message.startswith(f"the Kubernetes API at {double.url} did not answer for ")
    assert f"({cause})" in task.message
    assert record(fault_row, double, f"API down: {outage}", "deferrable", task) == []
