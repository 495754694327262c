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
from airflow_mpi.backends.k8s_errors import api_status, describe, is_transient, retry_after, retry_delay, translate
from airflow_mpi.exceptions import BackendError, BackendRequestFailed, JobNotFound, LaunchError


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
    created = translate(api_error(422, message="bad label"), "creating pod p in ns", creating=True)
    assert isinstance(created, LaunchError) and str(created) == "creating pod p in ns failed: 422 Reason: bad label"
    missing = translate(api_error(404), "reading service s in ns")
    assert isinstance(missing, JobNotFound) and "404" in str(missing)
    denied = translate(api_error(403), "deleting job j (its service) in ns")
    assert isinstance(denied, BackendRequestFailed) and not isinstance(denied, LaunchError)
    assert all(isinstance(e, BackendError) for e in (created, missing, denied))
