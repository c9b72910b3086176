"""Argument checks shared by the layers, the model builder and the analyses: a ``ValueError`` naming the
argument and the value it got, raised before anything is built. Plain Python, no Keras."""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from typing import TypeVar

__all__ = ["check_choice", "check_fraction", "check_positive_int"]

T = TypeVar("T")


def check_positive_int(value, name: str) -> int:
    """``value`` as an ``int`` if it is an integer >= 1 (not a bool); a ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    return int(value)


def check_fraction(value, name: str, low: float = 0.0, high: float = 1.0) -> float:
    """``value`` as a ``float`` if it is a real number in ``[low, high)`` (not a bool, not NaN); a
    ``ValueError`` naming ``name`` otherwise. Rates (dropout, drop path) use the default ``[0, 1)``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value) or not low <= value < high:
        raise ValueError(f"{name} must be a number in [{low:g}, {high:g}), got {value!r}.")
    return float(value)


def check_choice(value: T, choices: Collection, name: str) -> T:
    """``value`` if it is one of ``choices``; a ``ValueError`` naming ``name`` and the choices otherwise."""
    if value not in choices:
        raise ValueError(f"Unknown {name} {value!r}; expected one of {tuple(choices)}.")
    return value
