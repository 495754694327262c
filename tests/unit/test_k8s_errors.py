"""Kubernetes client errors, translated once: status, transient or not, Retry-After, the reason
in the API server's words, and the product's error class."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from email.utils import format_datetime

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from airflow_mpi.backends import k8s_errors
from airflow_mpi.backends.k8s_errors import (
    ApiRequest,
    ApiSilence,
    api_status,
    describe,
    explain,
    is_refusal,
    is_transient,
    retry_after,
    retry_delay,
    translate,
)
from airflow_mpi.exceptions import BackendError, BackendRequestFailed, BackendUnreachable, JobNotFound, LaunchError


def api_error(status: int, headers: dict[str, str] | None = None, message: str = "nope") -> ApiException:
    error = ApiException(status=status, reason="Reason")
    error.headers = headers or {}
    error.body = json.dumps({"kind": "Status", "code": status, "reason": "Reason", "message": message})
    return error


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_throttling_and_server_errors_are_transient(status: int) -> None:
    assert api_status(api_error(status)) == status
    assert is_transient(api_error(status))


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 410, 422])
def test_client_errors_are_not_transient(status: int) -> None:
    assert api_status(api_error(status)) == status
    assert not is_transient(api_error(status))


@pytest.mark.parametrize(
    "error",
    [
        urllib3.exceptions.MaxRetryError(None, "/api", "refused"),  # type: ignore[arg-type]
        urllib3.exceptions.ProtocolError("Connection aborted."),
        urllib3.exceptions.ReadTimeoutError(None, "/api", "read timed out"),  # type: ignore[arg-type]
        urllib3.exceptions.NewConnectionError(None, "refused"),  # type: ignore[arg-type]
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError("timed out"),
    ],
)
def test_connection_failures_have_no_status_and_are_transient(error: BaseException) -> None:
    assert api_status(error) is None
    assert is_transient(error)


def test_other_errors_have_no_status_and_are_not_transient() -> None:
    for error in (ValueError("bad json"), KeyError("metadata"), ApiException(status=0, reason="no answer")):
        assert api_status(error) is None
        assert not is_transient(error)


def test_async_client_errors_are_read_the_same_way() -> None:
    from kubernetes_asyncio.client.exceptions import ApiException as AsyncApiException

    error = AsyncApiException(status=503, reason="Service Unavailable")
    error.headers = {"Retry-After": "2"}
    assert api_status(error) == 503 and is_transient(error) and retry_after(error) == 2.0
    assert api_status(AsyncApiException(status=410, reason="Gone")) == k8s_errors.GONE


def test_aiohttp_errors_are_read_the_same_way() -> None:
    import aiohttp

    assert is_transient(aiohttp.ServerDisconnectedError()) and api_status(aiohttp.ServerDisconnectedError()) is None
    assert is_transient(aiohttp.ClientPayloadError("cut short"))


def test_retry_after_in_seconds_any_header_case_and_capped() -> None:
    assert retry_after(api_error(429, {"Retry-After": "3"})) == 3.0
    assert retry_after(api_error(429, {"retry-after": " 1.5 "})) == 1.5
    assert retry_after(api_error(429, {"Retry-After": "600"})) == k8s_errors.MAX_RETRY_AFTER
    assert retry_after(api_error(429, {"Retry-After": "-4"})) == 0.0


def test_retry_after_as_an_http_date() -> None:
    now = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc).timestamp()
    later = format_datetime(datetime(2026, 11, 30, 12, 0, 4, tzinfo=timezone.utc), usegmt=True)
    assert retry_after(api_error(503, {"Retry-After": later}), now=now) == 4.0
    earlier = format_datetime(datetime(2026, 11, 30, 11, 0, 0, tzinfo=timezone.utc), usegmt=True)
    assert retry_after(api_error(503, {"Retry-After": earlier}), now=now) == 0.0


@pytest.mark.parametrize("value", ["", "soon", "nan", "Mon, 99 Foo 2026 25:00:00"])
def test_unreadable_retry_after_counts_as_none(value: str) -> None:
    assert retry_after(api_error(429, {"Retry-After": value})) is None


def test_retry_delay_follows_retry_after_else_backs_off() -> None:
    assert retry_delay(api_error(429, {"Retry-After": "2"}), attempt=0) == 2.0
    assert [retry_delay(api_error(503), attempt) for attempt in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.0, 3.0]
    assert retry_after(ConnectionResetError()) is None


def test_describe_uses_the_status_body_else_the_error() -> None:
    assert describe(api_error(403, message='pods is forbidden: User "x"')) == (
        '403 Reason: pods is forbidden: User "x"'
    )
    assert describe(ConnectionResetError("reset")) == "ConnectionResetError: reset"


def test_translate_picks_the_product_error() -> None:
    created = translate(api_error(409, message="exists"), ApiRequest("create", "pods", "ns", "p"))
    assert (
        isinstance(created, LaunchError) and str(created) == "creating pod p in namespace ns failed: 409 Reason: exists"
    )
    missing = translate(api_error(404), ApiRequest("get", "services", "ns", "s"))
    assert isinstance(missing, JobNotFound) and "404" in str(missing)
    denied = translate(api_error(403), ApiRequest("delete", "services", "ns", "j"))
    assert isinstance(denied, BackendRequestFailed) and not isinstance(denied, LaunchError)
    assert all(isinstance(e, BackendError) for e in (created, missing, denied))


def forbidden(verb: str, resource: str, user: str = "system:serviceaccount:airflow:worker") -> ApiException:
    return api_error(
        403,
        message=f'pods is forbidden: User "{user}" cannot {verb} resource "{resource}" in API group "" '
        'in the namespace "training"',
    )


def test_403_names_the_verb_the_resource_and_the_fix() -> None:
    message = explain(forbidden("list", "pods"), ApiRequest("list", "pods", "training"))
    assert message == (
        "the service account airflow/worker cannot `list` `pods` in namespace training (403 Forbidden): "
        "add `list` on `pods` to the Role bound to it; see docs/guides/rbac.md"
    )
    log = explain(forbidden("get", "pods/log", "alice"), ApiRequest("get", "pods/log", "training", "job-master-0"))
    assert log.startswith("the user alice cannot `get` `pods/log` in namespace training (403 Forbidden)")
    anonymous = explain(forbidden("create", "services", "system:anonymous"), ApiRequest("create", "services", "t"))
    assert anonymous.startswith("an anonymous client (the connection sends no credentials) cannot `create`")
    assert explain(api_error(403, message=""), ApiRequest("watch", "pods", "t")).startswith(
        "the service account cannot"
    )


def test_an_admission_webhooks_403_is_its_verdict_not_a_missing_verb() -> None:
    """Kueue's TrainJob webhook refusing a TrainJob (seen in the real tier) is not RBAC: the
    message says it was a webhook, in its own words, and names no verb to add."""
    said = "admission webhook \"vtrainjob.kb.io\" denied the request: runtime 'j-1' not found"
    message = explain(api_error(403, message=said), ApiRequest("create", "trainjobs", "ml", "j-1"))
    assert message.endswith(f"failed: an admission webhook refused it (403): {said}"), message
    assert "Role" not in message and "add `create`" not in message


def test_401_says_the_credentials_were_refused_and_where() -> None:
    message = explain(api_error(401, message="Unauthorized"), ApiRequest("list", "pods", "t"), "https://k8s:6443")
    assert message.startswith(
        "the Kubernetes API at https://k8s:6443 refused the credentials (401 Unauthorized) while listing pods "
        "in namespace t: "
    )
    assert "renew it" in message


def test_404_on_the_namespace_says_it_does_not_exist() -> None:
    error = api_error(404, message='namespaces "trainnig" not found')
    error.body = json.dumps(
        {
            "code": 404,
            "reason": "NotFound",
            "message": 'namespaces "trainnig" not found',
            "details": {"kind": "namespaces"},
        }
    )
    message = explain(error, ApiRequest("create", "services", "trainnig", "job"))
    assert message.startswith("namespace trainnig does not exist (404 NotFound while creating service job in namespace")
    assert isinstance(translate(error, ApiRequest("create", "services", "trainnig", "job")), LaunchError)
    # Any other 404 is about the object itself.
    other = translate(api_error(404, message='pods "p" not found'), ApiRequest("get", "pods", "t", "p"))
    assert (
        isinstance(other, JobNotFound)
        and str(other) == 'reading pod p in namespace t failed: 404 Reason: pods "p" not found'
    )


def test_422_shows_the_servers_field_and_where_it_comes_from() -> None:
    error = api_error(422, message='Pod "p" is invalid: metadata.labels: Invalid value: "-1"')
    message = explain(error, ApiRequest("create", "pods", "t", "p"))
    assert message.startswith(
        'the API server rejected pod p as invalid (422 Invalid): Pod "p" is invalid: metadata.labels'
    )
    assert "airflow-mpi render" in message


@pytest.mark.parametrize(
    ("status", "refusal"),
    [
        (400, True),
        (401, True),
        (403, True),
        (404, True),
        (409, True),
        (410, False),
        (422, True),
        (429, False),
        (500, False),
        (503, False),
    ],
)
def test_refusals_end_a_wait_and_the_rest_are_retried(status: int, refusal: bool) -> None:
    assert is_refusal(api_error(status)) is refusal
    assert not is_refusal(ConnectionRefusedError(111, "Connection refused"))


class Clock:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        monkeypatch.setattr(k8s_errors.time, "monotonic", lambda: self.now)


def test_api_silence_bounds_every_wait_from_its_start_or_the_last_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    silence = ApiSilence("https://k8s:6443", limit=10)
    since = clock.now
    clock.now += 6
    silence.failed(
        urllib3.exceptions.NewConnectionError(
            None, "Failed to establish a new connection: [Errno 111] Connection refused"
        )
    )  # type: ignore[arg-type]
    assert silence.left(since) == 4 and not silence.exceeded(since)
    assert silence.request_timeout(since) == (4, 4)  # no request may outlive the bound
    assert silence.request_timeout(since, read=2) == (4, 2)
    clock.now += 4
    assert silence.exceeded(since)
    error = silence.error(since)
    assert isinstance(error, BackendUnreachable)
    assert str(error).startswith(
        "the Kubernetes API at https://k8s:6443 did not answer for 10 s (connection refused); "
    )
    silence.answered()  # any answer resets it
    assert silence.left(since) == 10
    # A refusal is an answer: the server is there.
    clock.now += 9
    silence.failed(api_error(403))
    assert silence.left(since) == 10
    # A wait that starts later gets its whole bound, whatever happened before it.
    clock.now += 30
    assert silence.left(clock.now) == 10 and silence.exceeded(since)


def test_api_silence_says_when_the_server_answered_only_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    silence = ApiSilence("https://k8s:6443", limit=5)
    since = clock.now
    clock.now += 5
    silence.failed(api_error(503, message="etcdserver: leader changed"))
    assert str(silence.error(since)).startswith(
        "the Kubernetes API at https://k8s:6443 answered only errors for 5 s (last: 503 Reason: etcdserver: leader changed)"
    )
    silence.failed(TimeoutError("timed out"))
    assert "did not answer for 5 s (no reply)" in str(silence.error(since))


def test_watch_windows_stay_inside_the_bound() -> None:
    assert ApiSilence("u", 120).watch_seconds(290) == 60
    assert ApiSilence("u", 3).watch_seconds(290) == 1
    assert ApiSilence("u", 3600).watch_seconds(290) == 290


def test_the_pages_the_messages_point_to_exist() -> None:
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    for link in (k8s_errors.RBAC_DOC, k8s_errors.SETUP_DOC):
        assert (repo / link).is_file(), link
    assert "kind: Role" in (repo / k8s_errors.RBAC_DOC).read_text()
