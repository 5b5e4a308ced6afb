"""Scaled logits below the exponent floor are raised to it before ``exp``/``softmax`` (the CPU's slow path):
the figures must be those of the exact float64 computation, and the sums that hold a 1 must not move a bit."""

from __future__ import annotations

import numpy as np
import torch

import tempcal
from tempcal.core.kernels import exp_floor, row_cumulants, scaled_exp
from tempcal.core.parallel import Scratch
from tests.reference import ece_loop, nll_at, optimal_temperature


def wide_logits(rows: int = 3000, classes: int = 60, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits spread over hundreds of units: at T = 1 most entries of a row lie far below the floor."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, classes, generator=g) * 80
    y = torch.multinomial(torch.softmax(z.double() / 60, 1), 1, generator=g)[:, 0]
    return z, y


def float64_derivatives(z: np.ndarray, y: np.ndarray, beta: float) -> tuple[float, float, float]:
    """Mean NLL, d NLL / d beta and the mean variance of z under softmax(beta z), in float64 with log-sum-exp."""
    x = beta * (z - z.max(1, keepdims=True))
    log_s = np.log(np.exp(x).sum(1))
    p = np.exp(x - log_s[:, None])
    mean = (p * z).sum(1)
    var = (p * (z - mean[:, None]) ** 2).sum(1)
    nll = log_s - x[np.arange(len(y)), y]
    return nll.mean(), (mean - z[np.arange(len(y)), y]).mean(), var.mean()


def test_cumulants_match_float64_far_below_the_floor() -> None:
    z, y = wide_logits()
    for beta in (0.05, 1.0, 4.0):
        sums = row_cumulants(z, y, beta, Scratch(), impossible=False)
        count, nll, d1, d2 = sums[:4].tolist()
        ref = float64_derivatives(z.double().numpy(), y.numpy(), beta)
        got = (nll / count, d1 / count, d2 / count)
        assert np.allclose(got, ref, rtol=2e-5, atol=1e-9), (beta, got, ref)


def test_row_sums_keep_their_bits() -> None:
    z, _ = wide_logits()
    d = z - z.amax(1, keepdim=True)
    for beta in (0.5, 2.0, 10.0):
        assert (d * beta < exp_floor(torch.float32)).float().mean() > 0.3  # the floor is really reached
        plain = torch.exp(d * beta).sum(1)
        floored = scaled_exp(d, beta, Scratch(), neginf=False).sum(1)
        assert torch.equal(plain, floored)


def test_impossible_classes_stay_impossible() -> None:
    z, _ = wide_logits(rows=200)
    z[:, -1] = -torch.inf
    d = z - z.amax(1, keepdim=True)
    e = scaled_exp(d, 1.0, Scratch(), neginf=True)
    assert torch.all(e[:, -1] == 0)


def test_fit_and_metrics_on_wide_logits_against_scipy_and_a_loop() -> None:
    z, y = wide_logits(rows=4000, classes=40, seed=3)
    fit = tempcal.fit_temperature(z, y, device="cpu")
    reference = optimal_temperature(z.double().numpy(), y.numpy())
    assert abs(fit.temperature - reference) <= 1e-6 * reference
    for tau in (0.25, 1.0, fit.temperature):
        metrics = tempcal.evaluate(tempcal.Scan(tempcal.as_logits_data(z, y)), tau)
        assert abs(metrics.nll - nll_at(z.double().numpy(), y.numpy(), tau)) < 1e-5
        ece, _ = ece_loop(z.double().numpy(), y.numpy(), tau)
        assert abs(metrics.ece - ece) < 1e-6
