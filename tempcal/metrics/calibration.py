"""Calibration metrics at a temperature, as defined in the CLI contract.

* Confidence: the largest predicted probability; prediction: its arg-max (first on ties;
  a single binary logit predicts class 1 when ``sigmoid >= 0.5``).
* ECE: ``bins`` equal-width bins over [0, 1]; bin i holds confidences in (i/B, (i+1)/B]
  and the first also holds 0; ``ECE = sum_i (n_i / N) |acc_i - conf_i|``. MCE: the largest
  such gap over non-empty bins.
* NLL: mean negative natural log of the true class's probability. Brier: mean over samples
  of ``sum_c (p_c - onehot_c)^2``. Entropy: mean of ``-sum_c p_c ln p_c`` (nats).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from ..core.scan import CalibrationSums, Scan

DEFAULT_BINS = 15


@dataclass(frozen=True)
class ReliabilityBin:
    """One equal-width confidence bin; ``confidence`` and ``accuracy`` are None when it is empty."""

    lower: float
    upper: float
    count: int
    confidence: float | None
    accuracy: float | None


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

    def summary(self) -> dict[str, float]:
        """The contract's five headline figures."""
        return {"nll": self.nll, "ece": self.ece, "mce": self.mce, "brier": self.brier,
                "accuracy": self.accuracy}

    def to_dict(self, *, with_bins: bool = True) -> dict:
        out = asdict(self)
        if not with_bins:
            out.pop("bins")
        return out


def from_sums(tau: float, sums: CalibrationSums) -> CalibrationMetrics:
    """Turn one pass's sums into the reported figures."""
    n = sums.count
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
        rows.append(ReliabilityBin(
            lower=i / bins_total, upper=(i + 1) / bins_total, count=c,
            confidence=float(sums.bin_confidence[i] / c) if c else None,
            accuracy=float(sums.bin_correct[i] / c) if c else None))
    return CalibrationMetrics(
        tau=float(tau), count=n, nll=sums.nll / n, ece=ece, mce=mce, brier=sums.brier / n,
        accuracy=sums.correct / n, entropy=sums.entropy / n, mean_confidence=sums.confidence / n,
        bins=rows)


def evaluate(scan: Scan, tau: float = 1.0, *, bins: int = DEFAULT_BINS) -> CalibrationMetrics:
    """Calibration metrics of ``scan``'s samples at temperature ``tau`` (one pass)."""
    return evaluate_many(scan, [tau], bins=bins)[0]


def evaluate_many(scan: Scan, taus: Sequence[float], *, bins: int = DEFAULT_BINS) -> list[CalibrationMetrics]:
    """Calibration metrics at several temperatures in one pass over the data."""
    for tau in taus:
        if not tau > 0:
            raise ValueError(f"temperature must be > 0, got {tau}")
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    results = scan.calibration([1.0 / tau for tau in taus], bins)
    return [from_sums(tau, sums) for tau, (sums, _) in zip(taus, results, strict=True)]


def calibration_metrics(logits, labels, tau: float = 1.0, *, bins: int = DEFAULT_BINS,
                        device: str | torch.device = "auto", probs: bool = False) -> CalibrationMetrics:
    """Calibration metrics of raw logits (tensor or array) and labels at temperature ``tau``."""
    from ..core.data import as_logits_data

    return evaluate(Scan(as_logits_data(logits, labels, probs=probs), device=device), tau, bins=bins)
