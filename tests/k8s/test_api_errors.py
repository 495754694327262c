"""The double refuses and fails as a real API server does (bodies, codes, namespaces, outages),
and each bound of the Kubernetes backend and trigger holds on its own: the deadline fires while
the API hangs, creates give up, teardown gives up and says what it left, 5xx-only is bounded."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from typing import Any

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import BackendUnavailable, BackendUnreachable, SshdNotReady
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.triggers.mpi import MPIJobTrigger
from tests.documented import documented_role_rules
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.k8s.conftest import Scripts, api_client_for, first_trigger_event, install_connections, job_objects
from tests.k8s.test_kubernetes_backend import Log, make_plan

SLACK = 3.0


def request(double: KubeDouble, method: str, path: str, body: Any = None, timeout: float = 5) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", int(double.url.rsplit(":", 1)[1]), timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def backend_for(double: KubeDouble, api_timeout: float) -> KubernetesBackend:
    return KubernetesBackend(api_client=api_client_for(double), namespace="default", api_timeout=api_timeout)


# --- the double answers as a real API server ---------------------------------------------------


def test_403_bodies_name_the_user_the_verb_and_the_resource(double: KubeDouble) -> None:
    double.deny("list", "pods")
    double.deny("get", "pods/log")
    status, body = request(double, "GET", "/api/v1/namespaces/default/pods?labelSelector=a%3Db")
    assert status == 403 and body["reason"] == "Forbidden" and body["details"] == {"kind": "pods"}
    assert body["message"] == (
        'pods is forbidden: User "system:serviceaccount:airflow:airflow-worker" cannot list resource "pods" '
        'in API group "" in the namespace "default"'
    )
    status, body = request(double, "GET", "/api/v1/namespaces/default/pods/p-0/log?follow=true")
    assert status == 403 and body["details"] == {"name": "p-0", "kind": "pods"}
    assert body["message"].startswith('pods "p-0" is forbidden: User "system:serviceaccount:airflow:airflow-worker" ')
    assert 'cannot get resource "pods/log" in API group ""' in body["message"]
    # Other verbs are allowed: a watch is not a list.
    status, _ = request(double, "GET", "/api/v1/namespaces/default/pods/p-0")
    assert status == 404


def test_401_for_every_request_while_the_credentials_are_expired(double: KubeDouble) -> None:
    double.expire_credentials()
    status, body = request(double, "GET", "/api/v1/namespaces/default/services")
    assert (status, body["reason"], body["message"]) == (401, "Unauthorized", "Unauthorized")
    double.expire_credentials(False)
    assert request(double, "GET", "/api/v1/namespaces/default/services")[0] == 200


def test_a_namespace_that_does_not_exist(double: KubeDouble) -> None:
    service = {"metadata": {"name": "svc"}, "spec": {"clusterIP": "None"}}
    status, body = request(double, "POST", "/api/v1/namespaces/nope/services", service)
    assert status == 404 and body["message"] == 'namespaces "nope" not found'
    assert body["details"] == {"name": "nope", "kind": "namespaces"}
    # Listing there lists nothing (a real API server answers 200), reading one object is a 404.
    status, body = request(double, "GET", "/api/v1/namespaces/nope/pods")
    assert status == 200 and body["items"] == []
    assert request(double, "GET", "/api/v1/namespaces/nope/services/svc")[0] == 404
    double.create_namespace("nope")
    assert request(double, "POST", "/api/v1/namespaces/nope/services", service)[0] == 201
    double.delete_namespace("nope")
    time.sleep(0.3)
    assert double.list_objects("services", "nope") == []


def test_hang_holds_requests_until_it_answers_again(double: KubeDouble) -> None:
    double.hang()
    with pytest.raises(TimeoutError):
        request(double, "GET", "/api/v1/namespaces/default/pods", timeout=0.5)
    threading.Timer(0.5, double.answer).start()
    started = time.monotonic()
    assert request(double, "GET", "/api/v1/namespaces/default/pods", timeout=5)[0] == 200
    assert time.monotonic() - started >= 0.4


def test_refused_connections_then_the_same_server_again(double: KubeDouble) -> None:
    request(double, "POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "kept"}})
    double.refuse_connections()
    with pytest.raises(ConnectionRefusedError):
        request(double, "GET", "/api/v1/namespaces/default/configmaps")
    double.accept_connections()
    status, body = request(double, "GET", "/api/v1/namespaces/default/configmaps")
    assert status == 200 and [o["metadata"]["name"] for o in body["items"]] == ["kept"]


# --- bounds of the synchronous backend ---------------------------------------------------------


def test_create_gives_up_on_an_api_that_never_answers(double: KubeDouble) -> None:
    backend = backend_for(double, api_timeout=2)
    double.hang()
    started = time.monotonic()
    try:
        with pytest.raises(BackendUnreachable, match=r"did not answer for 2 s \(no reply\)"):
            backend.create(make_plan(workers=1))
        assert 2 <= time.monotonic() - started <= 2 + SLACK
    finally:
        double.answer()
    # The held POST is applied late, maybe after the held DELETE: what a hung server does is
    # unknowable to its client. Clean up as an operator would, once it answers.
    time.sleep(0.3)
    backend_for(double, api_timeout=5).teardown(make_plan(workers=1).job_name)


def test_startup_timeout_fires_while_the_api_hangs(double: KubeDouble, scripts: Scripts) -> None:
    scripts.on("-worker-", PodScript(start_delay=30))  # never ready in time
    backend = backend_for(double, api_timeout=30)
    plan = make_plan(workers=1, startup_timeout=2)
    runner = JobRunner(backend, plan, Log())
    timer = threading.Timer(1.0, double.hang)
    timer.start()
    threading.Timer(3.5, double.answer).start()  # back, so the teardown can delete the job
    started = time.monotonic()
    with pytest.raises(SshdNotReady):
        runner.run()
    timer.join()
    assert time.monotonic() - started <= 3.5 + SLACK
    assert job_objects(double, plan.job_name) == []


def test_teardown_gives_up_and_says_what_it_left(double: KubeDouble, scripts: Scripts) -> None:
    scripts.on("-master-", PodScript(lines=lambda: iter(["[1,0]<stdout>:training"])))
    backend = backend_for(double, api_timeout=2)
    plan = make_plan(workers=1)
    log = Log()
    runner = JobRunner(backend, plan, log)

    def down_for_good() -> None:
        while not any("training" in line for line in log):
            time.sleep(0.02)
        double.refuse_connections()

    threading.Thread(target=down_for_good, daemon=True).start()
    with pytest.raises(BackendUnreachable) as caught:
        runner.run()
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert notes.startswith(f"teardown of MPI job {plan.job_name} left: job {plan.job_name} (could not be deleted: ")
    assert "did not answer for 2 s (connection refused)" in notes
    assert f"then delete the Service {plan.job_name} in namespace default (kubectl delete service" in notes
    assert len(job_objects(double, plan.job_name)) == 6  # honestly left: the API never came back
    double.accept_connections()
    cleanup = backend_for(double, api_timeout=5)
    cleanup.teardown(plan.job_name)
    deadline = time.monotonic() + 5
    while job_objects(double, plan.job_name) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job_objects(double, plan.job_name) == []


# --- bounds of the trigger ---------------------------------------------------------------------


def fire(trigger: MPIJobTrigger) -> tuple[dict[str, Any], float]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    started = time.monotonic()
    payload = asyncio.run(first())
    return payload, time.monotonic() - started


def trigger_for(plan: Any, **changes: Any) -> MPIJobTrigger:
    fields: dict[str, Any] = {
        "job_name": plan.job_name,
        "namespace": "default",
        "kubernetes_conn_id": "kube_double",
        "deadline": time.time() + 60,
        "worker_pods": [w.name for w in plan.workers],
        "master_pod": plan.master.name,
        "timeout": 60.0,
        "api_timeout": 3.0,
    }
    fields.update(changes)
    return MPIJobTrigger(contract=fields)


@pytest.fixture
def created(double: KubeDouble, scripts: Scripts, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A job whose workers never get ready, and connections to the double."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook  # noqa: F401

    install_connections(monkeypatch, double)
    scripts.on("-worker-", PodScript(start_delay=60))
    backend = backend_for(double, api_timeout=5)
    plan = make_plan(workers=1)
    backend.create(plan)
    backend.release(plan.job_name)
    yield plan
    double.answer()
    double.stop_failing()  # teardown reads the top object first (is it still this job's?)
    backend.teardown(plan.job_name)


def test_trigger_deadline_fires_while_the_api_hangs(double: KubeDouble, created: Any) -> None:
    double.hang()
    payload, seconds = fire(trigger_for(created, startup_timeout=2.0, api_timeout=60))
    assert payload["outcome"] == "startup_timeout" and 2 <= seconds <= 2 + SLACK
    assert "did not accept ssh within 2s" in payload["reason"]


def test_trigger_gives_up_on_an_api_that_answers_only_errors(double: KubeDouble, created: Any) -> None:
    double.fail_requests(method="GET", status=503, count=10_000)
    payload, seconds = fire(trigger_for(created))
    assert payload["outcome"] == "api_unreachable" and 3 <= seconds <= 3 + SLACK
    assert payload["reason"].startswith(f"the Kubernetes API at {double.url} answered only errors for 3 s (last: 503")


# --- configuration -----------------------------------------------------------------------------


def test_api_timeout_comes_from_the_mpi_connection(double: KubeDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_mpi.hooks.mpi import MPIJobHook

    install_connections(monkeypatch, double, api_timeout=42)
    backend = MPIJobHook("mpi_k8s").get_backend()
    assert isinstance(backend, KubernetesBackend) and backend.api_timeout == 42
    for bad in ("soon", 0, -5, 10**9):
        install_connections(monkeypatch, double, api_timeout=bad)
        with pytest.raises(BackendUnavailable) as caught:
            MPIJobHook("mpi_k8s").get_backend()
        assert str(caught.value) == (
            f"connection 'mpi_k8s': extra 'api_timeout' is {bad!r}; set it to a number of seconds from 1 to 86400 "
            "(default 120)"
        )


# --- the RBAC guide's Roles are the fix ------------------------------------------------------------


@pytest.mark.parametrize("deferrable", [False, True])
def test_the_documented_role_is_all_a_job_needs(
    double: KubeDouble, scripts: Scripts, monkeypatch: pytest.MonkeyPatch, deferrable: bool
) -> None:
    from types import SimpleNamespace

    from airflow.sdk.exceptions import TaskDeferred

    from airflow_mpi.operators.mpi import MPIJobOperator

    double.grant(documented_role_rules("worker"))
    install_connections(monkeypatch, double)
    scripts.on("-worker-", PodScript(start_delay=0.3))  # the trigger watches, not only lists
    scripts.on("-master-", PodScript(lines=lambda: iter(['[1,0]<stdout>:AIRFLOW_MPI_RESULT {"ok": 1}']), exit_code=0))
    spec = {"name": "rbac", "image": "registry.example/train:1", "command": ["python", "/app/train.py"]}
    ti = SimpleNamespace(dag_id="rbac", task_id="train", run_id="r1", map_index=-1, try_number=1)

    def operator() -> MPIJobOperator:
        return MPIJobOperator(task_id="train", job=spec, mpi_conn_id="mpi_k8s", deferrable=deferrable)

    try:
        result = operator().execute({"ti": ti})  # type: ignore[arg-type]
    except TaskDeferred as deferred:
        pending = deferred
        while True:
            double.grant(documented_role_rules("triggerer"))  # the triggerer's own Role, while it waits
            event = first_trigger_event(pending.trigger)
            double.grant(documented_role_rules("worker"))
            assert event["outcome"] != "api_refused", event
            try:
                result = getattr(operator(), pending.method_name)({"ti": ti}, event)
                break
            except TaskDeferred as again:
                pending = again
    assert result["result"] == {"ok": 1}
    assert job_objects(double) == []
    # The double enforces it: a Role without one of those verbs is refused.
    double.grant([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}])
    assert request(double, "GET", "/api/v1/namespaces/default/pods")[0] == 403
