"""A progress line on standard error (never stdout) for work that may run long, once ``delay`` seconds have passed: a
transient bar on a terminal, else a plain line at most every :data:`PLAIN_EVERY` seconds; none on ranks but 0."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, ProgressColumn, SpinnerColumn, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress
from rich.table import Column
from rich.text import Text

from .core.parallel import rank

#: Seconds of silence before the line appears.
DELAY = 2.0
#: Off a terminal: seconds before the first plain line, and at least between two.
PLAIN_EVERY = 10.0
#: Off a terminal: how often (seconds) the clock is looked at, between the steps the work reports.
PLAIN_TICK = 1.0


class Progress:
    """A context manager: ``with Progress("fitting T", enabled=True) as p: ... p.update("pass 3")``.

    ``enabled``: True (standard error), False, or a rich ``Console``. With a ``total`` (of ``unit``) the line is a
    bar that ``advance`` moves. ``clock`` and ``tick`` time the plain lines (tests pass a fake clock).
    """

    def __init__(self, description: str, *, enabled: bool | Console | None = True, delay: float = DELAY,
                 total: int | None = None, unit: str = "", clock: Callable[[], float] = time.monotonic,
                 tick: float = PLAIN_TICK):
        self.description = description
        self.detail = ""
        self.delay = delay
        self.total, self.unit, self.done = total, unit, 0
        self._console, self._plain = _outlets(enabled)
        self._clock, self._tick = clock, tick
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._ended = threading.Event()
        self._bar: RichProgress | None = None
        self._task: Any = None
        self._start = self._last_plain = 0.0

    @property
    def shown(self) -> bool:
        """Whether the line is on screen now."""
        return self._bar is not None

    def __enter__(self) -> Progress:
        self._start = self._last_plain = self._clock()
        if self._console is not None and self.delay <= 0:
            self._show()
        elif self._console is not None:
            self._timer = threading.Timer(self.delay, self._show)
            self._timer.daemon = True
            self._timer.start()
        elif self._plain is not None:
            threading.Thread(target=self._ticking, name="tempcal-progress", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ended.set()
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            if self._bar is not None:
                self._bar.stop()
            self._console = self._bar = self._plain = None

    def plain_tick(self) -> None:
        """Off a terminal: print the plain line when :data:`PLAIN_EVERY` seconds have passed since the start and
        since the last line (called every :data:`PLAIN_TICK` seconds, and after each step the work reports)."""
        with self._lock:
            now = self._clock()
            if self._plain is None or now - self._last_plain < PLAIN_EVERY:
                return
            self._last_plain = now
            self._plain.write(self.plain_line(now - self._start) + "\n")
            self._plain.flush()

    def plain_line(self, elapsed: float) -> str:
        """``running gpt2: 4,096/20,000 tokens (20%), 410 tokens/s, 39 s left; 10 s so far``; without a total, the
        latest step instead of the count."""
        head = f"{self.description}: " if self.detail or self.total is not None else self.description
        so_far = f"{_duration(elapsed)} so far"
        if self.total is None:
            return f"{head}{self.detail}; {so_far}"
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        count = f"{self.done:,}/{self.total:,} {self.unit}".rstrip() + share
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if rate <= 0:
            return f"{head}{count}, no {self.unit or 'step'} done yet; {so_far}"
        left = _duration(max(self.total - self.done, 0) / rate)
        shown = f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"
        return f"{head}{count}, {shown} {self.unit or 'steps'}/s, {left} left; {so_far}"

    def _ticking(self) -> None:
        while not self._ended.wait(self._tick):
            self.plain_tick()

    def update(self, detail: str) -> None:
        """Set the latest step's text (shown once the delay has passed)."""
        with self._lock:
            self.detail = detail
            if self._bar is not None:
                self._bar.update(self._task, detail=detail)
        self.plain_tick()

    def advance(self, n: int) -> None:
        """Count ``n`` more of the ``total`` done."""
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done)
        self.plain_tick()

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


def _outlets(enabled: bool | Console | None) -> tuple[Console | None, IO[str] | None]:
    """The terminal console to draw the bar on, or else the stream for plain lines; neither when disabled, nor on
    ranks but 0 (they share one standard error)."""
    if enabled is False or enabled is None or rank() != 0:
        return None, None
    console = enabled if isinstance(enabled, Console) else Console(stderr=True)
    return (console, None) if console.is_terminal else (None, console.file)


def _duration(seconds: float) -> str:
    """``9 s``, ``2 min 05 s``, ``1 h 02 min``."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


class _Line(ProgressColumn):
    """``12 s  what is running  the latest step``: the time since the work began first, so a narrow terminal cuts
    the end of the line, not the time."""

    def __init__(self, start: float):
        super().__init__(table_column=Column(no_wrap=True, overflow="ellipsis"))
        self.start = start

    def render(self, task: Any) -> Text:
        seconds = Text(f"{time.monotonic() - self.start:3.0f} s", style="progress.elapsed")
        return Text.assemble(seconds, "  ", task.description, "  ", task.fields["detail"])


__all__ = ["DELAY", "PLAIN_EVERY", "Progress"]
