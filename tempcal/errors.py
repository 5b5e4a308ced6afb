"""Exceptions whose messages are shown to users as one line.

Messages name the option or argument concerned with :func:`param`: Python callers read the
argument's name (``labels_key``), the command line its flag (``--labels-key``), from the same
message. The exit statuses are mapped once, in ``tempcal.cli.main``.
"""

from __future__ import annotations

import re

_MARK = "\x1f"
_PARAM = re.compile(f"{_MARK}([A-Za-z0-9_]+){_MARK}")


def param(name: str) -> str:
    """The parameter ``name`` (a Python argument name) marked inside a message."""
    return f"{_MARK}{name}{_MARK}"


def render(message: str, *, flags: bool) -> str:
    """A message with its parameters shown as command-line flags (``--labels-key``) or argument names."""
    return _PARAM.sub(lambda m: f"--{m.group(1).replace('_', '-')}" if flags else m.group(1), message)


class Note(str):
    """A warning's text: reads as the Python message; ``raw`` keeps the parameter marks, so the CLI can show flags."""

    raw: str

    def __new__(cls, raw: str) -> Note:
        note = super().__new__(cls, render(raw, flags=False))
        note.raw = raw
        return note


class Info(Note):
    """A remark rather than a warning (say, how many groups had no fitting rows): the CLI shows it as ``note:``,
    and not under ``--quiet``; the JSON lists it among the warnings all the same."""


class StoredNote(Note):
    """A note about the stored T alone (ignored: fitted under other options, or stale): said by the commands that
    would use that T, left out by a fit, which replaces it."""


#: Characters that reorder the text around them (bidirectional embeddings, overrides, isolates and marks): a file
#: or group name holding U+202E would show the rest of a line reversed. Every console line and page shows them as
#: escapes (``\u202e``).
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_BIDI_ESCAPES = str.maketrans({c: f"\\u{ord(c):04x}" for c in BIDI_CONTROLS})


def neutral(text: str) -> str:
    """``text`` with its bidirectional control characters written as escapes, so that they show, not act."""
    return text.translate(_BIDI_ESCAPES)


def for_cli(text: str) -> str:
    """A message or warning as the command line shows it."""
    return render(getattr(text, "raw", text), flags=True)


class TempcalError(ValueError):
    """Bad input or usage: the CLI prints the message on one line and exits with status 2."""

    @property
    def raw(self) -> str:
        """The message with its parameter marks (see :func:`param`)."""
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return render(self.raw, flags=False)

    def for_cli(self) -> str:
        """The message as the command line shows it: parameters as flags."""
        return render(self.raw, flags=True)

    def prefixed(self, prefix: str) -> TempcalError:
        """The same error (same class) with ``prefix`` (e.g. a file name) in front of its message."""
        return type(self)(prefix + self.raw)


class DataError(TempcalError):
    """The logits or labels themselves are invalid (NaN, out-of-range label, ...)."""


__all__ = ["BIDI_CONTROLS", "DataError", "Info", "Note", "StoredNote", "TempcalError", "for_cli", "neutral", "param",
           "render"]
