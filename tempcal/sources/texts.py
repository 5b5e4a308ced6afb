"""Text files a language model is run over (``--text``, ``--ood-text``, ``--eval`` with ``--lm``).

``.txt``: one text per line (a trailing ``\\r`` dropped; lines holding only whitespace skipped).
``.jsonl``: one JSON object per line, the text in its field ``--text-field`` (default ``text``); blank
lines and empty texts skipped. The file must be UTF-8 (a byte-order mark at its start is dropped); a
line that is not a JSON object, a missing field or one that is not a string, and a file with no text
at all are bad input naming the file and the line. The file's SHA-256 is kept, so that the record of
a fit names the exact texts it was fitted on.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import TempcalError, param
from ..io.safetensors_header import shown

TEXT_SUFFIXES = (".txt", ".jsonl")
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class Texts:
    """The texts of one file, in file order, with the line each came from and the file's SHA-256."""

    path: Path
    texts: list[str]
    lines: list[int]
    sha256: str
    field: str | None  # the JSON field read (.jsonl), None for .txt

    def __len__(self) -> int:
        return len(self.texts)


def is_text_file(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() in TEXT_SUFFIXES


def read_texts(path: str | os.PathLike, text_field: str = "text") -> Texts:
    """Every text of ``path`` (``.txt`` or ``.jsonl``), checked; any problem is one line naming the file and line."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in TEXT_SUFFIXES:
        shown_suffix = f"suffix '{suffix}'" if suffix else "no suffix"
        raise TempcalError(f"{path}: not a text file ({shown_suffix}; expected .txt, one text per line, or .jsonl "
                           f"with the text in {param('text_field')})")
    raw = _read_bytes(path)
    field = text_field if suffix == ".jsonl" else None
    texts: list[str] = []
    lines: list[int] = []
    for number, line in enumerate(_decoded_lines(path, raw), start=1):
        text = _line_text(path, number, line, field)
        if text is not None:
            texts.append(text)
            lines.append(number)
    if not texts:
        raise TempcalError(f"{path}: holds no text" + (f" (no line with a non-empty '{field}' field)" if field else
                                                        " (an empty file, or only blank lines)"))
    return Texts(path, texts, lines, hashlib.sha256(raw).hexdigest(), field)


def _read_bytes(path: Path) -> bytes:
    """The whole file, which must be a regular file (not a folder, a pipe or a device)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise TempcalError(f"{path}: no such file") from None
    except OSError as exc:
        raise TempcalError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(mode):
        raise TempcalError(f"{path}: not a regular file")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TempcalError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _decoded_lines(path: Path, raw: bytes) -> list[str]:
    """The file's lines as text (a byte-order mark at the start dropped); bytes that are not UTF-8 name their line."""
    body = raw[len(_BOM):] if raw.startswith(_BOM) else raw
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = body.count(b"\n", 0, exc.start) + 1
        column = exc.start - (body.rfind(b"\n", 0, exc.start) + 1) + 1
        raise TempcalError(f"{path}: line {line}: not UTF-8 text (byte {column} of the line)") from None
    return text.split("\n")


def _line_text(path: Path, number: int, line: str, field: str | None) -> str | None:
    """The text of one line (None: a line with nothing to read)."""
    line = line.removesuffix("\r")
    if not line.strip():
        return None
    if field is None:
        return line
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        raise TempcalError(f"{path}: line {number}: not valid JSON") from None
    if not isinstance(record, dict):
        raise TempcalError(f"{path}: line {number}: a JSON {_json_kind(record)}, not an object holding '{field}'")
    if field not in record:
        keys = ", ".join(shown(k) for k in list(record)[:10]) or "none"
        raise TempcalError(f"{path}: line {number}: no field '{field}' (fields: {keys}; choose one with "
                           f"{param('text_field')})")
    value = record[field]
    if not isinstance(value, str):
        raise TempcalError(f"{path}: line {number}: '{field}' is {shown(value)}, not a string")
    return value or None


def _json_kind(value: object) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


__all__ = ["TEXT_SUFFIXES", "Texts", "is_text_file", "read_texts"]
