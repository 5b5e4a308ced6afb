"""Detection figures of per-sample scores, in-distribution (ID) samples positive, higher score = more ID.

* AUROC and AUPR-In: ID positive, ranked by the score (``sklearn.metrics.roc_auc_score``,
  ``average_precision_score``). AUPR-Out: OOD positive, ranked by minus the score.
* FPR95: with ``k = ceil(0.95 * n_id)``, the threshold ``s`` is the k-th largest ID score,
  i.e. the largest ``s`` with ``mean(id >= s) >= 0.95``; FPR95 ``= mean(ood >= s)``, ties
  counted as accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..errors import DataError

#: Fraction of in-distribution samples kept by the FPR95 threshold.
ID_RECALL = 0.95


def fpr_at_recall(id_scores, ood_scores, recall: float = ID_RECALL) -> tuple[float, float]:
    """``(fpr, threshold)``: the fraction of OOD scores at or above the largest threshold keeping ``recall`` of ID.

    The threshold is the k-th largest ID score with ``k = ceil(recall * n_id)`` (exact rational
    arithmetic, so 0.95 * 20 is 19), the largest ``s`` with ``mean(id >= s) >= recall``.
    """
    id_scores = np.asarray(id_scores, dtype=np.float64)
    ood_scores = np.asarray(ood_scores, dtype=np.float64)
    if id_scores.size == 0 or ood_scores.size == 0:
        raise DataError("FPR needs at least one in-distribution and one out-of-distribution score")
    if not 0 < recall <= 1:
        raise ValueError(f"recall must be in (0, 1], got {recall}")
    fraction = Fraction(recall).limit_denominator(1_000_000)
    k = -(-fraction.numerator * id_scores.size // fraction.denominator)
    threshold = float(np.partition(id_scores, id_scores.size - k)[id_scores.size - k])
    return float(np.mean(ood_scores >= threshold)), threshold


@dataclass(frozen=True)
class OodMetrics:
    """Detection figures of one score at one temperature against one OOD set (ID positive)."""

    tau: float
    score: str
    auroc: float
    aupr_in: float
    aupr_out: float
    fpr95: float
    fpr95_threshold: float
    mean_id: float
    mean_ood: float
    n_id: int
    n_ood: int


def detection_metrics(id_scores, ood_scores, *, tau: float = 1.0, score: str = "msp") -> OodMetrics:
    """AUROC, AUPR-In, AUPR-Out (scikit-learn) and FPR95 of per-sample scores, higher = more in-distribution."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    id_scores = np.asarray(id_scores, dtype=np.float64)
    ood_scores = np.asarray(ood_scores, dtype=np.float64)
    fpr, threshold = fpr_at_recall(id_scores, ood_scores)
    is_id = np.concatenate([np.ones(id_scores.size, dtype=np.int8), np.zeros(ood_scores.size, dtype=np.int8)])
    values = np.concatenate([id_scores, ood_scores])
    return OodMetrics(
        tau=float(tau), score=score, auroc=float(roc_auc_score(is_id, values)),
        aupr_in=float(average_precision_score(is_id, values)),
        aupr_out=float(average_precision_score(1 - is_id, -values)), fpr95=fpr, fpr95_threshold=threshold,
        mean_id=float(id_scores.mean()), mean_ood=float(ood_scores.mean()), n_id=int(id_scores.size),
        n_ood=int(ood_scores.size))


__all__ = ["ID_RECALL", "OodMetrics", "detection_metrics", "fpr_at_recall"]
