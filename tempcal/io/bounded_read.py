"""Reading untrusted JSON with bounds on its nesting and integer digits; each refusal an exception carrying the line
and column the caller's one-line message names (the file itself is read by :func:`tempcal.io.paths.read_regular`)."""

from __future__ import annotations

import json
import re
from typing import Any

from .paths import BoundedReadError

#: A JSON string (skipped) or a bracket.
_BRACKETS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


class _Placed(BoundedReadError):
    """A refusal at a place in JSON text: ``line`` and ``column`` (1-based), None when it was not found."""

    def __init__(self, message: str, line: int | None, column: int | None) -> None:
        self.line, self.column = line, column
        super().__init__(message)

    @property
    def at(self) -> str:
        """"line L column C: " to start a message with, or "" when the place is not known."""
        return f"line {self.line} column {self.column}: " if self.line is not None else ""


class JsonTooDeep(_Placed):
    """Arrays and objects nested deeper than allowed; the place is the first bracket past the limit."""


class JsonLongInteger(_Placed):
    """An integer of ``digits`` digits, more than allowed (or than Python converts); the place is where it starts."""

    def __init__(self, digits: int, line: int | None, column: int | None) -> None:
        self.digits = digits
        super().__init__(f"an integer of {digits} digits", line, column)


def load_json(text: str, *, max_depth: int, max_int_digits: int) -> Any:
    """``json.loads(text)``, refusing nesting deeper than ``max_depth`` (:class:`JsonTooDeep`, before any other
    refusal) and integers of more than ``max_int_digits`` digits (:class:`JsonLongInteger`)."""
    def bounded_int(digits: str) -> int:
        count = len(digits) - digits.startswith("-")
        try:
            if count <= max_int_digits:
                return int(digits)
        except ValueError:  # the program lowered Python's own limit below ``max_int_digits``
            pass
        raise JsonLongInteger(count, None, None)

    brackets = text.count("[") + text.count("{")
    try:
        value = json.loads(text, parse_int=bounded_int)
    except (JsonLongInteger, json.JSONDecodeError, RecursionError) as exc:
        if brackets > max_depth:
            _refuse_depth(text, max_depth)
        if isinstance(exc, JsonLongInteger):
            raise JsonLongInteger(exc.digits, *_line_column(text, _long_integer_at(text, exc.digits))) from None
        if isinstance(exc, RecursionError):  # past Python's stack yet not past ``max_depth``: over the stack's limit
            raise JsonTooDeep(f"nested more than {max_depth} levels deep", None, None) from None
        raise
    if brackets > max_depth and deeper_than(value, max_depth):
        _refuse_depth(text, max_depth)
    return value


def deeper_than(value: Any, limit: int) -> bool:
    """Whether the arrays and objects of a parsed JSON value nest more than ``limit`` deep (a level at a time)."""
    level, depth = [value] if isinstance(value, (list, dict)) else [], 1
    while level:
        if depth > limit:
            return True
        level = [child for item in level for child in (item.values() if isinstance(item, dict) else item)
                 if isinstance(child, (list, dict))]
        depth += 1
    return False


def _refuse_depth(text: str, limit: int) -> None:
    """Raise :class:`JsonTooDeep` at the first bracket past ``limit`` (strings skipped), if there is one."""
    depth = 0
    for match in _BRACKETS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > limit:
                raise JsonTooDeep(f"nested more than {limit} levels deep", *_line_column(text, match.start())) from None
        elif token in "]}":
            depth -= 1


def _long_integer_at(text: str, digits: int) -> int | None:
    """Where the first integer of at least ``digits`` digits (outside strings) starts, if found."""
    pattern = re.compile(rf'"[^"\\]*(?:\\.[^"\\]*)*"|(?<![\d.eE+-])(-?\d{{{digits},}})(?![\d.eE])')
    found = next((m for m in pattern.finditer(text) if m.group(1)), None)
    return found.start(1) if found is not None else None


def _line_column(text: str, at: int | None) -> tuple[int | None, int | None]:
    if at is None:
        return None, None
    return text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)


__all__ = ["JsonLongInteger", "JsonTooDeep", "deeper_than", "load_json"]
