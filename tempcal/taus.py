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
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise TempcalError(f"--tau {text}: expected a number > 0 or 'fitted'")
    return value


def check_taus(values: Iterable[str | float], source: str | os.PathLike = "SOURCE") -> None:
    """Refuse a bad number before any file is read (``fitted`` is resolved once the file is open)."""
    for text in values:
        if not is_fitted(text):
            parse_tau(text, None, source)


__all__ = ["check_taus", "is_fitted", "parse_tau"]
