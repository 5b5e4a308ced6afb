"""Exceptions whose messages are shown to users as one line."""

from __future__ import annotations


class TempcalError(ValueError):
    """Bad input or usage: the CLI prints the message on one line and exits with status 2."""


class DataError(TempcalError):
    """The logits or labels themselves are invalid (NaN, out-of-range label, ...)."""
