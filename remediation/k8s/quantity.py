"""Kubernetes resource quantities (``500m``, ``16Gi``, ``1e3``, ``2``) as :class:`~decimal.Decimal`."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["format_quantity", "parse_quantity"]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_QUANTITY = re.compile(
    r"^\s*([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)\s*$"
)


def parse_quantity(value: object) -> Decimal | None:
    """``value`` (a quantity string or a number) as a Decimal; ``None`` when it is not a quantity."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str):
        return None
    match = _QUANTITY.match(value)
    if match is None:
        return None
    number, exponent, suffix = match.groups()
    try:
        base = Decimal(number)
        if exponent:
            return base * (Decimal(10) ** int(exponent[1:]))
        if suffix in _BINARY:
            return base * _BINARY[suffix]
        return base * _DECIMAL[suffix or ""]
    except (InvalidOperation, ValueError):
        return None


def format_quantity(value: Decimal, resource: str) -> str:
    """A readable quantity: CPU in cores or millicores, memory in Gi/Mi, counts as integers."""
    if resource == "cpu":
        if value == value.to_integral_value():
            return str(int(value))
        return f"{int(value * 1000)}m"
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        for unit in ("Gi", "Mi", "Ki"):
            size = _BINARY[unit]
            if value >= size:
                shown = value / size
                return f"{shown.quantize(Decimal('0.1')).normalize():f}{unit}"
        return f"{int(value)}"
    if value == value.to_integral_value():
        return str(int(value))
    return f"{value.normalize():f}"
