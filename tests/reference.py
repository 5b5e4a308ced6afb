"""Independent reference implementations the tests compare tempcal against (float64, plain numpy/scipy)."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp


def two_class(z: np.ndarray) -> np.ndarray:
    """A single binary logit ([N] or [N, 1]) as the two-class logits [0, z]."""
    if z.ndim == 2 and z.shape[1] == 1:
        z = z[:, 0]
    return np.stack([np.zeros_like(z), z], axis=1) if z.ndim == 1 else z


def nll_at(z: np.ndarray, y: np.ndarray, temperature: float) -> float:
    z = two_class(np.asarray(z, dtype=np.float64))
    scaled = z / temperature
    with np.errstate(invalid="ignore"):
        true = scaled[np.arange(len(y)), y]
    return float(np.mean(logsumexp(scaled, axis=1) - true))


def optimal_temperature(logits, labels) -> float:
    """T* by scipy's bounded scalar optimiser over log T, in float64."""
    z = torch.as_tensor(logits).double().numpy()
    y = torch.as_tensor(labels).long().numpy()

    def objective(log_t: float) -> float:
        return nll_at(z, y, math.exp(log_t))

    result = minimize_scalar(objective, bounds=(-12.0, 16.0), method="bounded",
                             options={"xatol": 1e-12, "maxiter": 2000})
    return math.exp(result.x)


def probabilities(logits, temperature: float = 1.0) -> np.ndarray:
    z = two_class(torch.as_tensor(logits).double().numpy()) / temperature
    return np.exp(z - logsumexp(z, axis=1, keepdims=True))


def predictions(logits) -> np.ndarray:
    """Arg-max (first on ties); a single binary logit predicts 1 when sigmoid >= 0.5."""
    z = torch.as_tensor(logits).double().numpy()
    if z.ndim == 2 and z.shape[1] == 1:
        z = z[:, 0]
    return (z >= 0).astype(np.int64) if z.ndim == 1 else np.argmax(z, axis=1)


def ece_loop(logits, labels, temperature: float = 1.0, bins: int = 15) -> tuple[float, float]:
    """ECE and MCE by a plain loop over the contract's bins (i/B, (i+1)/B], the first also holding 0."""
    p = probabilities(logits, temperature)
    confidence = p.max(axis=1)
    correct = predictions(logits) == np.asarray(labels)
    n = len(confidence)
    ece, mce = 0.0, 0.0
    for i in range(bins):
        lower, upper = i / bins, (i + 1) / bins
        members = [k for k in range(n) if (lower < confidence[k] <= upper) or (i == 0 and confidence[k] == 0)]
        if not members:
            continue
        gap = abs(np.mean(correct[members]) - np.mean(confidence[members]))
        ece += len(members) / n * gap
        mce = max(mce, gap)
    return ece, mce


def brier(logits, labels, temperature: float = 1.0) -> float:
    p = probabilities(logits, temperature)
    onehot = np.eye(p.shape[1])[np.asarray(labels)]
    return float(np.mean(np.sum((p - onehot) ** 2, axis=1)))


def entropy(logits, temperature: float = 1.0) -> float:
    p = probabilities(logits, temperature)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    return float(np.mean(terms.sum(axis=1)))


def miscalibrated(n: int, c: int, scale: float, *, seed: int = 0, dtype=torch.float32):
    """Labels drawn from softmax(z); the logits handed out are scale * z, so T* is near ``scale``."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, dtype=torch.float64, generator=g) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
    return (z * scale).to(dtype), y


def miscalibrated_binary(n: int, scale: float, *, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, dtype=torch.float64, generator=g) * 2
    y = torch.bernoulli(torch.sigmoid(z), generator=g).long()
    return (z * scale).float(), y
