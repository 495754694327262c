"""Kubernetes client errors, translated once: their HTTP status, whether a retry can help, how
long the server asked to wait, a readable reason, and the product's error to raise.

Both clients (``kubernetes`` in the backend and its pod watch, ``kubernetes_asyncio`` in the
trigger) raise an ``ApiException`` with the status, the headers and a ``Status`` body; below
them urllib3 or aiohttp raise connection errors. The error types are looked up among the modules
already imported: an error of a client that was never imported cannot exist, and importing
``kubernetes_asyncio`` only to compare against it would cost the sync backend seconds.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any

from airflow_mpi.exceptions import BackendError, BackendRequestFailed, JobNotFound, LaunchError

BAD_REQUEST = 400
NOT_FOUND = 404
CONFLICT = 409
GONE = 410  # a watch's resourceVersion is too old: list again
TOO_MANY_REQUESTS = 429
MAX_RETRY_AFTER = 10.0  # seconds: a longer Retry-After is cut, the caller's own bound applies

# (module, class) of the errors that carry an HTTP status ...
_STATUS_ERRORS = (
    ("kubernetes.client.exceptions", "ApiException"),
    ("kubernetes_asyncio.client.exceptions", "ApiException"),
    ("aiohttp", "ClientResponseError"),
)
# ... and of the connection-level failures below the clients (OSError covers sockets and DNS).
_CONNECTION_ERRORS = (
    ("urllib3.exceptions", "MaxRetryError"),
    ("urllib3.exceptions", "ProtocolError"),
    ("urllib3.exceptions", "NewConnectionError"),
    ("urllib3.exceptions", "TimeoutError"),
    ("aiohttp", "ClientConnectionError"),
    ("aiohttp", "ClientPayloadError"),
)


def _loaded(names: tuple[tuple[str, str], ...]) -> tuple[type[BaseException], ...]:
    found = []
    for module_name, class_name in names:
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


def api_status(error: BaseException) -> int | None:
    """The HTTP status the API server answered with; None when no answer came (connection error)."""
    if isinstance(error, _loaded(_STATUS_ERRORS)):
        status = getattr(error, "status", None)
        return status if isinstance(status, int) and status > 0 else None
    return None


def is_transient(error: BaseException) -> bool:
    """Whether the same request may succeed later: 429 and 5xx answers, and connection failures.
    Every other answer (400, 401, 403, 404, 409, 422 ...) says the request itself is wrong."""
    status = api_status(error)
    if status is not None:
        return status == TOO_MANY_REQUESTS or 500 <= status <= 599
    return isinstance(error, (OSError, *_loaded(_CONNECTION_ERRORS)))


def retry_after(error: BaseException, now: float | None = None) -> float | None:
    """Seconds the server asked to wait (``Retry-After``: delay-seconds or an HTTP date), capped
    at ``MAX_RETRY_AFTER``; None when it asked nothing, or nothing readable."""
    headers = getattr(error, "headers", None)
    if not isinstance(headers, Mapping):
        return None
    value = next((str(v).strip() for k, v in headers.items() if str(k).lower() == "retry-after"), None)
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # not an HTTP date (those are GMT)
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def retry_delay(error: BaseException, attempt: int) -> float:
    """How long to wait before retry number ``attempt`` (0-based): what the server asked, else a
    doubling back-off from 0.1 s up to 3 s."""
    asked = retry_after(error)
    return asked if asked is not None else float(min(0.1 * 2**attempt, 3.0))


def describe(error: BaseException) -> str:
    """The API server's own words (``<code> <reason>: <message>`` of its Status body), else the
    error's type and text."""
    body: Any = getattr(error, "body", None)
    if body:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            status = json.loads(body)
            return f"{status.get('code', '')} {status.get('reason', '')}: {status.get('message', '')}".strip()
    return f"{type(error).__name__}: {error}"


def translate(error: BaseException, doing: str, *, creating: bool = False) -> BackendError:
    """The product's error for a failed request (``raise translate(e, ...) from e``):
    ``LaunchError`` for a create, ``JobNotFound`` for a 404, else ``BackendRequestFailed``.
    ``doing`` says what was asked, e.g. ``"reading pod job-1-master-0"``."""
    reason = describe(error)
    message = f"{doing} failed: {reason}{_fix(reason)}"
    if creating:
        return LaunchError(message)
    if api_status(error) == NOT_FOUND:
        return JobNotFound(message)
    return BackendRequestFailed(message)


def _fix(reason: str) -> str:
    """The fix for a refusal whose cause the API server's words name but do not solve."""
    if "violates PodSecurity" in reason:
        return (
            "; the namespace enforces the Pod Security Standards and the pods run as root: run the job without "
            "root (pod.run_as_user, ssh_port 1024 or above, an image with that user; "
            "docs/contract.md#jobs-without-root)"
        )
    return ""
