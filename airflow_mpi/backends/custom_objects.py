"""Custom resources (Volcano Jobs, PodGroups, Kueue Workloads) through ``CustomObjectsApi``, with
the same error translation (``k8s_errors.translate``) and the same bounds as the core objects:
each request is retried on 429/5xx and connection failures until the API has been silent for
``api_timeout`` (``CoreObjects.request``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_mpi.backends.base import FoundJob
from airflow_mpi.backends.core_objects import AlreadyExists, same_job
from airflow_mpi.backends.k8s_errors import (
    CONFLICT,
    NOT_FOUND,
    ApiRequest,
    api_status,
    deleted,
    read_or_none,
    translate,
)
from airflow_mpi.exceptions import BackendError
from airflow_mpi.job.naming import LABEL_JOB, LABEL_TRY_NUMBER, RunIdentity, run_selector

if TYPE_CHECKING:
    from airflow_mpi.backends.core_objects import CoreObjects

# (group, version, plural, kind), as the builders declare them.
GVK = tuple[str, str, str, str]
Obj = dict[str, Any]
# ``send(call, since)``: make ``call(request_timeout)``, retrying transient failures until the API
# has been silent for ``api_timeout`` since ``since`` (None: now); see ``CoreObjects.request``.
Send = Callable[[Callable[[tuple[float, float]], Any], float | None], Any]


class CustomObjects:
    """Create, read, list and delete namespaced custom objects; plain JSON in and out."""

    def __init__(self, api_client: Any, send: Send, api_url: str = "") -> None:
        from kubernetes.client import CustomObjectsApi

        self.api = CustomObjectsApi(api_client)
        self.send = send
        self.api_url = api_url

    def create(self, namespace: str, gvk: GVK, body: Obj, since: float | None = None) -> Obj:
        group, version, plural, _ = gvk
        name = body["metadata"]["name"]
        attempts = 0

        def post(timeout: tuple[float, float]) -> Any:
            nonlocal attempts
            attempts += 1
            return self.api.create_namespaced_custom_object(
                group, version, namespace, plural, body, _preload_content=False, _request_timeout=timeout
            )

        try:
            return dict(json.loads(self.send(post, since).data))
        except BackendError:
            raise
        except Exception as error:
            if api_status(error) == CONFLICT:
                existing = self.get(namespace, gvk, name, since)
                if attempts > 1 and existing is not None and same_job(existing, body):
                    return existing  # a retried POST whose first attempt went through
                raise AlreadyExists(f"{gvk[3]} {name} already exists in {namespace}", existing) from error
            raise translate(error, ApiRequest("create", plural, namespace, name), self.api_url) from error

    def get(self, namespace: str, gvk: GVK, name: str, since: float | None = None) -> Obj | None:
        group, version, plural, _ = gvk
        return read_or_none(
            lambda: self.send(
                lambda timeout: self.api.get_namespaced_custom_object(
                    group, version, namespace, plural, name, _preload_content=False, _request_timeout=timeout
                ),
                since,
            ),
            ApiRequest("get", plural, namespace, name),
            self.api_url,
        )

    def replace(self, namespace: str, gvk: GVK, obj: Obj) -> None:
        """Write ``obj`` whole (its resourceVersion: the one read, or a conflict)."""
        group, version, plural, _ = gvk
        name = obj["metadata"]["name"]
        try:
            self.send(
                lambda timeout: self.api.replace_namespaced_custom_object(
                    group, version, namespace, plural, name, obj, _preload_content=False, _request_timeout=timeout
                ),
                None,
            )
        except BackendError:
            raise
        except Exception as error:
            raise translate(error, ApiRequest("update", plural, namespace, name), self.api_url) from error

    def list(self, namespace: str, gvk: GVK, selector: str, since: float | None = None) -> list[Obj]:
        group, version, plural, _ = gvk
        try:
            response = self.send(
                lambda timeout: self.api.list_namespaced_custom_object(
                    group,
                    version,
                    namespace,
                    plural,
                    label_selector=selector,
                    _preload_content=False,
                    _request_timeout=timeout,
                ),
                since,
            )
        except BackendError:
            raise
        except Exception as error:
            if api_status(error) == NOT_FOUND:  # the CRD is not installed: none of these exist
                return []
            raise translate(error, ApiRequest("list", plural, namespace), self.api_url) from error
        return list(json.loads(response.data).get("items") or [])

    def delete(
        self, namespace: str, gvk: GVK, name: str, propagation: str = "Background", since: float | None = None
    ) -> bool:
        """Delete; False when it was not there."""
        from kubernetes.client import V1DeleteOptions

        group, version, plural, _ = gvk
        return deleted(
            lambda: self.send(
                lambda timeout: self.api.delete_namespaced_custom_object(
                    group,
                    version,
                    namespace,
                    plural,
                    name,
                    body=V1DeleteOptions(propagation_policy=propagation),
                    _preload_content=False,
                    _request_timeout=timeout,
                ),
                since,
            ),
            ApiRequest("delete", plural, namespace, name),
            self.api_url,
        )

    def wait_gone(self, namespace: str, gvk: GVK, name: str, timeout: float) -> bool:
        """Whether the object went within ``timeout`` seconds. Polled with a back-off (0.2 s up
        to 2 s): a foreground deletion waits for every pod it owns, and the controllers let a
        finished pod go up to ~20 s after the others (real Volcano)."""
        deadline, pause = time.monotonic() + timeout, 0.2
        while self.get(namespace, gvk, name) is not None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 1.5, 2.0)
        return True


class TopObjects:
    """A job's top object (what deleting takes the whole job), read alike whatever its API: a
    controller's custom resource, or our Service in the core API (``JobKind.top_resource``)."""

    def __init__(self, objects: CoreObjects, custom: CustomObjects, resource: GVK) -> None:
        self.objects, self.custom, self.resource = objects, custom, resource

    def get(self, namespace: str, name: str) -> Obj | None:
        group, _, plural, _ = self.resource
        return self.custom.get(namespace, self.resource, name) if group else self.objects.get(namespace, plural, name)

    def select(self, namespace: str, selector: str) -> list[Obj]:
        """The top objects with labels matching ``selector``."""
        group, _, plural, _ = self.resource
        if group:
            return self.custom.list(namespace, self.resource, selector)
        return self.objects.list(namespace, plural, selector)

    def find_jobs(self, namespace: str, identity: RunIdentity) -> list[FoundJob]:
        """The jobs of every try of this task instance, oldest try first: their top objects
        carry the run labels (one list request)."""
        found = []
        for obj in self.select(namespace, run_selector(identity)):
            labels = obj["metadata"].get("labels") or {}
            name = labels.get(LABEL_JOB, obj["metadata"]["name"])
            found.append(FoundJob(name, namespace, int(labels.get(LABEL_TRY_NUMBER, 0))))
        return sorted(found, key=lambda job: job.try_number)
