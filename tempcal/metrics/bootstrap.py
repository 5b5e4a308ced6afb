"""Seeded percentile-bootstrap intervals for the contract's ECE, the NLL and AURC, E-AURC, AUGRC, from one per-sample
pass: resample r counts the draws of the r-th ``default_rng(seed).integers(0, N, size=N)`` call, so its figures are
count vectors times fixed per-sample figures (laid out by confidence for the risk-coverage closed forms), the same
whatever the batching; nothing is re-read or re-sorted."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np
import torch

from ..core.scan import Scan
from ..errors import TempcalError, as_temperature, check_bins, check_confidences, whole_number
from .calibration import equal_width_index
from .decisions import block_terms, optimal_aurc
from .detection import percentile_interval

#: A batch of resamples keeps its count matrix under about this many entries (float64: 8 bytes each).
BATCH_ENTRIES = 1 << 22


def bootstrap_replicates(confidence, correct, nll_per_sample, n_resamples: int, seed: int, bins: int = 15,
                         *, batch: int | None = None) -> dict[str, np.ndarray]:
    """The contract's ECE, the mean NLL and the risk-coverage figures of ``n_resamples`` seeded resamples as float64
    arrays ``{"ece": [R], "nll": [R], "aurc": [R], ...}``; ``batch`` changes memory and speed, never the draws."""
    c, k, nll = _inputs(confidence, correct, nll_per_sample)
    n = c.size
    n_resamples = whole_number(n_resamples, "bootstrap resamples")
    bins = check_bins(bins)
    seed = whole_number(seed, "bootstrap seed", minimum=0)
    batch = max(1, min(n_resamples, int(batch) if batch else BATCH_ENTRIES // n))
    # A resample holds N samples, so its ECE is sum_b |sum_{i in b} w_i (correct_i - confidence_i)| / N: only
    # the per-sample gap matters, not the bin counts. Samples are laid out in order of confidence (so bin by bin),
    # so each bin's weighted sum is one matrix-vector product over a contiguous block of the count matrix, and a
    # run of tied confidences is a contiguous block too (the risk-coverage figures).
    index = equal_width_index(c, bins)
    order = np.argsort(c, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    bounds = np.searchsorted(index[order], np.arange(bins + 1))
    gap = (k - c)[order]
    nll = nll[order]
    ranking = _Ranking(c[order], k[order] < 0.5)
    rng = np.random.default_rng(seed)
    out = {name: np.empty(n_resamples) for name in ("ece", "nll", *RISK_COVERAGE)}
    counts = np.empty((batch, n))
    for first in range(0, n_resamples, batch):
        size = min(batch, n_resamples - first)
        for r in range(size):
            counts[r] = np.bincount(rank[rng.integers(0, n, size=n)], minlength=n)
        w = counts[:size]
        per_bin = [w[:, a:b] @ gap[a:b] for a, b in itertools.pairwise(bounds.tolist())]
        out["ece"][first : first + size] = np.abs(np.stack(per_bin, axis=1)).sum(1) / n
        out["nll"][first : first + size] = w @ nll / n
        for name, values in zip(RISK_COVERAGE, ranking.figures(w), strict=True):
            out[name][first : first + size] = values
    return out


#: The risk-coverage figures resampled beside the ECE and the NLL.
RISK_COVERAGE = ("aurc", "eaurc", "augrc")


class _Ranking:
    """Risk-coverage figures of weighted resamples of rows in ascending confidence: :mod:`.decisions`'s tie-block sums,
    each run of equal confidence a block whose size and errors are the resample's counts."""

    def __init__(self, ascending: np.ndarray, wrong: np.ndarray):
        descending = ascending[::-1]
        self.starts = np.flatnonzero(np.r_[True, descending[1:] != descending[:-1]])
        self.wrong = wrong[::-1].astype(np.float64)
        self.n = ascending.size

    def figures(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """AURC, E-AURC and AUGRC of each row of counts ``w`` ``[resamples, n]`` (ascending order)."""
        w = w[:, ::-1]
        sizes = np.add.reduceat(w, self.starts, axis=1)
        errors = np.add.reduceat(w * self.wrong, self.starts, axis=1)
        n, starts, before = self.n, np.cumsum(sizes, axis=1) - sizes, np.cumsum(errors, axis=1) - errors
        by_rank, total = block_terms(starts, sizes, errors, before)
        aurc = by_rank / n
        return aurc, aurc - optimal_aurc(n, (n - errors.sum(1)).round()), total / (n * n)


def bootstrap_intervals(confidence, correct, nll_per_sample, n_resamples: int, seed: int, bins: int = 15,
                        level: float = 0.95, *, batch: int | None = None) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap intervals ``{"ece": (low, high), "nll": ..., "aurc": ..., "eaurc": ..., "augrc": ...}`` at
    confidence ``level`` (binned ECE is biased upwards: a well-calibrated model's interval may lie above the point)."""
    if isinstance(level, bool) or not (isinstance(level, (int, float)) and 0 < level < 1):
        raise TempcalError(f"confidence level must be strictly between 0 and 1, got {level}")
    replicates = bootstrap_replicates(confidence, correct, nll_per_sample, n_resamples, seed, bins, batch=batch)
    return {name: percentile_interval(values, level) for name, values in replicates.items()}


def bootstrap_scan(scan: Scan, tau: float, n_resamples: int, seed: int, bins: int = 15, *,
                   per_sample: Mapping[str, torch.Tensor] | None = None) -> dict[str, tuple[float, float]]:
    """:func:`bootstrap_intervals` of ``scan``'s samples (every rank's, in rank order) at ``tau``: one pass (or the
    caller's ``per_sample`` at ``tau``), then resampling."""
    stats = per_sample if per_sample is not None else scan.per_sample(1.0 / as_temperature(tau))
    return bootstrap_intervals(stats["confidence"], stats["correct"], stats["nll"], n_resamples, seed, bins)


def _inputs(confidence, correct, nll) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 numpy copies of the per-sample statistics, checked for matching lengths and sane values."""
    c, k, nll = (torch.as_tensor(a).detach().to("cpu", torch.float64).numpy().reshape(-1)
                 for a in (confidence, correct, nll))
    if not (c.size == k.size == nll.size):
        raise TempcalError(f"per-sample statistics differ in length: {c.size} confidences, {k.size} "
                           f"correctness flags, {nll.size} NLL values")
    if c.size == 0:
        raise TempcalError("the bootstrap needs at least one sample, got 0")
    check_confidences(c)
    bad = ~np.isfinite(nll)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise TempcalError(f"{int(bad.sum())} non-finite per-sample NLL values; first at index {first}")
    return c, k, nll


__all__ = ["bootstrap_intervals", "bootstrap_replicates", "bootstrap_scan"]
