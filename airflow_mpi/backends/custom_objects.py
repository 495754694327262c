"""Custom resources (Volcano Jobs, PodGroups, Kueue Workloads) through ``CustomObjectsApi``, with
the same error translation and bounded retries as the core objects."""

from __future__ import annotations

import json
import time
from typing import Any

from airflow_mpi.backends.k8s_errors import NOT_FOUND, api_status, is_transient, retry_delay, translate
from airflow_mpi.exceptions import LaunchError

# (group, version, plural, kind), as the builders declare them.
GVK = tuple[str, str, str, str]
Obj = dict[str, Any]
ATTEMPTS = 6


class CustomObjects:
    """Create, read, list and delete namespaced custom objects; plain JSON in and out."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes.client import CustomObjectsApi

        self.api = CustomObjectsApi(api_client)

    def create(self, namespace: str, gvk: GVK, body: Obj) -> Obj:
        group, version, plural, kind = gvk
        name = body["metadata"]["name"]
        for attempt in range(ATTEMPTS):
            try:
                response = self.api.create_namespaced_custom_object(
                    group, version, namespace, plural, body, _preload_content=False
                )
                return dict(json.loads(response.data))
            except Exception as error:
                if is_transient(error) and attempt + 1 < ATTEMPTS:
                    time.sleep(retry_delay(error, attempt))
                    continue
                raise translate(error, f"creating {kind} {name} in {namespace}", creating=True) from error
        raise LaunchError(f"creating {kind} {name} in {namespace} failed {ATTEMPTS} times")

    def get(self, namespace: str, gvk: GVK, name: str) -> Obj | None:
        group, version, plural, kind = gvk
        try:
            response = self.api.get_namespaced_custom_object(
                group, version, namespace, plural, name, _preload_content=False
            )
            return dict(json.loads(response.data))
        except Exception as error:
            if api_status(error) == NOT_FOUND:
                return None
            raise translate(error, f"reading {kind} {name} in {namespace}") from error

    def list(self, namespace: str, gvk: GVK, selector: str) -> list[Obj]:
        group, version, plural, kind = gvk
        try:
            response = self.api.list_namespaced_custom_object(
                group, version, namespace, plural, label_selector=selector, _preload_content=False
            )
        except Exception as error:
            if api_status(error) == NOT_FOUND:  # the CRD is not installed: none of these exist
                return []
            raise translate(error, f"listing {kind} objects in {namespace}") from error
        return list(json.loads(response.data).get("items") or [])

    def delete(self, namespace: str, gvk: GVK, name: str, propagation: str = "Background") -> bool:
        """Delete; False when it was not there."""
        from kubernetes.client import V1DeleteOptions

        group, version, plural, kind = gvk
        try:
            self.api.delete_namespaced_custom_object(
                group,
                version,
                namespace,
                plural,
                name,
                body=V1DeleteOptions(propagation_policy=propagation),
                _preload_content=False,
            )
            return True
        except Exception as error:
            if api_status(error) == NOT_FOUND:
                return False
            raise translate(error, f"deleting {kind} {name} in {namespace}") from error
