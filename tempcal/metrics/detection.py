"""Detection figures of per-sample scores (docs/commands.md defines them: ID positive, higher = more ID): AUROC,
AUPR-In, AUPR-Out and FPR95 from one sort, their seeded bootstrap intervals from multinomial counts over scores sorted
once, and whether a ranking survives float32 (:func:`float32_loss`: at large tau the scores differ only in late
digits, so a float64 AUROC may be one no float32 deployment reaches)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..errors import DataError, TempcalError

#: Fraction of in-distribution samples kept by the FPR95 threshold.
ID_RECALL = 0.95
#: An AUROC that falls by more than this once the scores are rounded to float32 is not a float32 figure.
FLOAT32_AUROC_LOSS = 1e-3
#: Rows of probabilities are accepted when they sum to 1 within 1e-3, so ``log(sum p)`` lies within this.
LOG_SUM_TOLERANCE = 1.1e-3
#: A batch of bootstrap resamples keeps each of its count matrices under about this many entries.
BATCH_ENTRIES = 1 << 21


def _kept(n_id: int, recall: float) -> int:
    """``ceil(recall * n_id)`` in exact rational arithmetic (so 0.95 * 20 is 19)."""
    fraction = Fraction(recall).limit_denominator(1_000_000)
    return -(-fraction.numerator * n_id // fraction.denominator)


def as_scores(values) -> np.ndarray:
    """Per-sample scores as a float64 array: a tensor (on any device, requiring grad or not) is detached and
    copied to the host first."""
    if hasattr(values, "detach"):  # a torch tensor (torch is not imported here)
        values = values.detach().cpu().double()
    return np.asarray(values, dtype=np.float64)


def fpr_at_recall(id_scores, ood_scores, recall: float = ID_RECALL) -> tuple[float, float]:
    """``(fpr, threshold)``: the fraction of OOD scores at or above the k-th largest ID score, ``k = ceil(recall *
    n_id)`` in exact rational arithmetic (so 0.95 * 20 is 19)."""
    id_scores, ood_scores = as_scores(id_scores), as_scores(ood_scores)
    if id_scores.size == 0 or ood_scores.size == 0:
        raise DataError("FPR needs at least one in-distribution and one out-of-distribution score")
    if not 0 < recall <= 1:
        raise ValueError(f"recall must be in (0, 1], got {recall}")
    k = _kept(id_scores.size, recall)
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
    auroc_ci: tuple[float, float] | None = None  # bootstrap intervals, when asked for
    fpr95_ci: tuple[float, float] | None = None


def tie_counts(id_scores, ood_scores) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct score in ascending order (each one threshold), from one sort: the ID and OOD scores at most it,
    then the ID and OOD scores equal to it."""
    id_scores, ood_scores = as_scores(id_scores), as_scores(ood_scores)
    values = np.concatenate([id_scores, ood_scores])
    order = np.argsort(values)
    ordered = values[order]
    ends = np.flatnonzero(np.r_[ordered[1:] != ordered[:-1], True]) + 1
    id_up_to = np.cumsum(order < id_scores.size)[ends - 1]
    ood_up_to = ends - id_up_to
    return id_up_to, ood_up_to, np.diff(id_up_to, prepend=0), np.diff(ood_up_to, prepend=0)


def ranking_figures(id_scores, ood_scores) -> tuple[float, float, float]:
    """``(auroc, aupr_in, aupr_out)`` from one sort of all scores (scikit-learn's definitions, ties grouped)."""
    id_scores, ood_scores = as_scores(id_scores), as_scores(ood_scores)
    n, m = id_scores.size, ood_scores.size
    id_up_to, ood_up_to, id_in, ood_in = tie_counts(id_scores, ood_scores)
    ends = id_up_to + ood_up_to
    ood_below = ood_up_to - ood_in
    auroc = float(np.sum(id_in * (ood_below + 0.5 * ood_in)) / (n * m))
    # AUPR-In: thresholds from the top; at each, tp = ID scoring >= it, predicted = all scoring >= it.
    tp, predicted = n - (id_up_to - id_in), n + m - (ends - id_in - ood_in)
    aupr_in = float(np.sum(id_in / n * (tp / predicted)))
    # AUPR-Out: OOD positive, ranked by minus the score: thresholds from the bottom.
    aupr_out = float(np.sum(ood_in / m * (ood_up_to / ends)))
    return auroc, aupr_in, aupr_out


def detection_metrics(id_scores, ood_scores, *, tau: float = 1.0, score: str = "msp") -> OodMetrics:
    """AUROC, AUPR-In, AUPR-Out and FPR95 of per-sample scores, higher = more in-distribution."""
    id_scores, ood_scores = as_scores(id_scores), as_scores(ood_scores)
    fpr, threshold = fpr_at_recall(id_scores, ood_scores)
    auroc, aupr_in, aupr_out = ranking_figures(id_scores, ood_scores)
    with np.errstate(invalid="ignore"):  # +inf and -inf scores (MaxLogit beyond float64) have no mean
        mean_id, mean_ood = float(id_scores.mean()), float(ood_scores.mean())
    return OodMetrics(
        tau=float(tau), score=score, auroc=auroc, aupr_in=aupr_in, aupr_out=aupr_out, fpr95=fpr,
        fpr95_threshold=threshold, mean_id=mean_id, mean_ood=mean_ood, n_id=int(id_scores.size),
        n_ood=int(ood_scores.size))


# -- one OOD set against many ID subsets ----------------------------------------------------------------------
class SortedOod:
    """One OOD score vector sorted once, for many in-distribution subsets against it (``ood --group-by``): a subset
    costs a sort of its own scores and binary searches. In AUPR-Out's ``sum_j c_j U_j / (U_j + I_j)`` (``c_j`` OOD
    scores at the j-th distinct value, ``U_j`` at most it, ``I_j`` the subset's) ``I`` is constant between two subset
    scores, so over such a run it is a harmonic sum (``psi(b + I + 1) - psi(a + I)``), corrected at tied blocks."""

    def __init__(self, scores) -> None:
        ordered = np.sort(np.asarray(scores, dtype=np.float64))
        self.sorted = ordered
        self.m = ordered.size
        self.values, counts = np.unique(ordered, return_counts=True)
        self.counts = counts.astype(np.float64)
        self.below = np.r_[0, np.cumsum(counts)].astype(np.float64)  # under the j-th distinct value; U_j = below[j + 1]
        self.tied = np.flatnonzero(counts > 1)  # distinct values held by several OOD scores
        self.mean = float(ordered.mean()) if self.m else math.nan

    def run_sums(self, lo: np.ndarray, hi: np.ndarray, extra: np.ndarray) -> np.ndarray:
        """``sum_{lo <= j < hi} c_j / (U_j + extra)`` for each run (``extra`` > 0: the subset's scores below)."""
        from scipy.special import digamma

        first, last = self.below[lo] + 1, self.below[hi]  # the run's lowest and highest OOD rank
        out = np.where(hi > lo, digamma(last + extra + 1) - digamma(first + extra), 0.0)
        if self.tied.size:  # a block of c equal scores counts c / (U + I), not the harmonic sum over its ranks
            a, b = np.searchsorted(self.tied, lo), np.searchsorted(self.tied, hi)
            for k in np.flatnonzero(b > a):
                j = self.tied[a[k]:b[k]]
                u, c = self.below[j + 1], self.counts[j]
                out[k] += np.sum(c / (u + extra[k]) - (digamma(u + extra[k] + 1) - digamma(u - c + extra[k] + 1)))
        return out


def detection_against(id_scores, ood: SortedOod, *, tau: float = 1.0, score: str = "msp") -> OodMetrics:
    """:func:`detection_metrics` of ``id_scores`` against the sorted OOD scores ``ood`` (the same figures)."""
    a = np.sort(np.asarray(id_scores, dtype=np.float64))
    n, m = a.size, ood.m
    if n == 0 or m == 0:
        raise DataError("FPR needs at least one in-distribution and one out-of-distribution score")
    below = np.searchsorted(ood.sorted, a, side="left")
    at_most = np.searchsorted(ood.sorted, a, side="right")
    auroc = float(np.sum(below + 0.5 * (at_most - below)) / (n * m))
    values, first, id_in = np.unique(a, return_index=True, return_counts=True)
    tp = n - first  # ID scores at or above each distinct ID score
    ood_at_or_above = m - np.searchsorted(ood.sorted, values, side="left")
    aupr_in = float(np.sum(id_in / n * (tp / (tp + ood_at_or_above))))
    # AUPR-Out: runs of distinct OOD values between the ID values; I ID scores at most each value of run i.
    cuts = np.searchsorted(ood.values, values, side="left")
    lo = np.r_[0, cuts]
    hi = np.r_[cuts, ood.values.size]
    extra = np.r_[0, np.cumsum(id_in)].astype(np.float64)
    sums = ood.below[hi] - ood.below[lo]  # each run's OOD scores
    inside = extra > 0
    sums[inside] -= extra[inside] * ood.run_sums(lo[inside], hi[inside], extra[inside])
    aupr_out = float(np.sum(sums) / m)
    threshold = float(a[n - _kept(n, ID_RECALL)])
    fpr = float((m - np.searchsorted(ood.sorted, threshold, side="left")) / m)
    with np.errstate(invalid="ignore"):
        mean_id = float(a.mean())
    return OodMetrics(tau=float(tau), score=score, auroc=auroc, aupr_in=aupr_in, aupr_out=aupr_out, fpr95=fpr,
                      fpr95_threshold=threshold, mean_id=mean_id, mean_ood=ood.mean, n_id=n, n_ood=m)


# -- bootstrap intervals ------------------------------------------------------------------------------------
class _Row:
    """One row of results prepared for resampling: where each ID score falls among the sorted OOD scores, and
    the lowest ID scores in order with their places among the OOD scores (the FPR95 threshold lies there)."""

    def __init__(self, id_scores: np.ndarray, ood_scores: np.ndarray, prefix: int):
        index = np.int32 if id_scores.size + ood_scores.size < 2**31 else np.int64
        self.ood_order = np.argsort(ood_scores).astype(index)
        ood_sorted = ood_scores[self.ood_order]
        lo = np.searchsorted(ood_sorted, id_scores, side="left")
        hi = np.searchsorted(ood_sorted, id_scores, side="right")
        self.lo = lo.astype(index)
        self.hi = None if np.array_equal(lo, hi) else hi.astype(index)  # no ID score ties an OOD one: one gather
        self.id_order = np.argsort(id_scores).astype(index)
        self.ood_below = np.searchsorted(ood_sorted, id_scores[self.id_order], side="left")  # per sorted ID score
        self.prefix = prefix

    def figures(self, w: np.ndarray, v: np.ndarray, target: int) -> tuple[np.ndarray, np.ndarray]:
        """AUROC and FPR95 of each resample (rows of the float64 ID counts ``w`` and OOD counts ``v``)."""
        n, m = w.shape[1], v.shape[1]
        cumulative = np.zeros((v.shape[0], m + 1))
        np.cumsum(np.take(v, self.ood_order, axis=1), axis=1, out=cumulative[:, 1:])
        ranks = np.take(cumulative, self.lo, axis=1)
        if self.hi is None:
            ranks *= 2.0
        else:
            ranks += np.take(cumulative, self.hi, axis=1)
        auroc = np.einsum("rn,rn->r", ranks, w) / (2.0 * n * m)
        # The (n - k + 1)-th smallest resampled ID score: the first sorted ID position whose cumulative count
        # reaches the target; the lowest `prefix` scores almost surely hold it, else all of them are used.
        for span in (self.prefix, n):
            counts = np.cumsum(np.take(w, self.id_order[:span], axis=1), axis=1)
            position = (counts < target).sum(axis=1)
            if bool((position < span).all()):
                break
        accepted = m - cumulative[np.arange(v.shape[0]), self.ood_below[position]]
        return auroc, accepted / m


def detection_intervals(id_rows: Sequence[np.ndarray], ood_rows: Sequence[np.ndarray], n_resamples: int,
                        seed: int, *, level: float = 0.95, ood_stream: int = 1, batch: int | None = None
                        ) -> list[dict[str, tuple[float, float]]]:
    """Percentile bootstrap intervals ``{"auroc": (low, high), "fpr95": (low, high)}`` for each row of scores (every
    row the same ID and OOD samples). Resample r counts the r-th draws of ``default_rng(seed)`` (ID) and of
    ``default_rng([seed, ood_stream])`` (OOD): the same ID resamples for every OOD file. ``batch`` never changes them.
    """
    if isinstance(n_resamples, bool) or int(n_resamples) != n_resamples or n_resamples < 1:
        raise TempcalError(f"the bootstrap needs a whole number of resamples >= 1, got {n_resamples}")
    if not 0 < level < 1:
        raise TempcalError(f"confidence level must be strictly between 0 and 1, got {level}")
    n, m = len(id_rows[0]), len(ood_rows[0])
    if n == 0 or m == 0:
        raise DataError("the bootstrap needs at least one in-distribution and one out-of-distribution score")
    target = n - _kept(n, ID_RECALL) + 1
    prefix = min(n, target + 10 * math.isqrt(target) + 100)
    rows = [_Row(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), prefix)
            for a, b in zip(id_rows, ood_rows, strict=True)]
    id_rng, ood_rng = np.random.default_rng(seed), np.random.default_rng([seed, ood_stream])
    step = max(1, min(int(n_resamples), int(batch) if batch else BATCH_ENTRIES // max(n, m)))
    auroc = np.empty((len(rows), int(n_resamples)))
    fpr = np.empty_like(auroc)
    for first in range(0, int(n_resamples), step):
        size = min(step, int(n_resamples) - first)
        w = np.stack([np.bincount(id_rng.integers(0, n, size=n), minlength=n) for _ in range(size)]).astype(float)
        v = np.stack([np.bincount(ood_rng.integers(0, m, size=m), minlength=m) for _ in range(size)]).astype(float)
        for j, row in enumerate(rows):
            auroc[j, first:first + size], fpr[j, first:first + size] = row.figures(w, v, target)
    return [{"auroc": percentile_interval(auroc[j], level), "fpr95": percentile_interval(fpr[j], level)}
            for j in range(len(rows))]


def percentile_interval(values: np.ndarray, level: float) -> tuple[float, float]:
    """The percentile bootstrap interval at confidence ``level`` of the replicates ``values``."""
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def float32_loss(id_scores, ood_scores, auroc: float) -> tuple[bool, float]:
    """``(lost, auroc32)``: the AUROC of the scores once rounded to float32 (the best a float32 computation of them
    can rank), and whether it is more than :data:`FLOAT32_AUROC_LOSS` below ``auroc``."""
    with np.errstate(over="ignore"):  # beyond float32's range a score becomes +-inf, as a float32 model's would
        id32, ood32 = (np.asarray(s, dtype=np.float64).astype(np.float32) for s in (id_scores, ood_scores))
    auroc32 = ranking_figures(id32, ood32)[0]
    return auroc - auroc32 > FLOAT32_AUROC_LOSS, auroc32


def sums_to_zero(*values) -> bool:
    """Whether every value is within :data:`LOG_SUM_TOLERANCE` of 0: the energy at tau = 1, ``logsumexp(z)``, of
    rows that are log-probabilities (``--probs``) is ``log(sum p)``, rounding and nothing else."""
    arrays = [np.asarray(v, dtype=np.float64) for v in values]
    return all(a.size for a in arrays) and all(bool(np.all(np.abs(a) <= LOG_SUM_TOLERANCE)) for a in arrays)


__all__ = ["ID_RECALL", "OodMetrics", "SortedOod", "detection_against", "detection_intervals", "detection_metrics",
           "float32_loss", "fpr_at_recall", "percentile_interval", "sums_to_zero"]
