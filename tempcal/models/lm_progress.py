"""Progress bars for a language model's long steps (the forward pass, each pass of the head over the rows).

A bar is a :class:`tempcal.progress.Progress` with a total: on a terminal (rank 0) it shows once its
step has run for :data:`DELAY` seconds (short runs stay as quiet as before) and is erased when its step ends;
off a terminal (a CI log) a step longer than 10 s prints a plain line (count, rate, time left) at most every
10 s; never anything under ``--quiet`` or ``--json -`` (``enabled=False``).
"""

from __future__ import annotations

from typing import Any

from ..progress import DELAY, Progress


class DelayedBar(Progress):
    """``with DelayedBar("running MODEL", total, "tokens", enabled=...) as bar: ... bar.advance(n)``."""

    def __init__(self, description: str, total: int, unit: str, *, enabled: Any = True, delay: float = DELAY):
        super().__init__(description, enabled=enabled, delay=delay, total=total, unit=unit)


class PassCounter:
    """Counts the passes over a language model's rows and shows a delayed bar for each (``enabled`` as above)."""

    def __init__(self, name: str, enabled: Any):
        self.name, self.enabled, self.passes = name, enabled, 0

    def bar(self, rows: int) -> DelayedBar:
        self.passes += 1
        return DelayedBar(f"{self.name}: pass {self.passes} over the rows", rows, "rows", enabled=self.enabled)


__all__ = ["DELAY", "DelayedBar", "PassCounter"]
