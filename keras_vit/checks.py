"""Argument checks shared by the layers, the model builder and the analyses: a ``ValueError`` naming the
argument and the value it got, raised before anything is built. Plain Python, no Keras."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Collection
from typing import Any, TypeVar, cast

__all__ = [
    "check_bool",
    "check_choice",
    "check_count",
    "check_fraction",
    "check_names",
    "check_pair",
    "check_positive_int",
    "check_positive_number",
    "optional",
]

T = TypeVar("T")


def check_positive_int(value, name: str) -> int:
    """``value`` as an ``int`` if it is an integer >= 1 (not a bool); a ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    return int(value)


def check_count(value, name: str) -> int:
    """``value`` as an ``int`` if it is an integer >= 0 (not a bool); a ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}.")
    return int(value)


def check_positive_number(value, name: str) -> float:
    """``value`` as a ``float`` if it is a real number > 0 (not a bool, not NaN); a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}.")
    return float(value)


def check_pair(value, name: str) -> tuple[int, int]:
    """``(h, w)`` from a positive int or a pair of them; a ``ValueError`` naming ``name`` and the value for
    anything else (0, negative sizes, bools)."""
    pair = (value, value) if not isinstance(value, (tuple, list)) else tuple(value)
    if len(pair) != 2 or not all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) and cast(int, v) >= 1 for v in pair
    ):
        raise ValueError(f"`{name}` must be an int or a pair of ints (height, width), all positive, got {value!r}.")
    return (int(pair[0]), int(pair[1]))


def check_bool(value, name: str) -> bool:
    """``value`` if it is ``True`` or ``False``; a ``ValueError`` naming ``name`` otherwise."""
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be True or False, got {value!r}.")
    return value


def optional(check: Callable[[Any, str], T]) -> Callable[[Any, str], T | None]:
    """``check`` that lets ``None`` through (an option that is off)."""

    def check_or_none(value, name: str):
        return None if value is None else check(value, name)

    return check_or_none


def check_fraction(value, name: str) -> float:
    """``value`` as a ``float`` if it is a real number in ``[0, 1)`` (a rate; not a bool, not NaN); a ``ValueError``
    naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= cast(float, value) < 1:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}.")  # NaN fails the comparison too
    return float(value)


def check_choice(value: T, choices: Collection, name: str) -> T:
    """``value`` if it is one of ``choices``; a ``ValueError`` naming ``name`` and the choices otherwise."""
    if value not in choices:
        raise ValueError(f"Unknown {name} {value!r}; expected one of {tuple(choices)}.")
    return value


def check_names(value, name: str) -> tuple[str, ...]:
    """``value`` as a tuple of distinct, non-empty strings (class names); a ``ValueError`` naming ``name`` otherwise."""
    names = tuple(value) if isinstance(value, (tuple, list)) else None
    if not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise ValueError(f"{name} must be a list of non-empty strings, got {value!r}.")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{name} must be distinct; repeated: {repeated}.")
    return names
