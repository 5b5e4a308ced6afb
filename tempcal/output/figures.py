"""The calibration figures reports display, in order, with their labels: one list for every output."""

from __future__ import annotations

#: ``(attribute of CalibrationMetrics, label, unit or "")``.
DISPLAYED_METRICS: tuple[tuple[str, str, str], ...] = (
    ("nll", "NLL", ""),
    ("ece", "ECE", ""),
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


def min_nll_taus(results) -> list[float]:
    """The temperatures of the rows with the lowest NLL, over every row given (the stored T's included)."""
    finite = [m for m in results if m.nll == m.nll]  # NaN compares unequal to itself
    if not finite:
        return []
    lowest = min(m.nll for m in finite)
    return [m.tau for m in finite if m.nll == lowest]


__all__ = ["DISPLAYED_METRICS", "labelled", "min_nll_taus", "reads"]
