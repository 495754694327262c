"""Generic parsing of plain data (YAML/JSON) into frozen dataclasses, and back.

Every problem becomes a ``SpecIssue`` naming the field (unknown keys with a close match, wrong
types, missing required fields), so ``MPIJobSpec.from_dict`` can report them all at once.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import shlex
import types
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any, TypeVar, Union

from airflow_mpi.exceptions import SpecIssue

T = TypeVar("T")


def parse_dataclass(cls: type[T], data: object, path: str, issues: list[SpecIssue]) -> T | None:
    """``cls`` built from a mapping, or ``None`` when ``data`` is not one; every problem is
    appended to ``issues``. A required field that is missing or mistyped gets an empty stand-in
    (reported, and skipped by the rules), so the other fields are still checked and every
    problem is listed at once."""
    where = path or "<spec>"
    if not isinstance(data, Mapping):
        got = _kind_of(data) if data is None else f"{_kind_of(data)} {_shown(data)}"
        issues.append(SpecIssue(where, f"must be a mapping, got {got}", "use key: value pairs"))
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key) if str(key).strip() and str(key) == str(key).strip() else repr(key)  # '' stays visible
        field_path = f"{path}.{name}" if path else name
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            fix = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(fields)}"
            issues.append(SpecIssue(field_path, "is not a known field", fix))
            continue
        if fields[key].metadata.get("text_only") and _numbers_in(value, field_path, issues):
            continue
        ok, parsed = _parse_value(hints[key], value, field_path, issues)
        if ok:
            kwargs[key] = parsed
    for name, spec_field in fields.items():
        required = spec_field.default is dataclasses.MISSING and spec_field.default_factory is dataclasses.MISSING
        if not required or name in kwargs:
            continue
        if name not in data:
            issues.append(
                SpecIssue(f"{path}.{name}" if path else name, "is required", f"add it ({_type_name(hints[name])})")
            )
        kwargs[name] = _stand_in(hints[name])
    return cls(**kwargs)


# A lone surrogate (half of a UTF-16 pair, e.g. from a JSON "\\udc80") has no UTF-8 form: the
# API request, the env block or the file that carries it fails far from here. A NUL byte ends
# a C string: an argument, a variable or a path would be cut short without a word.
_UNWRITABLE = re.compile("[\x00\ud800-\udfff]")


def check_text(data: object, path: str, issues: list[SpecIssue]) -> object:
    """``data`` with every string that holds a NUL byte or a lone surrogate reported (each with
    its field) and replaced by one that holds neither, so the rules can still read the rest."""
    if isinstance(data, str):
        found = _UNWRITABLE.search(data)
        if found is None:
            return data
        what = "a NUL byte" if found.group() == "\x00" else f"a lone surrogate (U+{ord(found.group()):04X})"
        issues.append(
            SpecIssue(path or "<spec>", f"contains {what}, which no file, variable or request can carry", "remove it")
        )
        return _UNWRITABLE.sub("\ufffd", data)
    if isinstance(data, Mapping):
        clean = {}
        for key, value in data.items():
            shown = _UNWRITABLE.sub("\ufffd", key) if isinstance(key, str) else repr(key)
            where = f"{path}.{shown}" if path else shown
            clean[check_text(key, where, issues)] = check_text(value, where, issues)
        return clean
    if isinstance(data, list | tuple):
        return [check_text(item, f"{path}[{index}]", issues) for index, item in enumerate(data)]
    return data


def _numbers_in(value: object, path: str, issues: list[SpecIssue]) -> bool:
    """A map that Kubernetes keeps as text (labels, annotations): a YAML number in it would change
    on its way there (``1.10`` becomes ``"1.1"``, ``1e3`` ``"1000.0"``), so it is refused."""
    if not isinstance(value, Mapping):
        return False
    found = False
    for key, item in value.items():
        if isinstance(item, int | float) and not isinstance(item, bool):
            found = True
            issues.append(SpecIssue(f"{path}.{key}", f"{_shown(item)} is a number, not text", f"quote it: '{item}'"))
    return found


def _stand_in(hint: Any) -> Any:
    """An empty value of a required field's type, for checking the rest of a broken spec."""
    if typing.get_origin(hint) is tuple:
        return ()
    return {str: "", int: 0, float: 0.0, bool: False}.get(hint, "")


def _kind_of(value: object) -> str:
    """What a YAML/JSON value is, in the words of those formats (not Python's type names)."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__} value"


def _shown(value: object, limit: int = 60) -> str:
    """A value as the user wrote it in YAML/JSON (null, true), cut to ``limit`` characters."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
        if isinstance(value, str):
            issues.append(SpecIssue(path, f"must be a list, got the string {_shown(value)}", _as_list_fix(value)))
            return False, None
        if not isinstance(value, list | tuple):
            issues.append(SpecIssue(path, f"must be a list, got {_kind_of(value)}", "use a YAML/JSON list"))
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
            issues.append(SpecIssue(path, f"must be a mapping, got {_kind_of(value)}", "use key: value pairs"))
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
        # At most 18 ASCII digits: int() takes any Unicode digit, and refuses 4301 or more.
        if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,18}\s*", value):
            return True, int(value)  # a templated field renders to text, e.g. "{{ params.workers }}"
    elif hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return True, value
    elif hint is str:
        if isinstance(value, str):
            return True, value
    else:
        raise TypeError(f"unsupported spec type {hint!r} at {path}")
    fix = f"give {_type_name(hint)}"
    if hint is str and isinstance(value, int | float) and not isinstance(value, bool):
        fix = f"quote it: '{value}'"
    issues.append(SpecIssue(path, f"{_shown(value)} is not {_type_name(hint)}", fix))
    return False, None


def _as_list_fix(text: str) -> str:
    """A list written as one string: show it split, as the shell would (never run by one)."""
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    if len(words) > 1 and len(text) <= 200:
        return f"write one list item per argument, e.g. {json.dumps(words)}"
    return "use a YAML/JSON list, one item per argument"


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
