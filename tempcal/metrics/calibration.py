"""Calibration metrics at a temperature as docs/metrics.md defines them (NLL, ECE, MCE, RMS CE, Brier, accuracy,
entropy, equal-width bins with 95% Wilson intervals), the decision figures of the same read (:mod:`.decisions`) and an
optional capability's (:class:`ReadExtra`); the ``--estimators``, which sort (confidence, correct) before any sum, so
that the order of the samples cannot change a figure."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Protocol

import numpy as np
import torch

from ..core.kernels import DEFAULT_BINS, bin_edges
from ..core.parallel import all_gather_rows
from ..core.scan import CalibrationSums, ClasswiseSums, Scan
from ..errors import TempcalError, as_temperature, check_bins, check_confidences
from . import decisions as decisions_module

#: The level of the per-bin accuracy intervals.
BIN_INTERVAL_LEVEL = 0.95
#: The names :func:`estimators_for` accepts, in the order they are reported.
ESTIMATORS = ("ece_equal_mass", "ece_classwise", "rms_ce", "l2_ce_debiased")


class SetFigures(Protocol):
    """One entry of a result's ``conformal`` list (a :class:`tempcal.conformal.sets.ConformalResult`), as the results
    read it."""

    @property
    def alpha(self) -> float: ...
    @property
    def score(self) -> str: ...
    @property
    def mean_size(self) -> float: ...
    def to_json(self) -> dict: ...


@dataclass(frozen=True)
class ReliabilityBin:
    """One equal-width confidence bin, ``accuracy_low`` to ``accuracy_high`` its accuracy's 95% Wilson score interval;
    ``confidence``, ``accuracy`` and the interval are None when it is empty."""

    lower: float
    upper: float
    count: int
    confidence: float | None
    accuracy: float | None
    accuracy_low: float | None = None
    accuracy_high: float | None = None


def wilson_interval(successes: float, n: int, level: float = BIN_INTERVAL_LEVEL) -> tuple[float, float]:
    """The Wilson score interval of a proportion: ``successes`` of ``n`` trials (n >= 1), two-sided ``level``."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, {n}], got {successes}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    from statistics import NormalDist  # loaded when an interval is asked for: 2.5 ms of every import else

    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = successes / n
    z2n = z * z / n
    centre = (p + z2n / 2) / (1 + z2n)
    half = z * math.sqrt(p * (1 - p) / n + z2n / (4 * n)) / (1 + z2n)
    # At p = 0 (or 1) the lower (upper) bound is exactly 0 (1); rounding must not move it off.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


@dataclass(frozen=True)
class CalibrationMetrics:
    """Calibration of ``softmax(logits / tau)`` on a set of samples."""

    tau: float
    count: int
    nll: float
    ece: float
    mce: float
    brier: float
    accuracy: float
    entropy: float
    mean_confidence: float
    bins: list[ReliabilityBin] = field(default_factory=list)
    aurc: float = math.nan
    eaurc: float = math.nan
    augrc: float = math.nan
    smece: float = math.nan
    risk_coverage: dict[str, list[float]] = field(default_factory=dict)  # {"coverage": [...], "risk": [...]}
    conformal: Sequence[SetFigures] = field(default_factory=list)
    rms_ce: float = math.nan  # RMS calibration error over the ECE's bins

    def summary(self) -> dict[str, float]:
        """The contract's five headline figures, with the RMS calibration error beside ECE."""
        return {"nll": self.nll, "ece": self.ece, "rms_ce": self.rms_ce, "mce": self.mce, "brier": self.brier,
                "accuracy": self.accuracy}

    def decisions(self) -> dict:
        """The decision figures as JSON: AURC, E-AURC, AUGRC, smooth ECE, the risk-coverage curve and (when asked
        for) the conformal sets."""
        figures = {"aurc": self.aurc, "eaurc": self.eaurc, "augrc": self.augrc, "smece": self.smece}
        out: dict = {name: None if math.isnan(value) else value for name, value in figures.items()}  # not computed
        out["risk_coverage"] = self.risk_coverage
        if self.conformal:
            out["conformal"] = [c.to_json() for c in self.conformal]
        return out

    def to_dict(self, *, with_bins: bool = True) -> dict:
        out = asdict(self)
        out.pop("conformal")
        out.update(self.decisions())
        if not with_bins:
            out.pop("bins")
        return out


def from_sums(tau: float, sums: CalibrationSums) -> CalibrationMetrics:
    """Turn one pass's sums into the reported figures; an NLL that overflows float64 (it grows as 1 / T, so at a
    T near the smallest one taken) is bad input, not a figure."""
    n = sums.count
    if n and not math.isfinite(sums.nll):
        raise TempcalError(f"at T = {tau!r} the NLL overflows float64 (it grows as 1 / T); use a larger temperature")
    bins_total = sums.bin_count.numel()
    count = sums.bin_count
    nonempty = count > 0
    safe = count.clamp_min(1)
    gap = (sums.bin_correct / safe - sums.bin_confidence / safe).abs()
    ece = float((count / max(n, 1) * gap).sum())
    mce = float(gap[nonempty].max()) if bool(nonempty.any()) else 0.0
    rows = []
    # As Python numbers: one bin at a time from tensors costs a microsecond per element (seconds over 40,000 groups).
    counts, corrects, confidences = (t.tolist() for t in (count, sums.bin_correct, sums.bin_confidence))
    for i in range(bins_total):
        c, correct = int(counts[i]), float(corrects[i])
        low, high = wilson_interval(correct, c) if c else (None, None)
        rows.append(ReliabilityBin(
            lower=i / bins_total, upper=(i + 1) / bins_total, count=c,
            confidence=confidences[i] / c if c else None,
            accuracy=correct / c if c else None, accuracy_low=low, accuracy_high=high))
    return CalibrationMetrics(
        tau=float(tau), count=n, nll=sums.nll / n, ece=ece, mce=mce, brier=sums.brier / n,
        accuracy=sums.correct / n, entropy=sums.entropy / n, mean_confidence=sums.confidence / n,
        bins=rows, rms_ce=_rms_of_gaps(count, gap) if n else 0.0)


def evaluate(scan: Scan, tau: float = 1.0, *, bins: int = DEFAULT_BINS) -> CalibrationMetrics:
    """Calibration metrics of ``scan``'s samples at temperature ``tau`` (one pass)."""
    return evaluate_many(scan, [tau], bins=bins)[0]


#: After a read, what a :class:`ReadExtra` adds to the ``k``-th temperature's result: ``(k, tau, metrics, rows)``.
Finish = Callable[[int, float, "CalibrationMetrics", int], "CalibrationMetrics"]


class ExtraVisitor(Protocol):
    """The chunk visitor of one read for a :class:`ReadExtra` (see :meth:`Scan.calibration` ``visitor=``)."""

    def add(self, betas: Sequence[float], d: torch.Tensor, labels: torch.Tensor, start: int) -> None: ...

    def settle(self) -> Finish:
        """Reduce across ranks once the read is over; the function that adds the figures to each result."""


class ReadExtra(Protocol):
    """Figures of an optional capability that ride on the metrics pass (e.g. ``conformal.passes.ConformalPlan``):
    planned for every temperature of :func:`evaluate_many`, visited a read at a time."""

    def check(self, temperatures: int) -> None:
        """Raise ``ValueError`` when the plan is not for ``temperatures`` temperatures."""

    def visitor(self, first: int, stop: int, device: torch.device) -> ExtraVisitor:
        """The visitor of the read that serves temperatures ``first`` to ``stop`` (exclusive)."""


def evaluate_many(scan: Scan, taus: Sequence[float], *, bins: int = DEFAULT_BINS,
                  extra: ReadExtra | None = None) -> list[CalibrationMetrics]:
    """Calibration metrics at several temperatures in one pass over the data, with the decision figures (beyond a
    quarter of the free memory, a group of temperatures per read) and ``extra``'s (the conformal sets)."""
    for tau in taus:
        if not tau > 0:
            raise ValueError(f"temperature must be > 0, got {tau}")
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    if extra is not None:
        extra.check(len(taus))
    decisions = decisions_module.enabled()
    taus = [float(t) for t in taus]
    step = decisions_module.temperatures_per_read(scan.data.num_samples, scan.device) if decisions else len(taus)
    out: list[CalibrationMetrics] = []
    for first in range(0, len(taus), step):
        visitor = None if extra is None else extra.visitor(first, min(first + step, len(taus)), scan.device)
        out += _evaluate_read(scan, taus[first:first + step], bins, decisions, visitor)
    return out


def _evaluate_read(scan: Scan, taus: list[float], bins: int, decisions: bool, sets: ExtraVisitor | None
                   ) -> list[CalibrationMetrics]:
    """:func:`evaluate_many` of the temperatures that one read serves."""
    results = scan.calibration([1.0 / tau for tau in taus], bins, keep=("confidence",) if decisions else (),
                               visitor=sets)
    correct = decisions_module.gathered_correct(scan.stats.correct) if decisions else None
    finish = sets.settle() if sets is not None else None
    out = []
    for k, (tau, (sums, kept)) in enumerate(zip(taus, results, strict=True)):
        metrics = from_sums(tau, sums)
        if kept is not None and correct is not None:
            confidence = all_gather_rows(kept.pop("confidence")).cpu().numpy()  # every rank's rows, in rank order
            figures = decisions_module.decision_figures(confidence, correct, overwrite=True)
            del confidence
            metrics = replace(metrics, **vars(figures))
        if finish is not None:
            metrics = finish(k, tau, metrics, sums.count)
        out.append(metrics)
    return out


def calibration_metrics(logits, labels, tau: float = 1.0, *, bins: int = DEFAULT_BINS,
                        device: str | torch.device = "auto", probs: bool = False) -> CalibrationMetrics:
    """Calibration metrics of raw logits (tensor or array) and labels at temperature ``tau``."""
    from ..core.data import as_logits_data

    return evaluate(Scan(as_logits_data(logits, labels, probs=probs), device=device), tau, bins=bins)


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
    """Non-empty equal-mass bins over sorted confidences: counts, sums and member ranges (float64 arrays)."""

    count: np.ndarray
    confidence: np.ndarray  # sum of members' confidences
    correct: np.ndarray  # number of correct members
    lower: np.ndarray  # smallest member confidence
    upper: np.ndarray  # largest member confidence

    def ece(self) -> float:
        return float(np.sum(np.abs(self.correct - self.confidence)) / self.count.sum())

    def debiased_l2(self) -> float:
        accuracy = self.correct / self.count
        gap2 = (self.confidence / self.count - accuracy) ** 2
        terms = np.where(self.count >= 2, gap2 - accuracy * (1 - accuracy) / np.maximum(self.count - 1, 1), 0.0)
        return math.sqrt(max(float(np.sum(self.count / self.count.sum() * terms)), 0.0))


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
    return EqualMassBins(count=(stop - start).astype(np.float64),
                         confidence=np.add.reduceat(c, start), correct=np.add.reduceat(k, start),
                         lower=c[start], upper=c[stop - 1])


def equal_mass_bins(confidence, correct, bins: int = 15) -> EqualMassBins:
    """Equal-mass bins of the confidences: the cut between bins j and j+1 after rank round(j N / B) (halves up),
    moved to the nearer end of a run of tied confidences (the upper on a tie), coinciding cuts merged; so at most B
    non-empty bins that depend only on the multiset of confidences."""
    c, k = _per_sample(confidence, correct)
    return _equal_mass(c, k, check_bins(bins))


def ece_equal_mass(confidence, correct, bins: int = 15) -> float:
    """ECE over :func:`equal_mass_bins`: sum over bins of (n_b / N) |accuracy_b - mean confidence_b| (Nixon et al.
    2019; the ECE_EM of Roelofs et al., AISTATS 2022)."""
    return equal_mass_bins(confidence, correct, bins).ece()


def debiased_l2_calibration_error(confidence, correct, bins: int = 15) -> float:
    """Debiased L2 calibration error of Kumar, Liang & Ma (NeurIPS 2019) over :func:`equal_mass_bins`:
    ``sqrt(max(0, sum_b (n_b/N) [(conf_b - acc_b)^2 - acc_b (1 - acc_b) / (n_b - 1)]))``, bins of one sample adding
    0 as in the authors' code."""
    return equal_mass_bins(confidence, correct, bins).debiased_l2()


# -- equal-width bins ----------------------------------------------------------------------

def rms_from_bins(count: torch.Tensor, confidence: torch.Tensor, correct: torch.Tensor) -> float:
    """RMS calibration error from float64 per-bin count (of at least one row), confidence sum and correct sum."""
    safe = count.clamp_min(1)
    return _rms_of_gaps(count, (correct / safe - confidence / safe).abs())


def _rms_of_gaps(count: torch.Tensor, gap: torch.Tensor) -> float:
    """``sqrt(sum_b (n_b / N) gap_b^2)`` from float64 per-bin counts and |accuracy - confidence| gaps."""
    return math.sqrt(float((count / float(count.sum()) * (gap * gap)).sum()))


def rms_calibration_error(confidence, correct, bins: int = 15) -> float:
    """RMS calibration error: sqrt(sum over the contract's equal-width bins of (n_b / N)(acc_b - conf_b)^2)
    (Hendrycks, Mazeika & Dietterich, ICLR 2019)."""
    bins = check_bins(bins)
    return _rms_of(*_per_sample(confidence, correct), bins)


def _rms_of(c: np.ndarray, k: np.ndarray, bins: int) -> float:
    index = equal_width_index(c, bins)
    return rms_from_bins(*(torch.from_numpy(np.bincount(index, weights=w, minlength=bins).astype(np.float64))
                           for w in (None, c, k)))


# -- classwise ECE: a reduction over row chunks ----------------------------------------------

def classwise_ece(sums: ClasswiseSums) -> float:
    """Classwise ECE of Kull et al. (NeurIPS 2019): ``(1 / (C N)) sum_{c,b} |hits_cb - sum p_c over bin b|``."""
    if sums.total <= 0:
        raise TempcalError("calibration estimators need at least one sample, got 0")
    classes = sums.count.shape[0]
    return float((sums.hits - sums.probability).abs().sum()) / (classes * sums.total)


# -- one entry point -------------------------------------------------------------------------

def estimators_for(scan: Scan, tau: float, bins: int, names: Sequence[str] = ESTIMATORS, *,
                   per_sample: Mapping[str, torch.Tensor] | None = None) -> dict[str, float]:
    """The named estimators of ``softmax(logits / tau)`` on ``scan``'s samples (every rank's), keyed by name: one
    :meth:`Scan.per_sample` pass (or the caller's ``per_sample`` at ``tau``), and one more for the classwise ECE."""
    for name in names:
        if name not in ESTIMATORS:
            raise TempcalError(f"unknown calibration estimator {name!r}; choose from {', '.join(ESTIMATORS)}")
    bins = check_bins(bins)
    beta = 1.0 / as_temperature(tau)
    if scan.num_samples < 1:
        raise TempcalError("calibration estimators need at least one sample, got 0")
    out: dict[str, float] = {}
    if "ece_equal_mass" in names or "l2_ce_debiased" in names:
        stats = per_sample if per_sample is not None else scan.per_sample(beta)
        c, k = _per_sample(stats["confidence"], stats["correct"])
        mass = _equal_mass(c, k, bins)
        out.update(ece_equal_mass=mass.ece(), l2_ce_debiased=mass.debiased_l2())  # the names asked are kept
        if "rms_ce" in names:  # the same confidences in the same bins as the calibration pass
            out["rms_ce"] = _rms_of(c, k, bins)
    elif "rms_ce" in names:
        [(sums, _)] = scan.calibration([beta], bins)
        out["rms_ce"] = rms_from_bins(sums.bin_count, sums.bin_confidence, sums.bin_correct)
    if "ece_classwise" in names:
        out["ece_classwise"] = classwise_ece(scan.classwise(beta, bins))
    return {name: out[name] for name in names}
