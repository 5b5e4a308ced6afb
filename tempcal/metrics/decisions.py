"""What T does to decisions made on the confidence: AURC, E-AURC, AUGRC, the risk-coverage curve and the smooth ECE
(docs/metrics.md defines them) of any rows, every rank's in rank order, holding beyond the caller's confidences at
most 4 bytes per row (the confidences of the right or of the wrong rows, whichever are fewer).

The risk-coverage sums walk the ranked confidences :data:`CHUNK` values at a time, each tie block's part in closed
form from harmonic sums; the smooth ECE is relplot 1.0.3's ``smECE`` (its grid, reflected Gaussian kernel and
bandwidth bisection), spread from the same arrays with ``sum_i w_i r_i = sum_i w_i (conf_i - 1) + sum_wrong w_i``.
``TEMPCAL_SKIP_DECISIONS=1`` turns these figures off (NaN, no curve): only for measuring what they cost."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..core import parallel
from ..core.limits import available_bytes
from ..core.parallel import all_gather_rows

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
#: Sorted confidences are walked, and rows spread onto the smooth ECE's grid, this many at a time (temporaries
#: of about 100 bytes per value of a chunk).
CHUNK = 1 << 14
#: relplot's ``config.smECE_mesh_pts``: the evaluation mesh has at least this many points.
MESH_POINTS = 200
#: relplot's ``smECE(eps=0.001)``: a bandwidth below it is accepted outright.
MIN_BANDWIDTH = 1e-3
#: relplot's ``search_param(refine=10)``.
HALVINGS = 10


@dataclass(frozen=True)
class DecisionFigures:
    """AURC, E-AURC, AUGRC, smooth ECE and the risk-coverage curve (``coverage``, ``risk``) of a set of rows: fields
    of :class:`~tempcal.metrics.calibration.CalibrationMetrics` too."""

    aurc: float = math.nan
    eaurc: float = math.nan
    augrc: float = math.nan
    smece: float = math.nan
    risk_coverage: dict[str, list[float]] = field(default_factory=dict)


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


def block_terms(starts: np.ndarray, sizes: np.ndarray, errors: np.ndarray, errors_before: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """``(sum_k errors(k)/k, sum_k errors(k))`` over the positions of the given tie blocks (the last axis; a block
    of no rows adds nothing)."""
    # A block of one row (the common case) has 1/(s+1) exactly, not a difference of two nearby harmonic numbers.
    between = np.where(sizes == 1, 1.0 / (starts + 1), harmonic(starts + sizes) - harmonic(starts))
    share = errors / np.maximum(sizes, 1)
    return ((errors_before * between + share * (sizes - starts * between)).sum(-1),
            (errors_before * sizes + share * sizes * (sizes + 1) / 2).sum(-1))


def optimal_aurc(n: int, correct):
    """The AURC of a perfect ranking of ``n`` rows, ``correct`` of them right: errors(k) = max(0, k - N_c), and
    sum_{k > N_c} (k - N_c)/k = (n - N_c) - N_c (H(n) - H(N_c))."""
    return ((n - correct) - correct * (harmonic(n) - harmonic(correct))) / n


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
    by_rank = total = errors_seen = 0.0
    position = 0
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
        part_rank, part_total = block_terms(position + firsts.astype(np.float64), sizes, errors, before)
        by_rank += float(part_rank)
        total += float(part_total)
        errors_seen += float(errors.sum())
        position = stop
    correct = wrong.size if right else n - wrong.size
    aurc = by_rank / n
    return SelectiveMetrics(aurc=aurc, eaurc=aurc - float(optimal_aurc(n, correct)), augrc=total / (n * n))


def ranked_curve(ranked: np.ndarray, wrong: np.ndarray, points: int = 200, *, right: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(coverage, risk)`` at up to ``points`` coverages, risk the error rate among the k most confident rows (ties in
    expectation), from confidences ranked as :func:`ranked_metrics` takes them (``right`` too)."""
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


def _spread(values: np.ndarray, points: int, offset: float | None) -> np.ndarray:
    """``values`` spread onto ``points`` grid points by linear interpolation, each weighing ``value + offset`` (1
    without an offset)."""
    position = values * (points - 1)
    index = position.astype(np.int64).clip(0, points - 2)
    frac = position - index
    low = 1 - frac
    if offset is not None:
        weight = values + offset
        low *= weight
        frac *= weight
    return np.bincount(index, low, minlength=points) + np.bincount(index + 1, frac, minlength=points)


def _grid_sums(confidence: np.ndarray, subset: np.ndarray, points: int, right: bool = False
               ) -> tuple[np.ndarray, np.ndarray]:
    """``(residual, count)`` on ``points`` grid points, :data:`CHUNK` rows at a time (temporaries of a few MB);
    ``subset``: the wrong rows' confidences (residual ``conf - 1 + [wrong]``), or with ``right`` the right rows'."""
    residual = np.zeros(points)
    count = np.zeros(points)
    for start in range(0, confidence.size, CHUNK):
        part = confidence[start:start + CHUNK]
        residual += _spread(part, points, 0.0 if right else -1.0)
        count += _spread(part, points, None)
    for start in range(0, subset.size, CHUNK):
        spread = _spread(subset[start:start + CHUNK], points, None)
        residual += -spread if right else spread
    return residual, count


def _smooth(values: np.ndarray, sigma: float) -> np.ndarray:
    """relplot's ``ReflectedGaussianKernel.convolve``: reflect at both ends, convolve, keep the middle."""
    points = values.size
    t = np.linspace(0, 1, points)
    kernel = np.exp(-(t - 0.5) ** 2 / (2 * sigma * sigma)) / (math.sqrt(2 * math.pi) * sigma)
    extended = np.concatenate([values[::-1][:-1], values, values[::-1][1:]])
    return np.convolve(extended, kernel, "valid")[points // 2: points // 2 + points]


def _interpolate(t: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Linear interpolation of ``i / (len - 1) -> values[i]`` at ``t`` (relplot's ``interpolate``)."""
    count = values.size
    index = (t * (count - 1)).astype(np.int64).clip(0, count - 2)
    residual = (t - index / (count - 1)) * (count - 1)
    return values[index] * (1 - residual) + values[index + 1] * residual


def smooth_ece_at(confidence: np.ndarray, wrong_confidence: np.ndarray, sigma: float,
                  cache: dict[int, tuple[np.ndarray, np.ndarray]], *, right: bool = False) -> float:
    """smECE at a fixed bandwidth ``sigma`` (relplot's ``smooth_ece``), the grid sums kept in ``cache`` by grid size;
    ``right`` as for :func:`smooth_ece`."""
    mesh = np.linspace(0, 1, max(round(10 / sigma), MESH_POINTS))
    points = max(2000, round(20 / sigma)) // 2 + 1
    if points not in cache:
        cache[points] = _grid_sums(confidence, wrong_confidence, points, right)
    residual, count = cache[points]
    smoothed = _interpolate(mesh, _smooth(residual, sigma))
    density = _interpolate(mesh, _smooth(count, sigma)) + 1e-4
    return float(np.sum(np.abs(smoothed / density) * density) / np.sum(density))


def smooth_ece(confidence: np.ndarray, wrong_confidence: np.ndarray, *, right: bool = False) -> float:
    """smECE at relplot's default bandwidth (the fixed point ``smECE(sigma) = sigma``); NaN without rows. With
    ``right`` the second array holds the correctly classified rows' confidences instead of the misclassified rows'."""
    confidence = np.asarray(confidence, dtype=np.float64)
    wrong_confidence = np.asarray(wrong_confidence, dtype=np.float64)
    if confidence.size == 0:
        return math.nan
    cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def accepted(sigma: float) -> bool:
        return sigma < MIN_BANDWIDTH or sigma < smooth_ece_at(confidence, wrong_confidence, sigma, cache, right=right)

    sigma = 1.0
    if not accepted(sigma):
        high, low = 1.0, 0.0
        for _ in range(HALVINGS):
            middle = (high + low) / 2
            if accepted(middle):
                low = middle
            else:
                high = middle
        sigma = high
    return smooth_ece_at(confidence, wrong_confidence, sigma, cache, right=right)


def enabled() -> bool:
    """False when ``TEMPCAL_SKIP_DECISIONS=1`` (cost measurements only)."""
    return os.environ.get(SKIP_VARIABLE, "") != "1"


def decision_figures(confidence: np.ndarray, correct: np.ndarray, *, overwrite: bool = False) -> DecisionFigures:
    """The figures of any rows with these confidences (float64) and correctness (bool); ``overwrite`` lets the
    confidences be ranked in place (the array is then sorted and negated)."""
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    if confidence.size == 0:
        return DecisionFigures()
    right = 2 * int(np.count_nonzero(correct)) < confidence.size  # keep whichever subset is smaller
    subset = subset_of(confidence, correct, right)
    smooth = smooth_ece(confidence, subset, right=right)  # order-free sums, before the ranking negates the values
    subset = rank_in_place(subset)
    ranked = rank_in_place(confidence if overwrite else confidence.copy())
    figures = ranked_metrics(ranked, subset, right=right)
    coverage, risk = ranked_curve(ranked, subset, CURVE_POINTS, right=right)
    return DecisionFigures(aurc=figures.aurc, eaurc=figures.eaurc, augrc=figures.augrc, smece=smooth,
                           risk_coverage={"coverage": coverage.tolist(), "risk": risk.tolist()})


def subset_decisions(metrics, confidence: torch.Tensor, correct: torch.Tensor):
    """``metrics`` (a :class:`~tempcal.metrics.calibration.CalibrationMetrics`) with the decision figures of a subset's
    rows (a group's, the out-of-fold rows): the row figure :mod:`tempcal.subsets.cells` applies."""
    if not enabled():
        return metrics
    return replace(metrics, **vars(decision_figures(confidence.detach().cpu().numpy(), correct.detach().cpu().numpy())))


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


def gathered_correct(correct: torch.Tensor) -> np.ndarray:
    """Whether each row's prediction is right (bool ``[rows]``), every rank's rows in rank order, on the host (one
    byte per row; the scan's own flags, uncopied, in a single CPU process)."""
    if not parallel.active():
        return correct.cpu().numpy()
    return all_gather_rows(correct.to(torch.uint8)).cpu().numpy().view(bool)  # collectives take no bool


def temperatures_per_read(rows: int, device: torch.device | str) -> int:
    """How many temperatures' confidences one read may keep: all of them, unless ``rows`` floats per temperature
    would take more than :data:`MEMORY_SHARE` of the memory free on ``device`` (and the host)."""
    free = [b for b in (available_bytes(device), available_bytes("cpu")) if b is not None]
    if not free or rows == 0:
        return 1 << 30
    return max(1, int(min(free) * MEMORY_SHARE) // (ROW_BYTES * rows))


__all__ = ["CHUNK", "MAX_GROUPS", "decision_figures", "enabled", "gathered_correct", "harmonic", "rank_in_place",
           "ranked_curve", "ranked_metrics", "smooth_ece", "subset_decisions", "temperatures_per_read"]
