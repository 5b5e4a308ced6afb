"""JSON output: to a file (atomically) or, for ``-``, to standard output and nothing else there."""

from __future__ import annotations

import json
import sys

from ..errors import param


def emit_json(target: str | None, payload: dict) -> None:
    """Write ``payload`` to ``target`` (a path, ``-`` for standard output, or None for nowhere)."""
    if target is None:
        return
    text = json.dumps(payload, indent=2, allow_nan=False) + "\n"
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from ..io.atomic import write_text_atomic

    write_text_atomic(target, text, what=param("json"))


__all__ = ["emit_json"]
