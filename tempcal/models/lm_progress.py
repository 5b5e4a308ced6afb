"""Progress bars for a language model's long steps (the forward pass, each pass of the head over the rows).

A bar shows on standard error only where a person watches (a terminal), only once its step has run
for :data:`DELAY` seconds (short runs stay as quiet as before), and never under ``--quiet`` or
``--json -`` (``enabled=False``); it is erased when its step ends. A timer thread starts it, so a slow
first batch shows the bar too.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

#: Seconds a step runs before its bar appears.
DELAY = 2.0


class DelayedBar:
    """``with DelayedBar("running MODEL", total, "tokens", enabled=...) as bar: ... bar.advance(n)``."""

    def __init__(self, description: str, total: int, unit: str, *, enabled: Any = True, delay: float = DELAY):
        self.description, self.total, self.unit, self.delay = description, total, unit, delay
        self.done = 0
        self._console = _terminal_console(enabled)
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._bar: Any = None
        self._task: Any = None

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def __enter__(self) -> DelayedBar:
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

    def advance(self, n: int) -> None:
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done)

    def _show(self) -> None:
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

        with self._lock:
            if self._console is None or self._bar is not None:
                return
            columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                       TextColumn(f"{{task.completed:,.0f}}/{{task.total:,.0f}} {self.unit}"), TimeRemainingColumn())
            self._bar = Progress(*columns, console=self._console, transient=True, redirect_stdout=False,
                                 redirect_stderr=False)
            self._task = self._bar.add_task(self.description, total=self.total, completed=self.done)
            self._bar.start()


def _terminal_console(enabled: Any) -> Any:
    """The console to draw on: None when disabled or not a terminal (a CI log, a file, a pipe)."""
    if enabled is False or enabled is None:
        return None
    from rich.console import Console

    console = enabled if isinstance(enabled, Console) else Console(stderr=True)
    return console if console.is_terminal else None


class PassCounter:
    """Counts the passes over a language model's rows and shows a delayed bar for each (``enabled`` as above)."""

    def __init__(self, name: str, enabled: Any):
        self.name, self.enabled, self.passes = name, enabled, 0

    def bar(self, rows: int) -> DelayedBar:
        self.passes += 1
        return DelayedBar(f"{self.name}: pass {self.passes} over the rows", rows, "rows", enabled=self.enabled)


__all__ = ["DELAY", "DelayedBar", "PassCounter"]
