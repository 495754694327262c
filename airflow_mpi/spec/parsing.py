"""Generic parsing of plain data (YAML/JSON) into frozen dataclasses, and back.

Every problem becomes a ``SpecIssue`` naming the field (unknown keys with a close match, wrong
types, missing required fields), so ``MPIJobSpec.from_dict`` can report them all at once.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any, TypeVar, Union

from airflow_mpi.exceptions import SpecIssue

T = TypeVar("T")


def parse_dataclass(cls: type[T], data: object, path: str, issues: list[SpecIssue]) -> T | None:
    """``cls`` built from a mapping, or ``None``; every problem is appended to ``issues``."""
    where = path or "<spec>"
    if not isinstance(data, Mapping):
        issues.append(SpecIssue(where, f"must be a mapping, got {type(data).__name__}", "use key: value pairs"))
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        field_path = f"{path}.{key}" if path else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            fix = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(fields)}"
            issues.append(SpecIssue(field_path, "is not a known field", fix))
            continue
        ok, parsed = _parse_value(hints[key], value, field_path, issues)
        if ok:
            kwargs[key] = parsed
    for name, spec_field in fields.items():
        if (
            name not in data
            and spec_field.default is dataclasses.MISSING
            and spec_field.default_factory is dataclasses.MISSING
        ):
            issues.append(SpecIssue(f"{path}.{name}" if path else name, "is required", "add it"))
            return None
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as error:  # a required field was mistyped and dropped
        issues.append(SpecIssue(where, str(error)))
        return None


def _parse_value(hint: Any, value: object, path: str, issues: list[SpecIssue]) -> tuple[bool, Any]:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return True, None
        candidates = [a for a in args if a is not type(None)]
        for candidate in candidates:
            probe: list[SpecIssue] = []
            ok, parsed = _parse_value(candidate, value, path, probe)
            if ok and not probe:
                return True, parsed
        names = " or ".join(_type_name(a) for a in candidates)
        issues.append(SpecIssue(path, f"{value!r} is not {names}", f"give {names}"))
        return False, None
    if dataclasses.is_dataclass(hint):
        parsed = parse_dataclass(typing.cast(type, hint), value, path, issues)
        return parsed is not None, parsed
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return True, hint(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in hint)
            issues.append(SpecIssue(path, f"{value!r} is not one of {choices}", f"use one of {choices}"))
            return False, None
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, list | tuple):
            issues.append(SpecIssue(path, f"must be a list, got {type(value).__name__}", "use a YAML/JSON list"))
            return False, None
        items = []
        all_ok = True
        for index, item in enumerate(value):
            ok, parsed = _parse_value(args[0], item, f"{path}[{index}]", issues)
            all_ok &= ok
            items.append(parsed)
        return all_ok, tuple(items)
    if origin is Mapping or hint is Mapping:
        if not isinstance(value, Mapping):
            issues.append(SpecIssue(path, f"must be a mapping, got {type(value).__name__}", "use key: value pairs"))
            return False, None
        result = {}
        all_ok = True
        for key, item in value.items():
            if isinstance(item, bool) or not isinstance(item, str | int | float):
                issues.append(SpecIssue(f"{path}.{key}", f"{item!r} is not a string", "quote it"))
                all_ok = False
                continue
            result[str(key)] = item if isinstance(item, str) else str(item)
        return all_ok, result
    if hint is bool:
        if isinstance(value, bool):
            return True, value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return True, value
        if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
            return True, int(value)  # a templated field renders to text, e.g. "{{ params.workers }}"
    elif hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return True, value
    elif hint is str:
        if isinstance(value, str):
            return True, value
    else:
        raise TypeError(f"unsupported spec type {hint!r} at {path}")
    issues.append(SpecIssue(path, f"{value!r} is not {_type_name(hint)}", f"give {_type_name(hint)}"))
    return False, None


def _type_name(hint: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    if hint in names:
        return names[hint]
    if dataclasses.is_dataclass(hint):
        return "a mapping"
    if isinstance(hint, type) and issubclass(hint, Enum):
        return "one of " + ", ".join(repr(m.value) for m in hint)
    origin = typing.get_origin(hint)
    if origin is tuple:
        return "a list"
    return getattr(hint, "__name__", str(hint))


def to_plain(value: object) -> object:
    """Dataclasses, enums and tuples as the plain data ``parse_dataclass`` reads back."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [to_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    return value
