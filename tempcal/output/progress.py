"""A progress line on standard error for work that may run long, shown only where a person is watching.

:class:`Progress` shows nothing for the first ``delay`` seconds (a short run stays as quiet as before),
then one transient line: what is running, the latest step and the time since it began; or, given a
``total``, a bar of how much of it is done and the time left (a language model's passes). It draws only on
a terminal: with ``enabled=False`` (``--quiet``, ``--json -``) or when standard error is not a terminal
(a CI log, a file, a pipe) it shows nothing at all, so logs hold no bar frames; under torch.distributed
only rank 0 draws. It never writes to standard output. The line is drawn by a rich live display, started
by a timer, so a slow first step shows the line too; it is erased when the work ends.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, ProgressColumn, SpinnerColumn, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress
from rich.table import Column
from rich.text import Text

from ..core.distributed import rank

#: Seconds of silence before the line appears.
DELAY = 2.0


class Progress:
    """A context manager: ``with Progress("fitting T", enabled=True) as p: ... p.update("pass 3")``.

    ``enabled`` is True (standard error, when it is a terminal), False (nothing), or a rich ``Console`` to
    draw on (only when it is a terminal). ``update`` and ``advance`` may be called as often as wanted: they
    only set text and counts. With a ``total`` (of ``unit``, e.g. "tokens") the line is a bar that
    ``advance`` moves.
    """

    def __init__(self, description: str, *, enabled: bool | Console | None = True, delay: float = DELAY,
                 total: int | None = None, unit: str = ""):
        self.description = description
        self.detail = ""
        self.delay = delay
        self.total, self.unit, self.done = total, unit, 0
        self._console = _terminal_console(enabled)
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._bar: RichProgress | None = None
        self._task: Any = None
        self._start = 0.0

    @property
    def shown(self) -> bool:
        """Whether the line is on screen now."""
        return self._bar is not None

    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        if self._console is not None:
            self._timer = threading.Timer(self.delay, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            if self._bar is not None:
                self._bar.stop()
            self._console = self._bar = None

    def update(self, detail: str) -> None:
        """Set the latest step's text (shown once the delay has passed)."""
        with self._lock:
            self.detail = detail
            if self._bar is not None:
                self._bar.update(self._task, detail=detail)

    def advance(self, n: int) -> None:
        """Count ``n`` more of the ``total`` done."""
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done)

    def ece_pass(self, passes: int, open_intervals: int) -> None:
        """The ``on_pass`` callback of :func:`tempcal.core.ece_fit.minimise_ece`."""
        if open_intervals:
            self.update(f"ECE search: pass {passes}, {open_intervals} interval{'s' * (open_intervals != 1)} open")
        else:
            self.update(f"ECE search: done in {passes} pass{'es' * (passes != 1)}")

    def _show(self) -> None:
        """Start the live line (from the timer), unless the work has ended meanwhile."""
        with self._lock:
            if self._console is None or self._bar is not None:
                return
            self._bar = RichProgress(*self._columns(), console=self._console, transient=True,
                                     redirect_stdout=False, redirect_stderr=False)
            self._task = self._bar.add_task(self.description, total=self.total, completed=self.done,
                                            detail=self.detail)
            self._bar.start()

    def _columns(self) -> tuple[ProgressColumn, ...]:
        """A spinner and the line; with a total, the description, a bar, the share and count done, the time left."""
        if self.total is None:
            return SpinnerColumn(), _Line(self._start)
        return (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                TextColumn(f"{{task.completed:,.0f}}/{{task.total:,.0f}} {self.unit}"), TimeRemainingColumn())


def _terminal_console(enabled: bool | Console | None) -> Console | None:
    """The console to draw on: None when disabled, when it is not a terminal, and on every rank but 0 under
    torch.distributed (the ranks share one terminal; rank 0 reports, as it does everything else)."""
    if enabled is False or enabled is None or rank() != 0:
        return None
    console = enabled if isinstance(enabled, Console) else Console(stderr=True)
    return console if console.is_terminal else None


class _Line(ProgressColumn):
    """``12 s  what is running  the latest step``: the time since the work began (not since the line
    appeared) comes first, so a narrow terminal cuts the end of the line, not the time."""

    def __init__(self, start: float):
        super().__init__(table_column=Column(no_wrap=True, overflow="ellipsis"))
        self.start = start

    def render(self, task: Any) -> Text:
        seconds = Text(f"{time.monotonic() - self.start:3.0f} s", style="progress.elapsed")
        return Text.assemble(seconds, "  ", task.description, "  ", task.fields["detail"])


__all__ = ["DELAY", "Progress"]
