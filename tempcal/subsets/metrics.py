"""Metrics of subsets of rows (each group, the out-of-fold rows) from one pass's per-subset sums.

:func:`tempcal.subsets.cells.cell_calibration` sums every calibration figure per slot (a beta for each
row) and per subset in one read; :func:`subset_metrics` turns one slot's sums over one subset into the
contract's figures, exactly as :func:`~tempcal.metrics.calibration.from_sums` does for every row.

Figures that rank a subset's own rows (risk-coverage, smooth ECE, conformal sets) cannot come from sums:
they take the subset's per-row confidences and correctness. Such a figure is a function
``(metrics, confidence, correct) -> metrics`` appended to :data:`ROW_FIGURES`; the subset passes keep every
row's confidence for them and :func:`subset_metrics` hands each figure the subset's rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ..metrics.calibration import CalibrationMetrics, from_sums
from ..metrics.decisions import MAX_GROUPS, subset_decisions

if TYPE_CHECKING:
    from .cells import CellCalibration

RowFigure = Callable[[CalibrationMetrics, torch.Tensor, torch.Tensor], CalibrationMetrics]
#: Figures computed from a subset's per-row confidence and correctness (empty: no row is kept): the decision
#: figures (AURC, E-AURC, AUGRC, smooth ECE, the risk-coverage curve).
ROW_FIGURES: list[RowFigure] = [subset_decisions]


def subset_metrics(calibration: CellCalibration, slot: int, tau: float, group: int | None = None,
                   rows: torch.Tensor | None = None) -> CalibrationMetrics | None:
    """The metrics of one slot over one subset (``group``; None: every row), or None for an empty subset.

    ``rows`` (the group of every row, all ranks, in order) selects the subset's kept confidences for
    :data:`ROW_FIGURES` (given when the pass kept them).
    """
    sums = calibration.total(slot) if group is None else calibration.group(slot, group)
    if sums.count == 0:
        return None
    metrics = from_sums(tau, sums)
    too_many = group is not None and calibration.counts.numel() > MAX_GROUPS  # each group's figures cost time
    if ROW_FIGURES and calibration.confidence is not None and calibration.correct is not None and not too_many:
        confidence, correct = calibration.confidence[slot], calibration.correct
        if group is not None and rows is not None:
            mine = rows.to(confidence.device) == group
            confidence, correct = confidence[mine], correct[mine]
        for figure in ROW_FIGURES:
            metrics = figure(metrics, confidence, correct)
    return metrics


def metrics_block(m: CalibrationMetrics | None) -> dict | None:
    """A subset's figures as the JSON shows them (no reliability bins: a group list stays compact)."""
    if m is None:
        return None
    out: dict = dict(m.summary())
    out.update(entropy=m.entropy, mean_confidence=m.mean_confidence, tau=m.tau, n=m.count)
    out.update({k: v for k, v in m.decisions().items() if k != "risk_coverage"})  # no curve: a group list stays short
    return out


__all__ = ["ROW_FIGURES", "RowFigure", "metrics_block", "subset_metrics"]
