"""One line of an lm-evaluation-harness sample log decoded as JSON, with bounds on what the JSON may hold.

Python's ``json`` recurses once per level and converts every integer, and each value costs tens of bytes: a line of
more than :data:`MAX_VALUES` values is refused before parsing, nesting past :data:`MAX_DEPTH` and integers of more
than :data:`MAX_INT_DIGITS` digits while parsing, each as one error naming the file and line.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..io.bounded_read import JsonLongInteger, JsonTooDeep, load_json
from .lm_eval_records import MAX_CHOICES, Where

#: JSON arrays and objects nested deeper than this are refused; an lm-eval record nests about 5 deep.
MAX_DEPTH = 200
#: The most JSON values and keys a line may hold; a record holds about 15 per choice (10,000 choices: 150,000).
MAX_VALUES = 1_000_000
#: Integers with more digits are refused (the default of Python's own limit on reading an int).
MAX_INT_DIGITS = 4300
#: A backslash escape in a JSON string; removed before quotes are matched.
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
#: Bytes counted at a time (the count's memory: a few bytes per byte of a block).
_COUNT_BLOCK = 1 << 16


def decode_line(data: bytes, where: Where) -> str:
    """The line as text (a byte-order mark at the start of line 1 dropped); bytes that are not UTF-8 are an error."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise where.error(f"not UTF-8 text (byte {exc.start + 1} of the line)") from None
    return text.removeprefix("\ufeff") if where.line == 1 else text


def load_record(text: str, data: bytes, where: Where) -> Any:
    """``json.loads`` of the line (``data``: its bytes) with one-line errors naming it."""
    marks = data.count(b"[") + data.count(b"{") + data.count(b",") + data.count(b":")
    if marks > MAX_VALUES:  # strings included: an upper bound
        values = count_values(data)
        if values > MAX_VALUES:
            raise where.error(_too_many_values(values, data))
    text = text.rstrip("\r\n")
    try:
        return load_json(text, max_depth=MAX_DEPTH, max_int_digits=MAX_INT_DIGITS)
    except JsonLongInteger as exc:
        raise where.error(f"an integer of {exc.digits:,} digits; tempcal reads integers of at most "
                          f"{MAX_INT_DIGITS:,} digits (an lm-eval record's are indices and counts)") from None
    except JsonTooDeep:
        raise where.error(_DEEP) from None
    except json.JSONDecodeError as exc:
        if where.line == 1 and text.strip() == "[":
            raise where.error("not JSON Lines but one JSON array (lm-eval before 0.4.3 wrote sample logs that "
                              "way); re-run lm-eval >= 0.4.3 with --log_samples") from None
        raise where.error(f"not JSON ({exc.msg} at column {exc.pos + 1})") from None


def _too_many_values(values: int, data: bytes) -> str:
    """The message for a line of too many values, with its count of requests where its keys show them."""
    requests = data.count(b'"gen_args_') - data.count(b'\\"gen_args_')  # keys (a quote in a string is escaped)
    counted = f"{requests:,} requests in 'arguments' and " if requests > MAX_CHOICES else ""
    return (f"{counted}{values:,} JSON values and keys; tempcal reads records of at most {MAX_CHOICES:,} choices "
            f"and {MAX_VALUES:,} values (lm-eval's multiple-choice records have a few choices, about 15 values "
            "each), so this is not a sample log")


_DEEP = (f"JSON nested more than {MAX_DEPTH} levels deep; an lm-eval sample record nests a few levels, so this is "
         "not a sample log")


def count_values(data: bytes) -> int:
    """The JSON values and keys in ``data``, counted by commas, colons and opening brackets outside strings (numpy, a
    block at a time)."""
    import numpy as np

    marks = np.zeros(256, dtype=bool)
    marks[list(b",:[{")] = True
    plain = _ESCAPE.sub(b"", data)  # after this every quote opens or closes a string
    inside, count = 0, 0
    for start in range(0, len(plain), _COUNT_BLOCK):
        block = np.frombuffer(plain, dtype=np.uint8, count=min(_COUNT_BLOCK, len(plain) - start), offset=start)
        quotes = block == ord('"')
        seen = np.cumsum(quotes, dtype=np.int64)
        outside = (((seen + inside) & 1) == 0) & ~quotes
        inside = (inside + int(seen[-1])) & 1
        count += int(np.count_nonzero(marks[block] & outside))
    return count


__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "MAX_VALUES", "count_values", "decode_line", "load_record"]
