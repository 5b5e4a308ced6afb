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
)


def labelled(label: str, unit: str) -> str:
    """A label with its unit, as prose outputs show it: ``entropy (nats)``."""
    return f"{label} ({unit})" if unit else label


__all__ = ["DISPLAYED_METRICS", "labelled"]
