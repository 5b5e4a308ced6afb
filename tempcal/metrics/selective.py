"""Selective prediction: the risk-coverage figures of the contract (AURC, E-AURC, AUGRC).

Rows are ranked by confidence, highest first; ``errors(k)`` counts the misclassified rows among the k
most confident, a block of m rows of equal confidence holding e errors contributing ``j * e / m`` after its
first j rows (the expectation over the orders of the tie). With N rows of which ``N_c`` are correct:

* AURC ``= (1/N) sum_k errors(k) / k``: the area under the risk-coverage curve (risk = error rate among
  the rows kept);
* E-AURC ``= AURC - (1/N) sum_k max(0, k - N_c) / k``: minus the AURC of a perfect ranking (every
  correct row first), so 0 is the best a ranking of these predictions can do;
* AUGRC ``= (1/N) sum_k errors(k) / N``: the generalised risk (errors kept over all rows), Traub et al. 2024.

Memory: every confidence and every misclassified row's, sorted in place; tie blocks are runs in both, taken
:data:`CHUNK` values at a time, and harmonic sums give each block's contribution in closed form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Sorted confidences are walked this many at a time (the walk's temporaries: about 100 bytes per value of a chunk).
CHUNK = 1 << 14


@dataclass(frozen=True)
class SelectiveMetrics:
    """AURC, E-AURC and AUGRC of one set of predictions (see the module docstring)."""

    aurc: float
    eaurc: float
    augrc: float


def harmonic(n: np.ndarray | int) -> np.ndarray:
    """``H(n) = sum_{k=1..n} 1/k`` for integer ``n >= 0``: exact sums below 64, the asymptotic series above."""
    n = np.asarray(n, dtype=np.float64)
    small = np.minimum(n, 64).astype(np.int64)
    table = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, 65, dtype=np.float64))])
    big = np.maximum(n, 1.0)
    inv2 = 1.0 / (big * big)
    series = (np.log(big) + np.euler_gamma + 0.5 / big - inv2 / 12 + inv2 * inv2 / 120 - inv2 ** 3 / 252)
    return np.where(n <= 64, table[small], series)


def _block_terms(starts: np.ndarray, sizes: np.ndarray, errors: np.ndarray, errors_before: np.ndarray
                 ) -> tuple[float, float]:
    """``(sum_k errors(k)/k, sum_k errors(k))`` over the positions of the given tie blocks."""
    # A block of one row (the common case) has 1/(s+1) exactly, not a difference of two nearby harmonic numbers.
    between = np.where(sizes == 1, 1.0 / (starts + 1), harmonic(starts + sizes) - harmonic(starts))
    share = errors / sizes
    by_rank = errors_before * between + share * (sizes - starts * between)
    total = errors_before * sizes + share * sizes * (sizes + 1) / 2
    return float(by_rank.sum()), float(total.sum())


def rank_in_place(values: np.ndarray) -> np.ndarray:
    """``values`` (float64) negated and sorted in place: most confident first, with no copy of the rows."""
    np.negative(values, out=values)
    values.sort()
    return values


def ranked_metrics(ranked: np.ndarray, wrong: np.ndarray, *, right: bool = False) -> SelectiveMetrics:
    """The figures of confidences already ranked (:func:`rank_in_place`): minus every row's and minus the misclassified
    rows' confidences, or with ``right`` the correctly classified rows' (a caller keeps the smaller subset)."""
    n = ranked.size
    if n == 0:
        return SelectiveMetrics(math.nan, math.nan, math.nan)
    if wrong.size > n:
        raise ValueError(f"{wrong.size} {'correctly classified' if right else 'misclassified'} rows among {n}")
    by_rank = total = errors_seen = 0.0
    position = counted = 0
    while position < n:
        stop = min(position + CHUNK, n)
        last = ranked[stop - 1]
        if stop < n:  # a tie block never straddles two chunks
            stop = int(np.searchsorted(ranked, last, side="right"))
        values = ranked[position:stop]
        edges = np.flatnonzero(np.diff(values)) + 1
        firsts = np.concatenate([[0], edges])
        sizes = np.diff(np.concatenate([firsts, [values.size]])).astype(np.float64)
        block_values = values[firsts]
        found = (np.searchsorted(wrong, block_values, side="right")
                 - np.searchsorted(wrong, block_values, side="left")).astype(np.float64)
        errors = sizes - found if right else found
        before = errors_seen + np.concatenate([[0.0], np.cumsum(errors)[:-1]])
        part_rank, part_total = _block_terms(position + firsts.astype(np.float64), sizes, errors, before)
        by_rank += part_rank
        total += part_total
        errors_seen += float(errors.sum())
        counted += int(found.sum())
        position = stop
    if counted != wrong.size:
        raise ValueError("a subset row's confidence is not among the rows' confidences")
    correct = wrong.size if right else n - wrong.size
    aurc = by_rank / n
    # Perfect ranking: errors(k) = max(0, k - N_c); sum_{k > N_c} (k - N_c)/k = (n - N_c) - N_c (H(n) - H(N_c)).
    optimal = ((n - correct) - correct * float(harmonic(n) - harmonic(correct))) / n
    return SelectiveMetrics(aurc=aurc, eaurc=aurc - optimal, augrc=total / (n * n))


def ranked_curve(ranked: np.ndarray, wrong: np.ndarray, points: int = 200, *, right: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(coverage, risk)`` at up to ``points`` coverages: the error rate among the k most confident rows, ties taken
    in expectation; from ranked confidences, as :func:`ranked_metrics` takes them (``right`` too). For the
    risk-coverage plots."""
    n = ranked.size
    if n == 0:
        return np.zeros(0), np.zeros(0)
    ks = np.unique(np.linspace(1, n, min(points, n)).round().astype(np.int64))
    kth = ranked[ks - 1]
    first = np.searchsorted(ranked, kth, side="left")  # rows strictly more confident than the k-th
    size = np.searchsorted(ranked, kth, side="right") - first
    errors_before = np.searchsorted(wrong, kth, side="left")
    errors_tie = np.searchsorted(wrong, kth, side="right") - errors_before
    if right:  # counts of right rows: the errors are the rest
        errors_before, errors_tie = first - errors_before, size - errors_tie
    errors = errors_before + (ks - first) * errors_tie / size
    return ks / n, errors / ks
