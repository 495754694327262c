"""Kubernetes quantities: CPU cores from ``2``, ``0.5`` or ``"500m"``, and back."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from airflow_mpi.exceptions import SpecIssue

# [0-9], not \d (which takes any Unicode digit), and \Z, not $ (which allows a final newline).
QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|e[0-9]+)?\Z")
CPU_MILLI = Decimal("0.001")
# Bounds checked before any arithmetic: ``Decimal`` works on huge exponents for seconds (a cpu of
# "1e1000000" took 34 s to judge) and overflows past its own range. Kubernetes itself stops near
# 2**63 (9.2E), so nothing real comes close.
MAX_QUANTITY_CHARS = 40
MAX_EXPONENT = 18
MAX_MEMORY = Decimal(1024) ** 5  # bytes per pod: 1Pi, more than any node has


def quantity_bound_problem(value: object) -> str | None:
    """Why a quantity (text or number) is too large to work with, or None."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**MAX_EXPONENT:
        return (
            f"is {len(str(abs(value))) if abs(value) < 10**1000 else 'over 1000'} digits long (at most {MAX_EXPONENT})"
        )
    if not isinstance(value, str):
        return None
    if len(value) > MAX_QUANTITY_CHARS:
        return f"is {len(value)} characters long (at most {MAX_QUANTITY_CHARS})"
    match = QUANTITY.match(value)
    suffix = (match.group(3) or "") if match else ""
    if suffix.startswith("e") and int(suffix[1:]) > MAX_EXPONENT:
        return f"has the exponent {suffix[1:]} (at most {MAX_EXPONENT})"
    return None


def is_quantity(value: object) -> bool:
    """A Kubernetes quantity such as ``8Gi``, ``512Mi`` or ``500m``."""
    return isinstance(value, str) and bool(QUANTITY.match(value))


def shown_quantity(value: object) -> str:
    """A value for a message, cut: a refused quantity may be megabytes long."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**MAX_QUANTITY_CHARS:
        return "a number of more than 40 digits"
    text = repr(value)
    return text if len(text) <= MAX_QUANTITY_CHARS + 2 else text[:MAX_QUANTITY_CHARS] + "..."


def parse_cpu(value: object) -> Decimal | None:
    """Cores from ``2``, ``0.5``, ``"2"`` or ``"500m"``; ``None`` if it is not a CPU quantity."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if quantity_bound_problem(value) is not None:
            return None
        try:
            cores = Decimal(str(value))
        except InvalidOperation:
            return None
        return cores if cores.is_finite() else None
    if isinstance(value, str) and QUANTITY.match(value):
        if quantity_bound_problem(value) is not None:
            return None
        if value.endswith("m"):
            return Decimal(value[:-1]) / 1000
        if value[-1].isdigit() or "." in value:
            try:
                return Decimal(value)
            except InvalidOperation:
                return None
    return None


def check_memory(path: str, value: object, example: str = "'8Gi' or '512Mi'") -> list[SpecIssue]:
    """A memory quantity within what a node can have, judged in bounded time."""
    if not (isinstance(value, str) and QUANTITY.match(value)):
        return [SpecIssue(path, f"{shown_quantity(value)} is not a memory quantity", f"use e.g. {example}")]
    bound = quantity_bound_problem(value)
    amount = parse_quantity(value) if bound is None else None
    if bound is not None or (amount is not None and amount > MAX_MEMORY):
        problem = bound or "is more than any node has"
        return [SpecIssue(path, f"{shown_quantity(value)} {problem}", f"use e.g. {example}, at most '1Pi'")]
    return []


def render_cpu(cores: Decimal) -> str:
    """Kubernetes quantity for a number of cores: ``2`` or ``500m``."""
    if cores == cores.to_integral_value():
        return str(int(cores))
    return f"{int((cores * 1000).to_integral_value())}m"


_SUFFIXES = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate(("k", "M", "G", "T", "P", "E"))},
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


def parse_quantity(value: object) -> Decimal | None:
    """Any Kubernetes quantity (``8Gi``, ``500m``, ``2``, ``1e3``) as a plain number; else ``None``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return parse_cpu(value)
    if not isinstance(value, str):
        return None
    match = QUANTITY.match(value)
    if not match or quantity_bound_problem(value) is not None:
        return None
    number, suffix = Decimal(match.group(1)), match.group(3) or ""
    if suffix.startswith("e"):
        return number * Decimal(10) ** int(suffix[1:])
    return number * _SUFFIXES[suffix]


def render_quantity(amount: Decimal) -> str:
    """The shortest exact quantity for an amount: ``64Gi``, ``1500m``, ``3``."""
    if amount != amount.to_integral_value():
        return render_cpu(amount)
    whole = int(amount)
    candidates = [str(whole)]
    for suffix in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E"):
        unit = int(_SUFFIXES[suffix])
        if whole and whole % unit == 0:
            candidates.append(f"{whole // unit}{suffix}")
    return min(candidates, key=len)
