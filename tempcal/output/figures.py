"""The calibration figures reports display, in order, with their labels: one list for every output; and each
group's conformal coverage, which the console and the HTML page both show."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: ``(attribute of CalibrationMetrics, label, unit or "")``.
DISPLAYED_METRICS: tuple[tuple[str, str, str], ...] = (
    ("nll", "NLL", ""),
    ("ece", "ECE", ""),
    ("rms_ce", "RMS calibration error", ""),
    ("mce", "MCE", ""),
    ("brier", "Brier", ""),
    ("accuracy", "accuracy", ""),
    ("entropy", "entropy", "nats"),
    ("mean_confidence", "mean confidence", ""),
    ("smece", "smooth ECE", ""),
    ("aurc", "AURC", ""),
)


def labelled(label: str, unit: str) -> str:
    """A label with its unit, as prose outputs show it: ``entropy (nats)``."""
    return f"{label} ({unit})" if unit else label


def reads(passes: int) -> str:
    """``"1 pass"``, ``"3 passes"``: how many reads of the data a fit took."""
    return f"{passes} pass" if passes == 1 else f"{passes} passes"


def fit_split(report) -> str:
    """How ``fit`` split its rows, as the console's header and the page say it: ``T fitted on 674 rows; figures on the
    674 held-out rows (stratified split, val-fraction 0.5, seed 0)``."""
    from ..workflows.common import ROWS_HELD_OUT

    held_out = report.after_basis.rows == ROWS_HELD_OUT
    how = (f" ({report.folds}-fold cross-fitting, seed {report.seed})" if report.folds is not None else
           f" (stratified split, val-fraction {report.val_fraction:g}, seed {report.seed})" if held_out else "")
    fitted = f"{report.n_fit:,} rows" if held_out else f"all {report.n_fit:,} rows"
    return f"T fitted on {fitted}; figures {report.after_basis.rows_label()}{how}"


def min_nll_taus(results) -> list[float]:
    """The temperatures of the rows with the lowest NLL, over every row given (the stored T's included)."""
    finite = [m for m in results if m.nll == m.nll]  # NaN compares unequal to itself
    if not finite:
        return []
    lowest = min(m.nll for m in finite)
    return [m.tau for m in finite if m.nll == lowest]


def threshold_text(q: float, decimals: int = 4) -> str:
    """A conformal threshold with ``decimals`` decimals, up to two more where fewer would print a threshold short of 1
    as ``1.0000`` (0.99999 stays 0.99999), and as ``1-5e-10`` (or ``3e-09`` near 0) beyond that: never ``1`` for
    a threshold that is not 1; ``inf`` as is."""
    if q != q or q in (float("inf"), float("-inf")):
        return "inf" if q == float("inf") else str(q)
    for places in range(decimals, decimals + 3):
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


__all__ = ["DISPLAYED_METRICS", "fit_split", "group_coverage", "labelled", "min_nll_taus", "reads", "threshold_text"]
