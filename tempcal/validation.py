"""Temperatures as users give them (``--tau``): a number > 0, or ``fitted`` for the T stored in the file."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

from .errors import TempcalError


def is_fitted(text: str | float) -> bool:
    """True for ``fitted`` (any case, surrounding spaces ignored)."""
    return isinstance(text, str) and text.strip().lower() == "fitted"


def parse_tau(text: str | float, stored: float | None, source: str | os.PathLike = "SOURCE") -> float:
    """A temperature from ``--tau``: a finite number > 0, or ``fitted`` for the T stored in ``source``."""
    if is_fitted(text):
        if stored is None:
            raise TempcalError(f"--tau fitted: {source} has no stored temperature (metadata 'tempcal.temperature'; "
                               "run tempcal fit first)")
        return float(stored)
    value = positive_number(text)
    if value is None:
        raise TempcalError(f"--tau {text}: expected a number > 0 or 'fitted'")
    return value


def as_temperature(value: object) -> float:
    """``value`` as a temperature for the Python API: a finite number > 0, else TempcalError."""
    number = positive_number(value)
    if number is None:
        raise TempcalError(f"temperature must be a positive finite number, got {value}")
    return number


def positive_number(value: object) -> float | None:
    """``value`` (text or a number) as a finite float > 0, or None when it is not one."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def check_taus(values: Iterable[str | float], source: str | os.PathLike = "SOURCE") -> None:
    """Refuse a bad number before any file is read (``fitted`` is resolved once the file is open)."""
    for text in values:
        if not is_fitted(text):
            parse_tau(text, None, source)


__all__ = ["as_temperature", "check_taus", "is_fitted", "parse_tau", "positive_number"]
