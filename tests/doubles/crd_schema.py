"""Validate custom objects against their CustomResourceDefinition's ``openAPIV3Schema``, as an
API server with strict field validation does: unknown fields are refused, not pruned.

The CRDs are not part of this project (they belong to Volcano and others): they are read from
the directory ``AIRFLOW_MPI_CRDS`` names, else from ``shared/crds`` beside the checkout.
"""

from __future__ import annotations

import copy
import os
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

Obj = dict[str, Any]
CRDS_ENV = "AIRFLOW_MPI_CRDS"
_REPO = Path(__file__).resolve().parents[2]


def crd_dir() -> Path | None:
    """Where the CRD files are, or None when neither place has them."""
    named = os.environ.get(CRDS_ENV)
    candidates = [Path(named)] if named else []
    candidates += [_REPO.parent / "shared" / "crds", _REPO / "shared" / "crds"]
    return next((path for path in candidates if path.is_dir() and any(path.glob("*.yaml"))), None)


@cache
def _schemas(directory: str) -> dict[tuple[str, str], Obj]:
    """(apiVersion, kind) -> JSON schema, for every served version of every CRD in ``directory``."""
    found: dict[tuple[str, str], Obj] = {}
    for path in sorted(Path(directory).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for version in spec.get("versions") or []:
                schema = (version.get("schema") or {}).get("openAPIV3Schema")
                if schema:
                    key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                    found[key] = to_json_schema(schema)
    return found


def to_json_schema(schema: Obj) -> Obj:
    """An OpenAPI v3 structural schema as JSON Schema: int-or-string becomes either type, and an
    object with declared properties refuses others unless it preserves unknown fields."""
    out = copy.deepcopy(schema)
    _convert(out)
    return out


def _convert(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _convert(item)
        return
    if not isinstance(node, dict):
        return
    if node.pop("x-kubernetes-int-or-string", False):
        node.pop("type", None)
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    preserve = node.pop("x-kubernetes-preserve-unknown-fields", False)
    if node.pop("nullable", False) and "type" in node:
        node["type"] = [node["type"], "null"]
    for key in [k for k in node if k.startswith("x-kubernetes-")]:
        node.pop(key)
    if "properties" in node and "additionalProperties" not in node and not preserve:
        node["additionalProperties"] = False
    for key, value in node.items():
        if key == "properties" and isinstance(value, dict):
            for child in value.values():
                _convert(child)
        elif key != "enum":
            _convert(value)


def known_kinds(directory: Path | None = None) -> set[tuple[str, str]]:
    where = directory or crd_dir()
    return set(_schemas(str(where))) if where else set()


def crd_errors(obj: Obj, directory: Path | None = None) -> list[str]:
    """Every way ``obj`` breaks its CRD's schema (``path: message``); [] when it passes.
    Raises LookupError when no CRD for its apiVersion and kind is there."""
    where = directory or crd_dir()
    if where is None:
        raise LookupError(f"no CRD directory: set {CRDS_ENV} or put shared/crds beside the checkout")
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    schema = _schemas(str(where)).get(key)
    if schema is None:
        raise LookupError(f"no CRD for {key[0]} {key[1]} in {where}")
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    ]


@cache
def _raw_schemas(directory: str) -> dict[tuple[str, str], Obj]:
    """(apiVersion, kind) -> the CRD's openAPIV3Schema as written (defaults included)."""
    found: dict[tuple[str, str], Obj] = {}
    for path in sorted(Path(directory).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                for version in doc["spec"].get("versions") or []:
                    schema = (version.get("schema") or {}).get("openAPIV3Schema")
                    if schema:
                        found[(f"{doc['spec']['group']}/{version['name']}", doc["spec"]["names"]["kind"])] = schema
    return found


def apply_crd_defaults(obj: Obj, directory: Path | None = None) -> None:
    """Fill the schema's ``default`` values in place, as the apiserver does on create: a field
    is defaulted only where its parent object is present. No CRD at hand: nothing changes."""
    where = directory or crd_dir()
    schema = _raw_schemas(str(where)).get((obj.get("apiVersion", ""), obj.get("kind", ""))) if where else None
    if schema is not None:
        _default(obj, schema)


def _default(value: Any, schema: Obj) -> None:
    if isinstance(value, dict):
        for key, child in (schema.get("properties") or {}).items():
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
            if key in value:
                _default(value[key], child)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value:
                if key not in (schema.get("properties") or {}):
                    _default(value[key], extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _default(item, schema["items"])
