"""One line of an lm-evaluation-harness sample log decoded as JSON, with bounds on what the JSON may hold.

Python's ``json`` recurses once per level of nesting and converts every integer it meets, so a
line nested 100,000 deep stops it with ``RecursionError`` and a 5,000-digit number with
``ValueError`` (Python's limit on converting digits to ``int``). Here nesting deeper than
:data:`MAX_DEPTH` is refused before parsing (a vectorised count of brackets outside strings, run
only on lines with that many brackets), and an integer of more than :data:`MAX_INT_DIGITS` digits
while parsing; each is one :class:`~.lm_eval_records.LmEvalLogError` naming the file and line.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .lm_eval_records import Where

#: JSON arrays and objects nested deeper than this are refused; an lm-eval record nests about 5 deep.
MAX_DEPTH = 200
#: Integers with more digits are refused (the default of Python's own limit on reading an int).
MAX_INT_DIGITS = 4300
#: A JSON string (escapes included); removed before brackets are counted.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: Bytes counted at a time by the depth check (its memory: about 10 bytes per byte of a block).
_DEPTH_BLOCK = 1 << 20


class _HugeInteger(Exception):
    """An integer with too many digits, met while parsing."""


def decode_line(data: bytes, where: Where) -> str:
    """The line as text (a byte-order mark at the start of line 1 dropped); bytes that are not UTF-8 are an error."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise where.error(f"not UTF-8 text (byte {exc.start + 1} of the line)") from None
    return text.removeprefix("\ufeff") if where.line == 1 else text


def load_record(text: str, data: bytes, where: Where) -> Any:
    """``json.loads`` of the line (``data``: its bytes) with one-line errors naming it."""
    text = text.rstrip("\r\n")
    if too_deep(data, MAX_DEPTH):
        raise where.error(_deep_message())
    try:
        return json.loads(text, parse_int=_parse_int)
    except _HugeInteger as exc:
        raise where.error(f"an integer of {exc.args[0]:,} digits; tempcal reads integers of at most "
                          f"{MAX_INT_DIGITS:,} digits (an lm-eval record's are indices and counts)") from None
    except RecursionError:  # not expected after the depth check; kept so that no input can escape as a traceback
        raise where.error(_deep_message()) from None
    except json.JSONDecodeError as exc:
        if where.line == 1 and text.strip() == "[":
            raise where.error("not JSON Lines but one JSON array (lm-eval before 0.4.3 wrote sample logs that "
                              "way); re-run lm-eval >= 0.4.3 with --log_samples") from None
        raise where.error(f"not JSON ({exc.msg} at column {exc.pos + 1})") from None
    except ValueError as exc:  # anything else json refuses (an integer over a lower int limit set by the program)
        raise where.error(f"not JSON ({exc})") from None


def _deep_message() -> str:
    return (f"JSON nested more than {MAX_DEPTH} levels deep; an lm-eval sample record nests a few levels, so this "
            "is not a sample log (or is damaged)")


def _parse_int(digits: str) -> int:
    """``int`` for json, refusing a number of more than :data:`MAX_INT_DIGITS` digits before converting it."""
    count = len(digits) - digits.startswith("-")
    if count > MAX_INT_DIGITS:
        raise _HugeInteger(count)
    try:
        return int(digits)
    except ValueError:  # the program lowered Python's limit
        raise _HugeInteger(count) from None


def too_deep(data: bytes, limit: int) -> bool:
    """Whether JSON arrays and objects in ``data`` nest more than ``limit`` deep (brackets in strings not counted).

    A line with at most ``limit`` opening brackets cannot, so most lines cost two ``bytes.count``.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    import numpy as np

    structure = _STRING.sub(b"", data)
    depth = 0
    for start in range(0, len(structure), _DEPTH_BLOCK):
        block = np.frombuffer(structure, dtype=np.uint8, count=min(_DEPTH_BLOCK, len(structure) - start),
                              offset=start)
        steps = ((block == ord("[")) | (block == ord("{"))).astype(np.int64)
        steps -= (block == ord("]")) | (block == ord("}"))
        levels = np.cumsum(steps)
        if depth + int(levels.max()) > limit:
            return True
        depth += int(levels[-1])
    return False


__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "decode_line", "load_record", "too_deep"]
