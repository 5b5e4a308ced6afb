"""Independent float64 references for per-fold and per-group fits and for figures at a temperature per row."""

from __future__ import annotations

import math

import numpy as np
import torch
from reference import two_class
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp


def _arrays(logits, labels) -> tuple[np.ndarray, np.ndarray]:
    return two_class(torch.as_tensor(logits).double().numpy()), torch.as_tensor(labels).long().numpy()


def penalised_temperature(logits, labels, lam: float = 0.0, centre: float = 1.0) -> float:
    """argmin over T of sum_i nll_i(T) + lam (ln T - ln centre)^2, by scipy's bounded optimiser over ln T."""
    z, y = _arrays(logits, labels)

    def objective(log_t: float) -> float:
        s = z / math.exp(log_t)
        with np.errstate(invalid="ignore"):
            total = float(np.sum(logsumexp(s, axis=1) - s[np.arange(len(y)), y])) if len(y) else 0.0
        return total + lam * (log_t - math.log(centre)) ** 2

    result = minimize_scalar(objective, bounds=(-12.0, 16.0), method="bounded",
                             options={"xatol": 1e-12, "maxiter": 5000})
    return 1.0 / _polished(z, y, lam, 1.0 / centre, math.exp(-result.x))


def _polished(z: np.ndarray, y: np.ndarray, lam: float, centre: float, beta: float) -> float:
    """Newton on the exact float64 slope in beta (sum of E_p[z] - z_y, plus the penalty's): finer than any search
    on NLL values, which float64 resolves only to about 1e-8 in T."""
    if not len(y) and lam == 0:
        return beta
    rows = np.arange(len(y))
    for _ in range(30):
        s = z * beta
        with np.errstate(invalid="ignore"):
            p = np.exp(s - logsumexp(s, axis=1, keepdims=True))
            finite = np.where(np.isfinite(z), z, 0.0)
        mean = (p * finite).sum(axis=1)
        u = math.log(beta / centre)
        slope = float(np.sum(mean - z[rows, y])) + 2 * lam * u / beta
        curvature = float(np.sum((p * finite ** 2).sum(axis=1) - mean ** 2)) + 2 * lam * (1 - u) / beta ** 2
        if not curvature > 0:
            return beta
        step = slope / curvature
        beta = beta - step if beta - step > 0 else beta / 2
        if abs(step) <= 1e-15 * beta:
            break
    return beta


def figures_per_row(logits, labels, temperatures, bins: int = 15) -> dict[str, float]:
    """The contract's NLL, ECE, MCE, Brier, accuracy and entropy with row i at ``temperatures[i]``, written from
    the definitions (ECE by a loop over the bins (i/B, (i+1)/B], the first also holding 0)."""
    z, y = _arrays(logits, labels)
    t = np.broadcast_to(np.asarray(temperatures, dtype=np.float64), (len(y),))
    s = z / t[:, None]
    log_p = s - logsumexp(s, axis=1, keepdims=True)
    p = np.exp(log_p)
    rows = np.arange(len(y))
    confidence = p.max(axis=1)
    raw = torch.as_tensor(logits).double().numpy()
    if raw.ndim == 1 or (raw.ndim == 2 and raw.shape[1] == 1):
        predicted = (raw.reshape(-1) >= 0).astype(np.int64)
    else:
        predicted = raw.argmax(axis=1)
    correct = predicted == y
    ece, mce = 0.0, 0.0
    for i in range(bins):
        lower, upper = i / bins, (i + 1) / bins
        members = [k for k in range(len(y)) if lower < confidence[k] <= upper or (i == 0 and confidence[k] == 0)]
        if members:
            gap = abs(float(np.mean(correct[members])) - float(np.mean(confidence[members])))
            ece += len(members) / len(y) * gap
            mce = max(mce, gap)
    onehot = np.eye(p.shape[1])[y]
    with np.errstate(invalid="ignore", divide="ignore"):
        entropy = np.where(p > 0, -p * log_p, 0.0).sum(axis=1)
    return {"nll": float(np.mean(-log_p[rows, y])), "ece": ece, "mce": mce,
            "brier": float(np.mean(((p - onehot) ** 2).sum(axis=1))), "accuracy": float(np.mean(correct)),
            "entropy": float(np.mean(entropy))}
