"""Kubernetes quantities: CPU cores from ``2``, ``0.5`` or ``"500m"``, and back."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# [0-9], not \d (which takes any Unicode digit), and \Z, not $ (which allows a final newline).
QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|e[0-9]+)?\Z")
CPU_MILLI = Decimal("0.001")


def is_quantity(value: object) -> bool:
    """A Kubernetes quantity such as ``8Gi``, ``512Mi`` or ``500m``."""
    return isinstance(value, str) and bool(QUANTITY.match(value))


def parse_cpu(value: object) -> Decimal | None:
    """Cores from ``2``, ``0.5``, ``"2"`` or ``"500m"``; ``None`` if it is not a CPU quantity."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            cores = Decimal(str(value))
        except InvalidOperation:
            return None
        return cores if cores.is_finite() else None
    if isinstance(value, str) and QUANTITY.match(value):
        if value.endswith("m"):
            return Decimal(value[:-1]) / 1000
        if value[-1].isdigit() or "." in value:
            try:
                return Decimal(value)
            except InvalidOperation:
                return None
    return None


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
    if not match:
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
