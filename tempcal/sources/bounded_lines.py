"""The lines of a byte stream read in fixed blocks, each bounded in length (``readline`` would hold a hostile line
whole): :class:`OverLimit` is raised as soon as a line or a run of blank lines passes the limit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

#: Bytes asked of the stream at a time: the memory the reader needs on top of the line it holds.
BLOCK_BYTES = 1 << 20
#: The first window searched for the end of a run of whitespace; each next one is twice as wide.
_FIRST_WINDOW = 64


class OverLimit(Exception):
    """A line, or a run of blank lines, longer than the limit: ``first`` to ``line`` (1-based)."""

    def __init__(self, line: int, first: int, blank: bool, limit: int) -> None:
        super().__init__(line, first, blank, limit)
        self.line, self.first, self.blank, self.limit = line, first, blank, limit


class BoundedLines:
    """``(line number, line without its newline)`` per line with content of ``stream`` (leading whitespace carried from
    an earlier block comes back as spaces); ``line`` is the line being read, for messages on the stream's failures."""

    def __init__(self, stream: BinaryIO, limit: int, block: int = BLOCK_BYTES) -> None:
        self.stream, self.limit, self.block = stream, limit, block
        self.line = 1
        self._blank = 0  # whitespace bytes in a row since the last line with content
        self._blank_from = 1  # the first line of that run
        self._lead = 0  # whitespace bytes of the current line before its content
        self._pending: list[bytes] | None = None  # the current line's content so far, once it has some
        self._size = 0  # its length in bytes, leading whitespace included

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        while chunk := self.stream.read(self.block):
            pos = 0
            while pos < len(chunk):
                if self._pending is None:
                    pos = self._skip_blank(chunk, pos)
                    continue
                end = chunk.find(b"\n", pos)
                self._extend(chunk[pos:] if end < 0 else chunk[pos:end])
                if end < 0:
                    break
                yield self._finish()
                pos = end + 1
        if self._pending is not None:
            yield self._finish()

    def _skip_blank(self, chunk: bytes, pos: int) -> int:
        """Pass the whitespace from ``pos`` (counting its newlines); return where content starts, or the end."""
        stop = _blank_end(chunk, pos)
        if self._blank + stop - pos > self.limit:  # name the line of the byte that passes the limit
            passing = pos + self.limit - self._blank
            raise OverLimit(self.line + chunk.count(b"\n", pos, passing), self._blank_from, True, self.limit)
        self._blank += stop - pos
        newlines = chunk.count(b"\n", pos, stop)
        if newlines:
            self.line += newlines
            self._lead = stop - chunk.rfind(b"\n", pos, stop) - 1
        else:
            self._lead += stop - pos
        if stop < len(chunk):
            self._pending = [b" " * self._lead] if self._lead else []
            self._size = self._lead
        return stop

    def _extend(self, piece: bytes) -> None:
        """Add ``piece`` to the current line, refusing it once it is longer than the limit."""
        self._size += len(piece)
        if self._size > self.limit:
            raise OverLimit(self.line, self.line, False, self.limit)
        assert self._pending is not None
        self._pending.append(piece)

    def _finish(self) -> tuple[int, bytes]:
        """The current line, and the reader set at the start of the next one."""
        assert self._pending is not None
        done = (self.line, b"".join(self._pending))
        self._pending, self._size, self._lead, self._blank = None, 0, 0, 0
        self.line += 1
        self._blank_from = self.line
        return done


def _blank_end(chunk: bytes, pos: int) -> int:
    """Where the ASCII whitespace from ``pos`` ends (``len(chunk)`` if it runs to the end): ``bytes.lstrip`` over
    windows that double in width, so the work stays within twice the run's length."""
    width = _FIRST_WINDOW
    while pos < len(chunk):
        window = chunk[pos:pos + width]
        rest = window.lstrip()
        if rest:
            return pos + len(window) - len(rest)
        pos += len(window)
        width *= 2
    return pos


__all__ = ["BoundedLines", "OverLimit"]
