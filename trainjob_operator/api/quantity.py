"""Kubernetes resource quantities: the one grammar and the one parser.

The API models validate quantities with :data:`QUANTITY_PATTERN` (also the CRD's schema
pattern), the renderers turn them into Ray CPU counts and the in-pod driver into worker CPUs,
all with :func:`parse_quantity`. Standard library only.
"""

from __future__ import annotations

import math
import re

__all__ = ["QUANTITY_PATTERN", "QUANTITY_RE", "SUFFIXES", "logical_cpus", "parse_quantity"]

QUANTITY_PATTERN = (
    r"^(\+)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""The Kubernetes resource quantity grammar (non-negative quantities only).

Group 2 is the number, group 6 the suffix (binary ``Ki``..., decimal ``m``, ``k``... or an
exponent ``e3``)."""
QUANTITY_RE = re.compile(QUANTITY_PATTERN)

SUFFIXES: dict[str, float] = {
    "": 1.0,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}
"""The multiplier of each suffix."""


def parse_quantity(value: int | str) -> float:
    """A Kubernetes quantity as a number (``"500m"`` -> 0.5, ``"2"`` -> 2.0, ``4`` -> 4.0,
    ``"1Gi"`` -> 1073741824.0, ``"1e3"`` -> 1000.0).

    Raises:
        ValueError: for a string that is not a quantity.
    """
    if isinstance(value, int):
        return float(value)
    match = QUANTITY_RE.match(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    number, suffix = match.group(2), match.group(6) or ""
    if suffix[:1] in ("e", "E"):
        return float(number + suffix)
    return float(number) * SUFFIXES[suffix]


def logical_cpus(quantity: int | str | None) -> int:
    """The Ray logical CPUs a pod with this ``cpu`` quantity advertises: rounded up, at least 1
    (1 without one). ``"500m"`` -> 1, ``"2"`` -> 2, ``"2500m"`` -> 3."""
    if quantity is None:
        return 1
    return max(1, math.ceil(parse_quantity(quantity) - 1e-9))
