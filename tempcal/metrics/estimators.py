"""Calibration-error estimators beside the contract's equal-width ECE, each a function of the data alone.

Per-sample estimators take ``confidence`` (max softmax) and ``correct`` as :meth:`Scan.per_sample` gives them,
and sort them by (confidence, correct) before any sum, so that the order of the samples cannot change a figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..core.calibration_pass import bin_edges
from ..core.scan import CalibrationSums, ClasswiseSums, Scan
from ..errors import TempcalError
from ..validation import as_temperature, check_bins, check_confidences

#: The names :func:`estimators_for` accepts, in the order they are reported.
ESTIMATORS = ("ece_equal_mass", "ece_classwise", "rms_ce", "l2_ce_debiased")


# -- shared helpers ----------------------------------------------------------------------

def equal_width_index(values: np.ndarray, bins: int) -> np.ndarray:
    """Contract bin of each value: bin i holds (i/B, (i+1)/B], the first also 0 (as :meth:`Scan.calibration`)."""
    edges = bin_edges(bins).numpy()
    return np.clip(np.searchsorted(edges, np.asarray(values, dtype=np.float64), side="left") - 1, 0, bins - 1)


def _per_sample(confidence, correct) -> tuple[np.ndarray, np.ndarray]:
    """float64 numpy copies of the inputs, checked, sorted by (confidence, correct) so sums are order-free."""
    c = torch.as_tensor(confidence).detach().to("cpu", torch.float64).numpy().reshape(-1)
    k = torch.as_tensor(correct).detach().to("cpu", torch.float64).numpy().reshape(-1)
    if c.shape != k.shape:
        raise TempcalError(f"confidence has {c.size} values but correct has {k.size}")
    if c.size == 0:
        raise TempcalError("calibration estimators need at least one sample, got 0")
    check_confidences(c)
    order = np.lexsort((k, c))
    return c[order], k[order]


# -- equal-mass bins -----------------------------------------------------------------------

@dataclass(frozen=True)
class EqualMassBins:
    """Non-empty equal-mass bins over sorted confidences: member ranges, counts and sums (float64 arrays)."""

    start: np.ndarray  # first member's rank in the sorted confidences
    count: np.ndarray
    confidence: np.ndarray  # sum of members' confidences
    correct: np.ndarray  # number of correct members
    lower: np.ndarray  # smallest member confidence
    upper: np.ndarray  # largest member confidence

    @property
    def total(self) -> int:
        return int(self.count.sum())


def _equal_mass(c: np.ndarray, k: np.ndarray, bins: int) -> EqualMassBins:
    """Bins of sorted ``c`` (with ``k`` sorted alongside); see :func:`equal_mass_bins`."""
    n = c.size
    # A cut after rank p (p samples below it) is allowed only between two different confidences.
    allowed = np.concatenate(([0], np.flatnonzero(c[1:] != c[:-1]) + 1, [n]))
    nominal = (2 * np.arange(1, bins, dtype=np.int64) * n + bins) // (2 * bins)  # round(j n / B), half up
    above = np.searchsorted(allowed, nominal, side="left")  # allowed[above] >= nominal
    hi = allowed[above]
    lo = allowed[np.maximum(above - 1, 0)]
    snapped = np.where(hi - nominal <= nominal - lo, hi, lo)  # nearest allowed cut; the upper one on a tie
    cuts = np.unique(np.concatenate(([0], snapped, [n])))
    start, stop = cuts[:-1], cuts[1:]
    return EqualMassBins(start=start, count=(stop - start).astype(np.float64),
                         confidence=np.add.reduceat(c, start), correct=np.add.reduceat(k, start),
                         lower=c[start], upper=c[stop - 1])


def equal_mass_bins(confidence, correct, bins: int = 15) -> EqualMassBins:
    """Equal-mass bins of the confidences: the cut between bins j and j+1 after rank round(j N / B) (halves up),
    moved to the nearer end of a run of tied confidences (the upper on a tie), coinciding cuts merged; so at most B
    non-empty bins that depend only on the multiset of confidences."""
    c, k = _per_sample(confidence, correct)
    return _equal_mass(c, k, check_bins(bins))


def _ece_of(b: EqualMassBins) -> float:
    return float(np.sum(np.abs(b.correct - b.confidence)) / b.total)


def _debiased_of(b: EqualMassBins) -> float:
    accuracy = b.correct / b.count
    gap2 = (b.confidence / b.count - accuracy) ** 2
    safe = np.maximum(b.count - 1, 1)
    terms = np.where(b.count >= 2, gap2 - accuracy * (1 - accuracy) / safe, 0.0)
    return math.sqrt(max(float(np.sum(b.count / b.total * terms)), 0.0))


def ece_equal_mass(confidence, correct, bins: int = 15) -> float:
    """ECE over :func:`equal_mass_bins`: sum over bins of (n_b / N) |accuracy_b - mean confidence_b| (Nixon et al.
    2019; the ECE_EM of Roelofs et al., AISTATS 2022)."""
    return _ece_of(equal_mass_bins(confidence, correct, bins))


def debiased_l2_calibration_error(confidence, correct, bins: int = 15) -> float:
    """Debiased L2 calibration error of Kumar, Liang & Ma (NeurIPS 2019) over :func:`equal_mass_bins`:
    ``sqrt(max(0, sum_b (n_b/N) [(conf_b - acc_b)^2 - acc_b (1 - acc_b) / (n_b - 1)]))``, bins of one sample adding
    0 as in the authors' code."""
    return _debiased_of(equal_mass_bins(confidence, correct, bins))


# -- equal-width bins ----------------------------------------------------------------------

def rms_from_bins(count: torch.Tensor, confidence: torch.Tensor, correct: torch.Tensor) -> float:
    """RMS calibration error from per-bin count, confidence sum and correct sum."""
    count, confidence, correct = (torch.as_tensor(t, dtype=torch.float64).cpu() for t in (count, confidence, correct))
    total = float(count.sum())
    if total <= 0:
        raise TempcalError("calibration estimators need at least one sample, got 0")
    safe = count.clamp_min(1)
    gap2 = (correct / safe - confidence / safe) ** 2
    return math.sqrt(float((count / total * gap2).sum()))


def rms_calibration_error(confidence, correct, bins: int = 15) -> float:
    """RMS calibration error: sqrt(sum over the contract's equal-width bins of (n_b / N)(acc_b - conf_b)^2)
    (Hendrycks, Mazeika & Dietterich, ICLR 2019)."""
    bins = check_bins(bins)
    return _rms_of(*_per_sample(confidence, correct), bins)


def _rms_of(c: np.ndarray, k: np.ndarray, bins: int) -> float:
    index = equal_width_index(c, bins)
    return rms_from_bins(*(torch.from_numpy(np.bincount(index, weights=w, minlength=bins).astype(np.float64))
                           for w in (None, c, k)))


def rms_from_sums(sums: CalibrationSums) -> float:
    """RMS calibration error from one :meth:`Scan.calibration` pass's equal-width bin sums."""
    return rms_from_bins(sums.bin_count, sums.bin_confidence, sums.bin_correct)


# -- classwise ECE: a reduction over row chunks ----------------------------------------------

def classwise_ece(sums: ClasswiseSums) -> float:
    """Classwise ECE of Kull et al. (NeurIPS 2019): ``(1 / (C N)) sum_{c,b} |hits_cb - sum p_c over bin b|``."""
    if sums.total <= 0:
        raise TempcalError("calibration estimators need at least one sample, got 0")
    classes = sums.count.shape[0]
    return float((sums.hits - sums.probability).abs().sum()) / (classes * sums.total)


# -- one entry point -------------------------------------------------------------------------

def check_names(names: Sequence[str]) -> list[str]:
    """The requested estimator names, checked and without repeats; an unknown name is a usage error."""
    out: list[str] = []
    for name in names:
        if name not in ESTIMATORS:
            raise TempcalError(f"unknown calibration estimator {name!r}; choose from {', '.join(ESTIMATORS)}")
        if name not in out:
            out.append(name)
    return out


def estimators_for(scan: Scan, tau: float, bins: int, names: Sequence[str] = ESTIMATORS, *,
                   per_sample: Mapping[str, torch.Tensor] | None = None) -> dict[str, float]:
    """The named estimators of ``softmax(logits / tau)`` on ``scan``'s samples (every rank's), keyed by name: one
    :meth:`Scan.per_sample` pass (or the caller's ``per_sample`` at ``tau``), and one more for the classwise ECE."""
    names = check_names(names)
    bins = check_bins(bins)
    value = as_temperature(tau)
    if scan.num_samples < 1:
        raise TempcalError("calibration estimators need at least one sample, got 0")
    beta = 1.0 / value
    out: dict[str, float] = {}
    if "ece_equal_mass" in names or "l2_ce_debiased" in names:
        stats = per_sample if per_sample is not None else scan.per_sample(beta)
        c, k = _per_sample(stats["confidence"], stats["correct"])
        mass = _equal_mass(c, k, bins)
        if "ece_equal_mass" in names:
            out["ece_equal_mass"] = _ece_of(mass)
        if "l2_ce_debiased" in names:
            out["l2_ce_debiased"] = _debiased_of(mass)
        if "rms_ce" in names:  # the same confidences in the same bins as the calibration pass
            out["rms_ce"] = _rms_of(c, k, bins)
    elif "rms_ce" in names:
        [(sums, _)] = scan.calibration([beta], bins)
        out["rms_ce"] = rms_from_sums(sums)
    if "ece_classwise" in names:
        out["ece_classwise"] = classwise_ece(scan.classwise(beta, bins))
    return {name: out[name] for name in names}


__all__ = ["ESTIMATORS", "EqualMassBins", "check_names", "classwise_ece", "debiased_l2_calibration_error",
           "ece_equal_mass", "equal_mass_bins", "equal_width_index", "estimators_for", "rms_calibration_error",
           "rms_from_bins", "rms_from_sums"]
