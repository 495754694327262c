"""Kubernetes client errors, translated once: their HTTP status, whether a retry can help, how
long the server asked to wait, what the user must change (an RBAC verb, a namespace, the
credentials), and the product's error to raise; and ``ApiSilence``, the bound on how long any wait
keeps retrying an API that does not answer.

Both clients (``kubernetes`` in the backend and its pod watch, ``kubernetes_asyncio`` in the
trigger) raise an ``ApiException`` with the status, the headers and a ``Status`` body; below
them urllib3 or aiohttp raise connection errors. The error types are looked up among the modules
already imported: an error of a client that was never imported cannot exist, and importing
``kubernetes_asyncio`` only to compare against it would cost the sync backend seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from airflow_mpi.exceptions import BackendError, BackendRequestFailed, BackendUnreachable, JobNotFound, LaunchError

BAD_REQUEST = 400
UNAUTHORIZED = 401
FORBIDDEN = 403
NOT_FOUND = 404
CONFLICT = 409
GONE = 410  # a watch's resourceVersion is too old: list again
INVALID = 422
TOO_MANY_REQUESTS = 429
MAX_RETRY_AFTER = 10.0  # seconds: a longer Retry-After is cut, the caller's own bound applies
API_TIMEOUT = 120.0  # seconds the API may stay silent before a wait gives up (connection extra api_timeout)
CONNECT_TIMEOUT = 10.0  # seconds to open a connection to the API server
RBAC_DOC = "docs/guides/rbac.md"  # the Role that grants every verb the backend uses
SETUP_DOC = "docs/guides/kubernetes.md"

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
    Every other answer (400, 401, 403, 404, 409, 422 ...) says the request itself is wrong, and
    so does a server certificate the client does not trust (the same one comes next time)."""
    status = api_status(error)
    if status is not None:
        return status == TOO_MANY_REQUESTS or 500 <= status <= 599
    if certificate_rejected(error) is not None:
        return False
    return isinstance(error, (OSError, *_loaded(_CONNECTION_ERRORS)))


def certificate_rejected(error: BaseException) -> ssl.SSLCertVerificationError | None:
    """The TLS verification failure under a client's connection error (urllib3 wraps it in
    ``SSLError`` and ``MaxRetryError``, aiohttp in ``ClientConnectorCertificateError``), if any."""
    seen: set[int] = set()
    stack: list[object] = [error]
    while stack:
        found = stack.pop()
        if not isinstance(found, BaseException) or id(found) in seen:
            continue
        seen.add(id(found))
        inner = getattr(found, "certificate_error", None)  # aiohttp's error is one, wrapping ssl's
        if isinstance(found, ssl.SSLCertVerificationError) and not isinstance(inner, ssl.SSLCertVerificationError):
            return found
        stack += [found.__cause__, found.__context__, *found.args]
        stack += [getattr(found, name, None) for name in ("reason", "certificate_error", "os_error")]
    return None


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
    body = _status_body(error)
    if body:
        return f"{body.get('code', '')} {body.get('reason', '')}: {body.get('message', '')}".strip()
    return f"{type(error).__name__}: {error}"


def _status_body(error: BaseException) -> dict[str, Any]:
    """The ``Status`` object the API server sent with an error answer; {} when there is none."""
    body: Any = getattr(error, "body", None)
    if body:
        with contextlib.suppress(ValueError, TypeError):
            status = json.loads(body)
            if isinstance(status, dict):
                return status
    return {}


@dataclass(frozen=True)
class ApiRequest:
    """One request as RBAC names it: the verb (create, get, list, watch, delete), the resource
    (``pods``, ``pods/log``, ``services`` ...), the namespace and, for one object, its name."""

    verb: str
    resource: str
    namespace: str
    name: str = ""

    @property
    def doing(self) -> str:
        """What was asked, in words: ``listing pods in namespace ns``."""
        if self.resource == "pods/log":
            return f"reading the log of pod {self.name} in namespace {self.namespace}"
        verb = {"create": "creating", "get": "reading", "list": "listing", "watch": "watching", "delete": "deleting"}
        what = f"{self.resource.removesuffix('s')} {self.name}" if self.name else self.resource
        return f"{verb.get(self.verb, self.verb)} {what} in namespace {self.namespace}"


def _identity(server_message: str) -> str:
    """Who the API server says asked (``User "..."`` of a 403), in words."""
    found = re.search(r'User "([^"]+)"', server_message)
    user = found.group(1) if found else ""
    parts = user.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        return f"the service account {parts[2]}/{parts[3]}"
    if user == "system:anonymous":
        return "an anonymous client (the connection sends no credentials)"
    return f"the user {user}" if user else "the service account"


def explain(error: BaseException, request: ApiRequest, api_url: str = "") -> str:
    """The message a user can act on for a refused request: which RBAC verb on which resource
    the Role lacks (403; an admission webhook's refusal is a 403 too, and is told apart),
    credentials refused (401), a namespace that does not exist (404), an object the API server
    rejects (422); else what was asked and the server's words."""
    status = api_status(error)
    body = _status_body(error)
    said = str(body.get("message") or "")
    where = f"the Kubernetes API at {api_url}" if api_url else "the Kubernetes API"
    rejected = certificate_rejected(error) if status is None else None
    if rejected is not None:
        why = getattr(rejected, "verify_message", "") or rejected
        return (
            f"{where} presented a certificate the Kubernetes connection does not trust while {request.doing} "
            f"({why}): give the connection the cluster's CA (the kubeconfig's certificate-authority-data; in a "
            "pod, the ServiceAccount's ca.crt), or, for a test cluster only, set its extra disable_verify_ssl to true"
        )
    if status == UNAUTHORIZED:
        return (
            f"{where} refused the credentials (401 Unauthorized) while {request.doing}: the Kubernetes "
            f"connection's token or client certificate is missing, wrong or expired; renew it (see {SETUP_DOC})"
        )
    if status == FORBIDDEN and "violates PodSecurity" in said:  # admission, not RBAC
        return f"{request.doing} failed: {describe(error)}{_fix(said)}"
    if status == FORBIDDEN and "admission webhook" in said:  # a webhook's verdict, not RBAC
        return f"{request.doing} failed: an admission webhook refused it (403): {said}"
    if status == FORBIDDEN:
        return (
            f"{_identity(said)} cannot `{request.verb}` `{request.resource}` in namespace {request.namespace} "
            f"(403 Forbidden): add `{request.verb}` on `{request.resource}` to the Role bound to it; see {RBAC_DOC}"
        )
    details = body.get("details")
    details = details if isinstance(details, dict) else {}
    if status == NOT_FOUND and details.get("kind") == "namespaces":
        return (
            f"namespace {request.namespace} does not exist (404 NotFound while {request.doing}): create it "
            f"(kubectl create namespace {request.namespace}), or set pod.namespace or the mpi connection's "
            "namespace to one that exists"
        )
    if status == INVALID:
        return (
            f"the API server rejected {request.resource.removesuffix('s')} {request.name} as invalid (422 Invalid): "
            f"{said or describe(error)}; the field it names comes from the job spec (`airflow-mpi render` shows "
            "what is sent)"
        )
    return f"{request.doing} failed: {describe(error)}"


def translate(error: BaseException, request: ApiRequest, api_url: str = "") -> BackendError:
    """The product's error for a refused request (``raise translate(e, ...) from e``), with
    ``explain``'s message: ``LaunchError`` for a create, ``JobNotFound`` for a 404, else
    ``BackendRequestFailed``."""
    message = explain(error, request, api_url)
    if request.verb == "create":
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


def is_refusal(error: BaseException) -> bool:
    """An answer that retrying cannot change (401, 403, 404, 422 ..., or a server certificate
    not trusted): the wait ends now. 410 Gone is not one (list again), nor are 429/5xx and
    connection failures (retry, bounded)."""
    status = api_status(error)
    if status is None:
        return certificate_rejected(error) is not None
    return status != GONE and not is_transient(error)


def _cause(error: BaseException | None) -> str:
    """A failed request in a few words, for the unreachable message."""
    if error is None:
        return "no reply"
    status = api_status(error)
    if status is not None:
        return describe(error)
    text = f"{error!r} {error}".lower()
    if "refused" in text:
        return "connection refused"
    if "timeout" in text or "timed out" in text or isinstance(error, (TimeoutError, asyncio.TimeoutError)):
        return "no reply"
    if "reset" in text or "disconnected" in text or "aborted" in text:
        return "connection dropped"
    return f"{type(error).__name__}: {error}"


class ApiSilence:
    """How long the API server has gone without a useful answer, shared by every request of a
    client: a success (or a refusal, which is an answer too) resets it; 429/5xx answers and
    connection failures do not. A wait that started at ``since`` gives up once the API has been
    silent for ``limit`` seconds of it, whatever each request does (``request_timeout`` keeps
    one hung request from outliving the bound)."""

    def __init__(self, api_url: str, limit: float) -> None:
        self.api_url = api_url
        self.limit = limit
        self.last_answer = time.monotonic()
        self.last_error: BaseException | None = None

    def answered(self) -> None:
        self.last_answer = time.monotonic()
        self.last_error = None

    def failed(self, error: BaseException) -> None:
        """A request failed: a refusal counts as an answer; anything else leaves the clock running."""
        if is_refusal(error):
            self.answered()
        else:
            self.last_error = error

    def silent_for(self, since: float) -> float:
        return time.monotonic() - max(self.last_answer, since)

    def left(self, since: float) -> float:
        return self.limit - self.silent_for(since)

    def exceeded(self, since: float) -> bool:
        return self.left(since) <= 0

    def watch_seconds(self, longest: int) -> int:
        """A watch's ``timeoutSeconds``: a quiet, healthy watch ends (an answer) within half the bound."""
        return max(1, min(longest, int(self.limit / 2)))

    def request_timeout(self, since: float, read: float | None = None) -> tuple[float, float]:
        """(connect, read) seconds for the next request: never past the bound (at least 0.5 s)."""
        left = max(0.5, self.left(since))
        return min(CONNECT_TIMEOUT, left), min(read if read is not None else left, left)

    def error(self, since: float) -> BackendUnreachable:
        seconds = self.silent_for(since)
        last = self.last_error
        if last is not None and api_status(last) is not None:
            what = f"answered only errors for {seconds:.0f} s (last: {describe(last)})"
        else:
            what = f"did not answer for {seconds:.0f} s ({_cause(last)})"
        return BackendUnreachable(
            f"the Kubernetes API at {self.api_url} {what}; the job's pods may still be running: check that "
            f"the cluster is up and the connection's server address (see {SETUP_DOC})"
        )


def deleted(send: Callable[[], object], request: ApiRequest, api_url: str = "") -> bool:
    """Run one DELETE (``send``): True when it deleted, False when the object was already gone;
    any other refusal is translated (the product's own errors pass through)."""
    try:
        send()
    except BackendError:
        raise
    except Exception as error:
        if api_status(error) == NOT_FOUND:
            return False
        raise translate(error, request, api_url) from error
    return True


def read_or_none(send: Callable[[], Any], request: ApiRequest, api_url: str = "") -> dict[str, Any] | None:
    """Run one GET (``send``, an unparsed response): the object, or None when there is none;
    any other refusal is translated (the product's own errors pass through)."""
    try:
        response = send()
    except BackendError:
        raise
    except Exception as error:
        if api_status(error) == NOT_FOUND:
            return None
        raise translate(error, request, api_url) from error
    return dict(json.loads(response.data))
