"""What T does to decisions made on the confidence: the risk-coverage figures and the smooth ECE of any rows.

:func:`decision_figures` takes the confidences of a set of rows (every row, one group's, one fold's) and whether
each prediction is right, and gives AURC, E-AURC, AUGRC (:mod:`.selective`), the smooth ECE
(:mod:`.smooth_ece`) and a risk-coverage curve of :data:`CURVE_POINTS` points, holding beyond the caller's
confidences at most 4 bytes per row. The rows are gathered from every torch.distributed rank in rank order, so every
figure is the one-process figure.

``TEMPCAL_SKIP_DECISIONS=1`` turns these figures off (NaN, no curve): only for measuring what they cost.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..core import distributed
from ..core.distributed import all_gather_rows
from ..core.limits import available_bytes
from .selective import rank_in_place, ranked_curve, ranked_metrics
from .smooth_ece import smooth_ece

#: Points of the risk-coverage curve in each metrics object's JSON.
CURVE_POINTS = 100
#: Set to 1 to leave the decision figures out (benchmarks measure their cost with it).
SKIP_VARIABLE = "TEMPCAL_SKIP_DECISIONS"
#: Bytes per row and temperature a calibration pass keeps for them (one float64 confidence), and at most this
#: fraction of the free memory is given to them in one read.
ROW_BYTES, MEMORY_SHARE = 8, 0.25
#: Rows taken at a time where a pass over every row would need a temporary per row.
BLOCK = 1 << 16
#: Groups beyond which the groups' own decision figures are left out (each costs about 10 ms per metrics
#: object, mostly the smooth ECE's bandwidth search); the figures over every row are always there.
MAX_GROUPS = 1000


@dataclass(frozen=True)
class DecisionFigures:
    """AURC, E-AURC, AUGRC, smooth ECE and the risk-coverage curve (``coverage``, ``risk``) of a set of rows."""

    aurc: float = math.nan
    eaurc: float = math.nan
    augrc: float = math.nan
    smece: float = math.nan
    risk_coverage: dict[str, list[float]] = field(default_factory=dict)


def enabled() -> bool:
    """False when ``TEMPCAL_SKIP_DECISIONS=1`` (cost measurements only)."""
    return os.environ.get(SKIP_VARIABLE, "") != "1"


def decision_figures(confidence: np.ndarray, correct: np.ndarray, *, overwrite: bool = False,
                     points: int = CURVE_POINTS) -> DecisionFigures:
    """The figures of rows with these confidences (float64) and correctness (bool); any subset of rows.

    ``overwrite`` lets the confidences be ranked in place (the array is then sorted and negated).
    """
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    if confidence.shape != correct.shape:
        raise ValueError(f"{confidence.size} confidences but {correct.size} correctness flags")
    if confidence.size == 0:
        return DecisionFigures()
    right = 2 * int(np.count_nonzero(correct)) < confidence.size  # keep whichever subset is smaller
    subset = subset_of(confidence, correct, right)
    smooth = smooth_ece(confidence, subset, right=right)  # order-free sums, before the ranking negates the values
    subset = rank_in_place(subset)
    ranked = rank_in_place(confidence if overwrite else confidence.copy())
    figures = ranked_metrics(ranked, subset, right=right)
    coverage, risk = ranked_curve(ranked, subset, points, right=right)
    return DecisionFigures(aurc=figures.aurc, eaurc=figures.eaurc, augrc=figures.augrc, smece=smooth,
                           risk_coverage={"coverage": coverage.tolist(), "risk": risk.tolist()})


def subset_decisions(metrics, confidence: torch.Tensor, correct: torch.Tensor):
    """``metrics`` (a :class:`~tempcal.metrics.calibration.CalibrationMetrics`) with the decision figures of a subset's
    rows (a group's, the out-of-fold rows): the row figure :mod:`tempcal.subsets.cells` applies."""
    if not enabled():
        return metrics
    figures = decision_figures(confidence.detach().cpu().numpy(), correct.detach().cpu().numpy())
    return replace(metrics, aurc=figures.aurc, eaurc=figures.eaurc, augrc=figures.augrc, smece=figures.smece,
                   risk_coverage=figures.risk_coverage)


def subset_of(confidence: np.ndarray, correct: np.ndarray, right: bool) -> np.ndarray:
    """The confidences of the correctly classified rows (``right``) or of the misclassified ones: a copy, 8 bytes
    per such row, taken a block of rows at a time (no temporary for every row)."""
    hits = int(np.count_nonzero(correct))
    out = np.empty(hits if right else correct.size - hits)
    filled = 0
    for first in range(0, confidence.size, BLOCK):
        chosen = correct[first:first + BLOCK]
        part = confidence[first:first + BLOCK][chosen if right else ~chosen]
        out[filled:filled + part.size] = part
        filled += part.size
    return out


def gathered_confidence(confidence: torch.Tensor) -> np.ndarray:
    """This process's rows' kept confidences (``[rows]`` float64) with every rank's in rank order, as a host numpy
    array (no copy in a single CPU process)."""
    return all_gather_rows(confidence).cpu().numpy()


def gathered_correct(correct: torch.Tensor) -> np.ndarray:
    """Whether each row's prediction is right (bool ``[rows]``), every rank's rows in rank order, on the host (one
    byte per row; the scan's own flags, uncopied, in a single CPU process)."""
    if not distributed.active():
        return correct.cpu().numpy()
    return all_gather_rows(correct.to(torch.uint8)).cpu().numpy().view(bool)  # collectives take no bool


def temperatures_per_read(rows: int, device: torch.device | str) -> int:
    """How many temperatures' confidences one read may keep: all of them, unless ``rows`` floats per temperature
    would take more than :data:`MEMORY_SHARE` of the memory free on ``device`` (and the host)."""
    free = [b for b in (available_bytes(device), available_bytes("cpu")) if b is not None]
    if not free or rows == 0:
        return 1 << 30
    return max(1, int(min(free) * MEMORY_SHARE) // (ROW_BYTES * rows))


__all__ = ["CURVE_POINTS", "MAX_GROUPS", "DecisionFigures", "decision_figures", "enabled", "gathered_confidence",
           "gathered_correct", "subset_decisions", "temperatures_per_read"]
