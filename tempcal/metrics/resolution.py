"""Whether a ranking of scores means anything outside float64: what float32 can still tell apart, and rows
whose scores are rounding error.

At large tau the softmax tends to uniform, so the scores keep their ranking only in ever later digits: a float64
AUROC can be excellent while a float32 model ranks by rounding. An AUROC that falls when the float64 scores are
merely rounded to float32 is one no float32 deployment can be counted on to reach.
"""

from __future__ import annotations

import numpy as np

from .detection import ranking_figures

#: An AUROC that falls by more than this once the scores are rounded to float32 is not a float32 figure.
FLOAT32_AUROC_LOSS = 1e-3
#: Rows of probabilities are accepted when they sum to 1 within 1e-3, so ``log(sum p)`` lies within this.
LOG_SUM_TOLERANCE = 1.1e-3


def float32_auroc(id_scores, ood_scores) -> float:
    """AUROC of the scores once rounded to float32: the best a float32 computation of them can rank."""
    with np.errstate(over="ignore"):  # beyond float32's range a score becomes +-inf, as a float32 model's would
        id32 = np.asarray(id_scores, dtype=np.float64).astype(np.float32)
        ood32 = np.asarray(ood_scores, dtype=np.float64).astype(np.float32)
    return ranking_figures(id32.astype(np.float64), ood32.astype(np.float64))[0]


def float32_loss(id_scores, ood_scores, auroc: float) -> tuple[bool, float]:
    """``(lost, auroc32)``: whether rounding to float32 costs more than :data:`FLOAT32_AUROC_LOSS` of ``auroc``."""
    auroc32 = float32_auroc(id_scores, ood_scores)
    return auroc - auroc32 > FLOAT32_AUROC_LOSS, auroc32


def sums_to_zero(*values) -> bool:
    """Whether every value is within :data:`LOG_SUM_TOLERANCE` of 0: the energy at tau = 1, ``logsumexp(z)``, of
    rows that are log-probabilities (``--probs``) is ``log(sum p)``, rounding and nothing else."""
    arrays = [np.asarray(v, dtype=np.float64) for v in values]
    return all(a.size for a in arrays) and all(bool(np.all(np.abs(a) <= LOG_SUM_TOLERANCE)) for a in arrays)


__all__ = ["FLOAT32_AUROC_LOSS", "LOG_SUM_TOLERANCE", "float32_auroc", "float32_loss", "sums_to_zero"]
