"""Calibration metrics at a temperature, as defined in the CLI contract.

* Confidence: the largest predicted probability; prediction: its arg-max (first on ties;
  a single binary logit predicts class 1 when ``sigmoid >= 0.5``).
* ECE: ``bins`` equal-width bins over [0, 1]; bin i holds confidences in (i/B, (i+1)/B]
  and the first also holds 0; ``ECE = sum_i (n_i / N) |acc_i - conf_i|``. MCE: the largest
  such gap over non-empty bins. RMS calibration error (``rms_ce``, :func:`.estimators.rms_from_sums`): the
  same bins, ``sqrt(sum_i (n_i / N) (acc_i - conf_i)^2)`` (the figure confidence-based leaderboards quote).
* NLL: mean negative natural log of the true class's probability. Brier: mean over samples
  of ``sum_c (p_c - onehot_c)^2``. Entropy: mean of ``-sum_c p_c ln p_c`` (nats).
* Each bin's accuracy carries a 95% Wilson score interval (Wilson 1927), which stays inside [0, 1] and does not
  shrink to a point at accuracy 0 or 1, so a bin of 3 samples shows its uncertainty. An empty bin has none.
* What T does to decisions (:mod:`.decisions`, from the same pass's per-row confidences): AURC, E-AURC and
  AUGRC of the risk-coverage curve, the smooth ECE, and the curve itself. Figures of an optional capability that
  ride on the same read (the conformal sets of :mod:`tempcal.conformal`) come in through :class:`ReadExtra`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from statistics import NormalDist
from typing import Protocol

import numpy as np
import torch

from ..core.calibration_pass import DEFAULT_BINS
from ..core.scan import CalibrationSums, Scan
from ..errors import TempcalError
from . import decisions as decisions_module
from .estimators import rms_from_sums

#: The level of the per-bin accuracy intervals.
BIN_INTERVAL_LEVEL = 0.95


class SetFigures(Protocol):
    """One entry of a result's ``conformal`` list (a :class:`tempcal.conformal.ConformalResult`), as the metrics
    and the renderers read it."""

    @property
    def alpha(self) -> float: ...
    @property
    def score(self) -> str: ...
    @property
    def coverage(self) -> float: ...
    @property
    def mean_size(self) -> float: ...
    def to_json(self) -> dict: ...


@dataclass(frozen=True)
class ReliabilityBin:
    """One equal-width confidence bin; ``confidence``, ``accuracy`` and its interval are None when it is empty.

    ``accuracy_low`` and ``accuracy_high`` bound the bin's accuracy: the 95% Wilson score interval.
    """

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
    for i in range(bins_total):
        c = int(count[i])
        correct = float(sums.bin_correct[i])
        low, high = wilson_interval(correct, c) if c else (None, None)
        rows.append(ReliabilityBin(
            lower=i / bins_total, upper=(i + 1) / bins_total, count=c,
            confidence=float(sums.bin_confidence[i] / c) if c else None,
            accuracy=correct / c if c else None, accuracy_low=low, accuracy_high=high))
    return CalibrationMetrics(
        tau=float(tau), count=n, nll=sums.nll / n, ece=ece, mce=mce, brier=sums.brier / n,
        accuracy=sums.correct / n, entropy=sums.entropy / n, mean_confidence=sums.confidence / n,
        bins=rows, rms_ce=rms_from_sums(sums) if n else 0.0)


def evaluate(scan: Scan, tau: float = 1.0, *, bins: int = DEFAULT_BINS) -> CalibrationMetrics:
    """Calibration metrics of ``scan``'s samples at temperature ``tau`` (one pass)."""
    return evaluate_many(scan, [tau], bins=bins)[0]


#: Called with a temperature, every row's confidence there (float64, every rank's rows) and the rows'
#: correctness, before the ranking reorders the confidences: a group's or a fold's figures from the same read.
RowsHook = Callable[[float, np.ndarray, np.ndarray], None]


#: After a read, what a :class:`ReadExtra` adds to the ``k``-th temperature's result: ``(k, tau, metrics, rows)``.
Finish = Callable[[int, float, "CalibrationMetrics", int], "CalibrationMetrics"]


class ExtraVisitor(Protocol):
    """The chunk visitor of one read for a :class:`ReadExtra` (see :meth:`Scan.calibration` ``visitor=``)."""

    def add(self, k: int, beta: float, d: torch.Tensor, labels: torch.Tensor, start: int) -> None: ...

    def settle(self) -> Finish:
        """Reduce across ranks once the read is over; the function that adds the figures to each result."""
        ...


class ReadExtra(Protocol):
    """Figures of an optional capability that ride on the metrics pass (e.g. :class:`tempcal.conformal.ConformalPlan`):
    planned for every temperature of :func:`evaluate_many`, visited a read at a time."""

    def check(self, temperatures: int) -> None:
        """Raise ``ValueError`` when the plan is not for ``temperatures`` temperatures."""
        ...

    def visitor(self, first: int, stop: int, device: torch.device) -> ExtraVisitor:
        """The visitor of the read that serves temperatures ``first`` to ``stop`` (exclusive)."""
        ...


def evaluate_many(scan: Scan, taus: Sequence[float], *, bins: int = DEFAULT_BINS, decisions: bool | None = None,
                  extra: ReadExtra | None = None, on_rows: RowsHook | None = None) -> list[CalibrationMetrics]:
    """Calibration metrics at several temperatures in one pass over the data.

    The decision figures come from the same read (every row's confidence at every temperature; beyond a quarter
    of the free memory, a group of temperatures per read); ``extra`` adds its figures from these rows (the conformal
    sets), ``on_rows`` sees every temperature's confidences.
    """
    for tau in taus:
        if not tau > 0:
            raise ValueError(f"temperature must be > 0, got {tau}")
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    if extra is not None:
        extra.check(len(taus))
    decisions = decisions_module.enabled() if decisions is None else decisions
    taus = [float(t) for t in taus]
    step = max(decisions_module.temperatures_per_read(scan.data.num_samples, scan.device), 1) if decisions \
        else len(taus)
    out: list[CalibrationMetrics] = []
    for first in range(0, len(taus), step):
        visitor = None if extra is None else extra.visitor(first, min(first + step, len(taus)), scan.device)
        out += _evaluate_read(scan, taus[first:first + step], bins, decisions, visitor, on_rows)
    return out


def _evaluate_read(scan: Scan, taus: list[float], bins: int, decisions: bool, sets: ExtraVisitor | None,
                   on_rows: RowsHook | None) -> list[CalibrationMetrics]:
    """:func:`evaluate_many` of the temperatures that one read serves."""
    results = scan.calibration([1.0 / tau for tau in taus], bins, keep=("confidence",) if decisions else (),
                               visitor=sets)
    correct = decisions_module.gathered_correct(scan.stats.correct) if decisions else None
    finish = sets.settle() if sets is not None else None
    out = []
    for k, (tau, (sums, kept)) in enumerate(zip(taus, results, strict=True)):
        metrics = from_sums(tau, sums)
        if kept is not None and correct is not None:
            confidence = decisions_module.gathered_confidence(kept.pop("confidence"))
            if on_rows is not None:
                on_rows(tau, confidence, correct)
            figures = decisions_module.decision_figures(confidence, correct, overwrite=True)
            del confidence
            metrics = replace(metrics, aurc=figures.aurc, eaurc=figures.eaurc, augrc=figures.augrc,
                              smece=figures.smece, risk_coverage=figures.risk_coverage)
        if finish is not None:
            metrics = finish(k, tau, metrics, sums.count)
        out.append(metrics)
    return out


def calibration_metrics(logits, labels, tau: float = 1.0, *, bins: int = DEFAULT_BINS,
                        device: str | torch.device = "auto", probs: bool = False) -> CalibrationMetrics:
    """Calibration metrics of raw logits (tensor or array) and labels at temperature ``tau``."""
    from ..core.data import as_logits_data

    return evaluate(Scan(as_logits_data(logits, labels, probs=probs), device=device), tau, bins=bins)
