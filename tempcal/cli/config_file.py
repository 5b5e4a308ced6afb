"""Reading a configuration file safely: a regular file of bounded size, opened without blocking (not /dev/zero, not a
FIFO), and nested no deeper than the TOML parser can recurse; each refusal one line naming the file."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from ..io.paths import NotRegularFile, TooLarge, read_regular
from .config_schema import ConfigError

if sys.version_info >= (3, 11):
    import tomllib as _toml
else:  # pragma: no cover - Python 3.10: the 'tomli' backport, a dependency there
    try:
        import tomli as _toml
    except ModuleNotFoundError:
        _toml = None  # type: ignore[assignment]

#: The largest configuration file read (a tempcal.toml is a few hundred bytes; a big pyproject.toml some kB).
MAX_CONFIG_BYTES = 1 << 20
_LIMIT = f"a configuration file may hold at most {MAX_CONFIG_BYTES >> 20} MiB"
#: Brackets or braces a value may be nested in (tempcal's values are at most a flat list).
MAX_NESTING = 64


def read_config_bytes(path: Path, shown: str) -> bytes:
    """The bytes of a configuration file, which must be a regular file of at most :data:`MAX_CONFIG_BYTES`
    (checked before and after a non-blocking open: see :func:`~tempcal.io.paths.read_regular`)."""
    try:
        return read_regular(path, MAX_CONFIG_BYTES)
    except NotRegularFile as exc:
        link = f" (a link to {exc.link})" if exc.link is not None else ""
        raise ConfigError(f"{shown}: {exc.kind}{link}; a configuration file must be a regular file") from None
    except TooLarge as exc:
        grown = "grew past the limit as it was read" if exc.grew else f"is {exc.size} bytes"
        raise ConfigError(f"{shown}: {grown}; {_LIMIT}") from None
    except FileNotFoundError:
        raise ConfigError(f"{shown}: {_missing(path)}") from None
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot read: {exc.strerror or exc}") from None


def _missing(path: Path) -> str:
    if os.path.islink(path):
        return f"is a link to {os.readlink(path)}, which does not exist"
    return "no such configuration file"


def parse_config(data: bytes, shown: str) -> dict[str, Any]:
    """The bytes as TOML; syntax errors carry the parser's '(at line L, column C)'."""
    if _toml is None:
        raise ConfigError(f"{shown}: reading it needs Python >= 3.11 or the 'tomli' package")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{shown}: not UTF-8 text (byte {exc.start + 1})") from None
    check_nesting(text, shown)
    try:
        parsed: dict[str, Any] = _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        raise ConfigError(f"{shown}: invalid TOML: {exc}") from None
    except RecursionError:  # the scan above refuses deep nesting first; this is the backstop
        raise ConfigError(f"{shown}: invalid TOML: nested too deeply to read") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise ConfigError(f"{shown}: invalid TOML: {exc}") from None
    return parsed


# -- nesting, before the parser recurses ----------------------------------------------------------

_TOKEN = re.compile(r'"""|\'\'\'|["\'#\[\]{}=\n]')
_TOKEN_OR_DIGITS = re.compile(r'"""|\'\'\'|["\'#\[\]{}=\n]|\d[\d_]*')
_DIGITS = re.compile(r"\d[\d_]*")
_STRING_END = {'"""': re.compile(r'(?:[^\\]|\\.)*?"""(?!")', re.S), "'''": re.compile(r"[\s\S]*?'''(?!')"),
               '"': re.compile(r'(?:[^"\\\n]|\\.)*"'), "'": re.compile(r"[^'\n]*'")}


class _Scan:
    """Where a scan of TOML text is: the line, the table, the key whose value it is in, the depth."""

    def __init__(self) -> None:
        self.line, self.line_start, self.depth = 1, 0, 0
        self.table, self.key = "", ""
        self.in_value = False

    def where(self) -> str:
        key = self.key or "?"
        return f"[{self.table}] {key}" if self.table else key


def check_nesting(text: str, shown: str) -> None:
    """Refuse a value nested in more than :data:`MAX_NESTING` brackets or braces, naming its key and line (only the
    structure is followed; whatever else is wrong is left to the parser)."""
    scan = _Scan()
    pos = 0
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    long_runs = limit and any(len(run.group()) > limit for run in _DIGITS.finditer(text))
    tokens = _TOKEN_OR_DIGITS if long_runs else _TOKEN  # digits are followed only when some run is long
    while (match := tokens.search(text, pos)) is not None:
        token, pos = match.group(), match.end()
        if token in _STRING_END:
            end = _STRING_END[token].match(text, pos)
            if end is None:
                return  # an unterminated string: the parser says where
            scan.line += text.count("\n", pos, end.end())
            pos = end.end()
        elif token == "#":
            newline = text.find("\n", pos)
            pos = len(text) if newline < 0 else newline
        elif token == "\n":
            scan.line, scan.line_start = scan.line + 1, pos
            if scan.depth == 0:
                scan.in_value, scan.key = False, ""
        elif token == "=" and scan.depth == 0 and not scan.in_value:
            scan.key, scan.in_value = text[scan.line_start:match.start()].strip(), True
        elif token in "[{" and scan.depth == 0 and not scan.in_value:
            newline = text.find("\n", pos)
            scan.table = text[match.start():len(text) if newline < 0 else newline].split("#")[0].strip(" \t[]")
            pos = len(text) if newline < 0 else newline
        elif token in "[{":
            scan.depth += 1
            if scan.depth > MAX_NESTING:
                raise ConfigError(f"{shown}: {scan.where()}: nested more than {MAX_NESTING} brackets deep (line "
                                  f"{scan.line}); a value is a number, a string, or a list of them")
        elif token in "]}":
            scan.depth = max(scan.depth - 1, 0)
        else:
            _check_digits(token, text[pos:pos + 1], limit, scan, shown)


def _check_digits(run: str, after: str, limit: int, scan: _Scan, shown: str) -> None:
    """An integer with more digits than Python converts (4300 by default) would stop the parser with a ValueError."""
    digits = len(run) - run.count("_")
    if limit and digits > limit and after not in (".", "e", "E"):  # a float of that many digits is read as inf
        raise ConfigError(f"{shown}: {scan.where()}: an integer of {digits} digits (line {scan.line}); at most "
                          f"{limit} are read")


__all__ = ["MAX_CONFIG_BYTES", "MAX_NESTING", "parse_config", "read_config_bytes"]
