"""Is a rendered object one Kubernetes accepts? Both checks, in one place for every test.

``schema_errors``: the OpenAPI schema (kubernetes-validate). ``api_server_refusals``: the API
server's own validation rules (names, labels, paths, ...), which the schema does not hold.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any

import kubernetes_validate

PLURALS = {"Pod": "pods", "Service": "services", "Secret": "secrets", "ConfigMap": "configmaps"}
SCHEMA_VERSION = "1.33.0"

# ---- THE PLUG-IN POINT for the strict API double's validation ------------------------------------
# tests.doubles.apivalidation (the apiserver's validation rules as a pure module) comes from
# another branch. Once it is on main, ``validate_object(plural, obj)`` runs here for every object the
# tests render, and nothing else needs to change; until then no rule is applied (None below).
APIVALIDATION_MODULE = "tests.doubles.apivalidation"
_apivalidation: Any = (
    importlib.import_module(APIVALIDATION_MODULE) if importlib.util.find_spec(APIVALIDATION_MODULE) else None
)


def api_server_refusals(plural: str, obj: Mapping[str, Any]) -> list[str]:
    """What the API server would refuse in ``obj`` (empty until the strict double is available)."""
    if _apivalidation is None:
        return []
    return [str(cause) for cause in _apivalidation.validate_object(plural, obj)]


# ---------------------------------------------------------------------------------------------------


def schema_errors(obj: Mapping[str, Any], version: str = SCHEMA_VERSION) -> list[str]:
    """The OpenAPI schema's complaints about ``obj`` (strict: unknown fields too)."""
    try:
        kubernetes_validate.validate(dict(obj), version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [str(error).splitlines()[0]]
    return []


def object_problems(obj: Mapping[str, Any]) -> list[str]:
    """Both checks for one rendered object."""
    plural = PLURALS[str(obj.get("kind"))]
    return schema_errors(obj) + api_server_refusals(plural, obj)
