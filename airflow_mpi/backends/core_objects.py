"""Core objects (Services, Secrets, ConfigMaps, pods, events, pod logs) through ``CoreV1Api``:
the one place that makes a Kubernetes request, bounded and translated alike for every caller
(the backend, the cluster CLI, the connection test, ``CustomObjects``).

Every request carries a read timeout; 429/5xx answers and connection failures are retried until
the API has been silent for ``api_timeout`` seconds (``ApiSilence``), then ``BackendUnreachable``;
any other error is translated into what to change (``k8s_errors.translate``). Plain JSON in and
out: no generated model objects (a pod's are large, and their parsing slow).
"""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Callable
from functools import cached_property
from typing import Any

from airflow_mpi import contract
from airflow_mpi.backends.k8s_errors import (
    CONFLICT,
    FORBIDDEN,
    NOT_FOUND,
    UNAUTHORIZED,
    ApiRequest,
    ApiSilence,
    api_status,
    deleted,
    is_transient,
    read_or_none,
    retry_delay,
    translate,
)
from airflow_mpi.backends.token_file import renewed_since, token_generation
from airflow_mpi.exceptions import BackendError, LaunchError
from airflow_mpi.job.naming import LABEL_JOB, LABEL_RUN_KEY, LABEL_TRY_NUMBER
from airflow_mpi.observe.cursor import followed_log_call

Obj = dict[str, Any]
# Each plural as CoreV1Api spells it in ``<verb>_namespaced_<kind>``.
# What an API server answers a list with when asked for metadata only (Kubernetes 1.15+); the plain
# JSON after it is for a server that cannot, whose whole objects are then cut to their metadata.
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"
CORE_PLURALS = {"services": "service", "secrets": "secret", "configmaps": "config_map", "pods": "pod"}
TAIL_READ_TIMEOUT = 10.0  # a failure message's "last lines" are not worth a longer wait


class AlreadyExists(LaunchError):
    """A create found the object there (``existing``: it as read, or None)."""

    def __init__(self, message: str, existing: Obj | None) -> None:
        super().__init__(message)
        self.existing = existing


class CoreObjects:
    """Create, read, replace, list, delete core objects; events; pod logs."""

    def __init__(self, api_client: Any, silence: ApiSilence) -> None:
        self.api_client = api_client
        self.silence = silence

    @property
    def api_url(self) -> str:
        return str(self.api_client.configuration.host)

    @cached_property
    def core(self) -> Any:
        from kubernetes.client import CoreV1Api

        return CoreV1Api(self.api_client)

    def request(self, call: Callable[[tuple[float, float]], Any], since: float | None = None) -> Any:
        """Make one request (``call(request_timeout)``), retrying 429/5xx answers and connection
        failures until the API has been silent for ``api_timeout`` since ``since`` (default: now),
        then ``BackendUnreachable``, and a 401 once the token file holds a newer token than the
        request sent (``token_file``). Any other error is the caller's to read (404, 409 ...)."""
        since = time.monotonic() if since is None else since
        attempt = 0
        while True:
            token = token_generation(self.api_client)
            try:
                result = call(self.silence.request_timeout(since))
            except Exception as error:
                if api_status(error) == UNAUTHORIZED and renewed_since(self.api_client, token):
                    continue  # sent with the token the kubelet has since replaced
                self.silence.failed(error)
                if not is_transient(error):
                    raise
                if self.silence.exceeded(since):
                    raise self.silence.error(since) from error
                time.sleep(min(retry_delay(error, attempt), max(0.0, self.silence.left(since))))
                attempt += 1
                continue
            self.silence.answered()
            return result

    def _api(self, verb: str, plural: str) -> Callable[..., Any]:
        return getattr(self.core, f"{verb}_namespaced_{CORE_PLURALS[plural]}")  # type: ignore[no-any-return]

    def create(self, namespace: str, plural: str, manifest: Obj) -> Obj:
        """POST. A 409 after a retried POST means the first attempt went through: the existing
        object is returned when it is this job's (same job label); otherwise ``AlreadyExists``."""
        create = self._api("create", plural)
        name = manifest["metadata"]["name"]
        attempts = 0

        def post(timeout: tuple[float, float]) -> Any:
            nonlocal attempts
            attempts += 1
            return create(namespace, manifest, _preload_content=False, _request_timeout=timeout)

        try:
            return dict(json.loads(self.request(post).data))
        except BackendError:
            raise
        except Exception as error:
            if api_status(error) == CONFLICT:
                existing = self.get(namespace, plural, name)
                if attempts > 1 and existing is not None and same_job(existing, manifest):
                    return existing
                raise AlreadyExists(f"{plural[:-1]} {name} already exists in {namespace}", existing) from error
            raise translate(error, ApiRequest("create", plural, namespace, name), self.api_url) from error

    def get(self, namespace: str, plural: str, name: str) -> Obj | None:
        """The object, or None when it is not there."""
        read = self._api("read", plural)
        return read_or_none(
            lambda: self.request(
                lambda timeout: read(name, namespace, _preload_content=False, _request_timeout=timeout)
            ),
            ApiRequest("get", plural, namespace, name),
            self.api_url,
        )

    def replace(self, namespace: str, plural: str, obj: Obj) -> None:
        replace = self._api("replace", plural)
        name = obj["metadata"]["name"]
        try:
            self.request(
                lambda timeout: replace(name, namespace, obj, _preload_content=False, _request_timeout=timeout)
            )
        except BackendError:
            raise
        except Exception as error:
            raise translate(error, ApiRequest("update", plural, namespace, name), self.api_url) from error

    def list(self, namespace: str, plural: str, selector: str, since: float | None = None) -> list[Obj]:
        """One list by label selector (bounded by ``api_timeout`` from ``since``, default now)."""
        list_ = self._api("list", plural)
        try:
            response = self.request(
                lambda timeout: list_(
                    namespace, label_selector=selector, _preload_content=False, _request_timeout=timeout
                ),
                since,
            )
        except BackendError:
            raise
        except Exception as error:
            raise translate(error, ApiRequest("list", plural, namespace), self.api_url) from error
        return list(json.loads(response.data).get("items") or [])

    def list_metadata(self, namespace: str, plural: str, selector: str) -> builtins.list[Obj]:
        """One list by label selector of the objects' metadata only (a PartialObjectMetadataList):
        none of their data crosses the wire, so a listing never reads a job's key or script."""
        try:
            response = self.request(
                lambda timeout: self.api_client.call_api(
                    f"/api/v1/namespaces/{namespace}/{plural}",
                    "GET",
                    query_params=[("labelSelector", selector)],
                    header_params={"Accept": METADATA_ONLY},
                    auth_settings=["BearerToken"],
                    _return_http_data_only=True,
                    _preload_content=False,
                    _request_timeout=timeout,
                )
            )
        except BackendError:
            raise
        except Exception as error:
            raise translate(error, ApiRequest("list", plural, namespace), self.api_url) from error
        return [{"metadata": item.get("metadata") or {}} for item in json.loads(response.data).get("items") or []]

    def delete(
        self,
        namespace: str,
        plural: str,
        name: str,
        since: float | None = None,
        propagation: str = "",
        grace_seconds: int | None = None,
    ) -> bool:
        """DELETE one object (bounded by ``api_timeout`` from ``since``); False if it was gone.
        ``grace_seconds=0`` forces a pod's deletion (its Node will not confirm it)."""
        from kubernetes.client import V1DeleteOptions

        delete = self._api("delete", plural)
        body = None
        if propagation or grace_seconds is not None:
            body = V1DeleteOptions(propagation_policy=propagation or None, grace_period_seconds=grace_seconds)
        return deleted(
            lambda: self.request(
                lambda timeout: delete(name, namespace, body=body, _preload_content=False, _request_timeout=timeout),
                since,
            ),
            ApiRequest("delete", plural, namespace, name),
            self.api_url,
        )

    def events(self, namespace: str, field_selector: str) -> builtins.list[Obj]:
        try:
            response = self.request(
                lambda timeout: self.core.list_namespaced_event(
                    namespace, field_selector=field_selector, _preload_content=False, _request_timeout=timeout
                )
            )
        except BackendError:
            raise
        except Exception as error:
            raise translate(error, ApiRequest("list", "events", namespace), self.api_url) from error
        return list(json.loads(response.data).get("items") or [])

    def rules_review(self, namespace: str) -> Obj | None:
        """A SelfSubjectRulesReview's status for ``namespace``; None when reviews are not allowed
        or not served (the requests themselves will say what is missing)."""
        from kubernetes.client import AuthorizationV1Api

        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectRulesReview",
            "spec": {"namespace": namespace},
        }
        api = AuthorizationV1Api(self.api_client)
        try:
            response = self.request(
                lambda timeout: api.create_self_subject_rules_review(
                    review, _preload_content=False, _request_timeout=timeout
                )
            )
        except BackendError:
            raise
        except Exception as error:
            if api_status(error) in (FORBIDDEN, NOT_FOUND):
                return None
            raise translate(error, ApiRequest("create", "selfsubjectrulesreviews", namespace), self.api_url) from error
        return dict(json.loads(response.data or b"{}").get("status") or {})

    def whoami(self) -> str | None:
        """The user name a SelfSubjectReview gives for these credentials
        (``system:serviceaccount:NS:NAME`` for a service account's token); None when the
        server does not serve or allow it (the messages then say "the credentials")."""
        from kubernetes.client import AuthenticationV1Api

        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        api = AuthenticationV1Api(self.api_client)
        try:
            response = self.request(
                lambda timeout: api.create_self_subject_review(review, _preload_content=False, _request_timeout=timeout)
            )
            status = json.loads(response.data or b"{}").get("status") or {}
        except BackendError:
            raise
        except Exception:  # an identity only names who lacks a verb: the verb is the error
            return None
        username = (status.get("userInfo") or {}).get("username")
        return str(username) if username else None

    # --- pod logs ---------------------------------------------------------------------------

    def open_log(self, namespace: str, pod: str, since_time: str | None, read_timeout: float) -> Any:
        """The pod's log as a followed stream, each line stamped (``timestamps=true``), from
        ``since_time`` (RFC 3339) when given. The caller reads and closes the response."""
        path, arguments = followed_log_call(namespace, pod, since_time)
        timeout = self.silence.request_timeout(time.monotonic(), read=read_timeout)
        return self.api_client.call_api(path, "GET", **arguments, _request_timeout=timeout)

    def exec_in_pod(
        self, namespace: str, pod: str, argv: builtins.list[str], timeout: float
    ) -> tuple[int | None, str, str]:
        """Run ``argv`` in the pod's job container (``kubectl exec``): exit code, stdout, stderr.
        Through its own client: the websocket call swaps its client's ``request`` while it runs,
        which must not touch the client the pod watch's thread uses."""
        from kubernetes.client import ApiClient, CoreV1Api
        from kubernetes.stream import stream
        from kubernetes.stream.ws_client import STDERR_CHANNEL, STDOUT_CHANNEL

        with ApiClient(self.api_client.configuration) as own:
            try:
                session = stream(
                    CoreV1Api(own).connect_get_namespaced_pod_exec, pod, namespace,
                    container=contract.CONTAINER_NAME, command=argv, stdin=False, stdout=True, stderr=True,
                    tty=False, _preload_content=False, _request_timeout=timeout,
                )  # fmt: skip
            except Exception as error:
                raise translate(error, ApiRequest("create", "pods/exec", namespace, pod), self.api_url) from error
            try:
                session.run_forever(timeout=timeout)
                out, err = session.read_channel(STDOUT_CHANNEL), session.read_channel(STDERR_CHANNEL)
                return session.returncode, out, err
            finally:
                session.close()

    def read_log(self, namespace: str, pod: str) -> bytes:
        """The pod's whole log as it is now (translated errors; 404 when the pod is not there)."""
        try:
            response = self.request(
                lambda timeout: self.core.read_namespaced_pod_log(
                    pod, namespace, container=contract.CONTAINER_NAME, _preload_content=False, _request_timeout=timeout
                )
            )
        except BackendError:
            raise
        except Exception as error:
            raise translate(error, ApiRequest("get", "pods/log", namespace, pod), self.api_url) from error
        return bytes(response.data)

    def log_tail(self, namespace: str, pod: str, lines: int = 20) -> builtins.list[str]:
        """The pod's last lines, for a failure message: [] when they cannot be had quickly."""
        for _ in range(2):  # one retry: a pooled connection the server has closed meanwhile
            try:
                response = self.core.read_namespaced_pod_log(
                    pod,
                    namespace,
                    container=contract.CONTAINER_NAME,
                    tail_lines=lines,
                    _preload_content=False,
                    _request_timeout=self.silence.request_timeout(time.monotonic(), read=TAIL_READ_TIMEOUT),
                )
            except Exception as error:
                if is_transient(error):
                    continue
                return []
            return [line for line in response.data.decode("utf-8", "replace").splitlines() if line.strip()]
        return []


def same_job(existing: Obj, manifest: Obj) -> bool:
    """Whether an object found in a create's place carries the job and owner labels the manifest
    does (the same try of the same task instance of the same deployment: ``identity.owned_by``)."""
    ours = manifest["metadata"].get("labels") or {}
    theirs = existing.get("metadata", {}).get("labels") or {}
    keys = (LABEL_JOB, LABEL_RUN_KEY, LABEL_TRY_NUMBER)
    return bool(ours.get(LABEL_JOB)) and all(theirs.get(key) == ours.get(key) for key in keys)
