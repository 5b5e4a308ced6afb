"""The calibration figures reports display, in order, with their labels: one list for every output; and each
group's conformal coverage, which the console and the HTML page both show."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: ``(attribute of CalibrationMetrics, label, unit or "")``.
DISPLAYED_METRICS: tuple[tuple[str, str, str], ...] = (
    ("nll", "NLL", ""), ("ece", "ECE", ""), ("rms_ce", "RMS calibration error", ""), ("mce", "MCE", ""),
    ("brier", "Brier", ""), ("accuracy", "accuracy", ""), ("entropy", "entropy", "nats"),
    ("mean_confidence", "mean confidence", ""), ("smece", "smooth ECE", ""), ("aurc", "AURC", ""))


def min_nll_taus(results) -> list[float]:
    """The temperatures of the rows with the lowest NLL, over every row given (the stored T's included)."""
    lowest = min((m.nll for m in results if m.nll == m.nll), default=None)  # NaN compares unequal to itself
    return [m.tau for m in results if m.nll == lowest]


def threshold_text(q: float) -> str:
    """A conformal threshold to four decimals, up to six where fewer would print one short of 1 as ``1.0000``, then as
    ``1-5e-10`` (or ``3e-09`` near 0): never ``1`` for a threshold that is not 1; ``inf`` as is."""
    if not math.isfinite(q):
        return str(q)
    for places in range(4, 7):
        shown = f"{q:.{places}f}"
        if float(shown) not in (0.0, 1.0) or q in (0.0, 1.0):
            return shown
    return f"1-{1 - q:.0e}" if q > 0.5 else f"{q:.0e}"


@dataclass(frozen=True)
class GroupCoverage:
    """One group's conformal sets at one alpha under the global sets: per score its JSON entry (``coverage``,
    ``mean_size``...) and whether the group falls short of 1 - alpha beyond chance."""

    group: str
    n: int
    alpha: float
    cells: dict[str, dict]
    short: dict[str, bool]

    @property
    def lowest(self) -> float:
        return min(c["coverage"] for c in self.cells.values())


def group_coverage(groups: Iterable[tuple[str, int | None, Sequence[dict] | None]]) -> list[list[GroupCoverage]]:
    """Per alpha (in the order the entries give them), every group's coverage, lowest first; ``groups``: each
    group's name, evaluation rows and conformal entries under the global sets (None or empty: left out)."""
    from ..conformal.sets import under_covered

    blocks: dict[float, list[GroupCoverage]] = {}
    for name, n, entries in groups:
        if not n or not entries:
            continue
        for alpha in dict.fromkeys(c["alpha"] for c in entries):
            cells = {c["score"]: c for c in entries if c["alpha"] == alpha}
            short = {s: under_covered(c["coverage"], n, alpha) for s, c in cells.items()}
            blocks.setdefault(alpha, []).append(GroupCoverage(name, n, alpha, cells, short))
    return [sorted(block, key=lambda g: g.lowest) for block in blocks.values()]


__all__ = ["DISPLAYED_METRICS", "group_coverage", "min_nll_taus", "threshold_text"]
