"""Text files a language model is run over (``--text``, ``--ood-text``, ``--eval`` with ``--lm``): ``.txt``, a text a
line, or ``.jsonl``, a field of an object a line; read a block at a time (a line never held whole), SHA-256 kept.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import TempcalError, param, shown
from ..io.sidecar import check_regular_file

TEXT_SUFFIXES = (".txt", ".jsonl")
_BOM = b"\xef\xbb\xbf"
#: Bytes read at a time.
BLOCK_BYTES = 1 << 20
#: Characters of a text kept per token of ``--max-length``: tokens of real tokenizers cover a few characters, so the
#: first ``max_length`` tokens of a text lie well inside its first ``CHARS_PER_TOKEN * (max_length + 1)`` characters.
CHARS_PER_TOKEN = 64
#: The longest ``.jsonl`` line read (a record is parsed whole; its text is cut afterwards).
MAX_JSONL_LINE_BYTES = 64 << 20


@dataclass(frozen=True)
class Texts:
    """The texts of one file, in file order, with the line each came from and the file's SHA-256; ``cut`` says
    which texts were cut at the character budget."""

    path: Path
    texts: list[str]
    lines: list[int]
    sha256: str
    field: str | None  # the JSON field read (.jsonl), None for .txt
    cut: list[bool]

    def __len__(self) -> int:
        return len(self.texts)


def read_texts(path: str | os.PathLike, text_field: str = "text", max_chars: int | None = None) -> Texts:
    """Every text of ``path`` (``.txt`` or ``.jsonl``), checked, each cut to its first ``max_chars`` characters
    (None: kept whole); any problem is one line naming the file and line."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in TEXT_SUFFIXES:
        shown_suffix = f"suffix '{suffix}'" if suffix else "no suffix"
        raise TempcalError(f"{path}: not a text file ({shown_suffix}; expected .txt, one text per line, or .jsonl "
                           f"with the text in {param('text_field')})")
    field_name = text_field if suffix == ".jsonl" else None
    found: list[tuple[str, int, bool]] = []  # (text, line, cut)
    digest = hashlib.sha256()
    with _open_regular(path) as f:
        keep = max_chars if field_name is None else None
        for number, line in _lines(path, f, digest, keep, None if field_name is None else MAX_JSONL_LINE_BYTES):
            text = _line_text(path, number, line.text, field_name, complete=not line.cut)
            if text is not None and (line.content or field_name is not None):
                found.append((text[:max_chars], number, line.cut or (max_chars is not None and len(text) > max_chars)))
    if not found:
        raise TempcalError(f"{path}: holds no text" + (f" (no line with a non-empty '{field_name}' field)"
                                                        if field_name else " (an empty file, or only blank lines)"))
    texts, lines, cuts = (list(column) for column in zip(*found, strict=True))
    return Texts(path, texts, lines, digest.hexdigest(), field_name, cuts)


def _open_regular(path: Path):
    """``path`` opened for reading, which must be a regular file (not a folder, a pipe or a device)."""
    check_regular_file(path)
    try:
        return open(path, "rb")  # closed by the caller's ``with``
    except OSError as exc:
        raise TempcalError(f"{path}: cannot read ({exc.strerror or exc})") from None


class _Line:
    """One line being read: decoded piece by piece (so a bad byte names its column), at most ``keep`` characters
    kept, at most ``limit`` bytes accepted."""

    def __init__(self, keep: int | None, limit: int | None) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.parts: list[str] = []
        self.kept = self.fed = 0
        self.keep, self.limit = keep, limit
        self.cut = self.content = False

    def feed(self, path: Path, number: int, piece: bytes, final: bool = False) -> None:
        start = self.fed - len(self.decoder.getstate()[0])
        self.fed += len(piece)
        if self.limit is not None and self.fed > self.limit:
            raise TempcalError(f"{path}: line {number}: longer than {self.limit} bytes, the most tempcal reads of "
                               "one line")
        try:
            text = self.decoder.decode(piece, final)
        except UnicodeDecodeError as exc:
            raise TempcalError(f"{path}: line {number}: not UTF-8 text (byte {start + exc.start + 1} of the "
                               "line)") from None
        self.content = self.content or bool(text.strip())
        room = len(text) if self.keep is None else max(self.keep - self.kept, 0)
        if room < len(text):
            self.cut, text = True, text[:room]
        if text:
            self.parts.append(text)
            self.kept += len(text)

    @property
    def text(self) -> str:
        return "".join(self.parts)


def _lines(path: Path, f, digest, keep: int | None, limit: int | None) -> Iterator[tuple[int, _Line]]:
    """Each line of ``f`` (a byte-order mark at the start dropped, a trailing ``\\r`` dropped) as a :class:`_Line`;
    every byte goes into ``digest``."""
    number, line, first = 1, _Line(keep, limit), True
    while block := f.read(BLOCK_BYTES):
        digest.update(block)
        if first and block.startswith(_BOM):
            block = block[len(_BOM):]
        first = False
        pos = 0
        while (end := block.find(b"\n", pos)) >= 0:
            yield number, _finished(path, number, line, block[pos:end])
            number, line, pos = number + 1, _Line(keep, limit), end + 1
        line.feed(path, number, block[pos:])
    yield number, _finished(path, number, line, b"")


def _finished(path: Path, number: int, line: _Line, piece: bytes) -> _Line:
    line.feed(path, number, piece, final=True)
    if not line.cut and line.parts and line.parts[-1].endswith("\r"):
        line.parts[-1] = line.parts[-1][:-1]
    return line


def _line_text(path: Path, number: int, line: str, field: str | None, *, complete: bool = True) -> str | None:
    """The text of one line (None: a line with nothing to read; a cut line of ``.txt`` is never blank)."""
    if field is None:
        return line if line.strip() or not complete else None
    if not line.strip():
        return None
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
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # JSON's \ud800 escapes decode to lone surrogates, which are not text
        raise TempcalError(f"{path}: line {number}: '{field}' holds a lone surrogate "
                           f"({value[exc.start]!r} at character {exc.start + 1}), not Unicode text") from None
    return value or None


def _json_kind(value: object) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


__all__ = ["CHARS_PER_TOKEN", "Texts", "read_texts"]
