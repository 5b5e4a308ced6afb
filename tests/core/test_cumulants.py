"""The per-chunk kernels (tempcal.core.kernels) against the definitions written out in float64 numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tempcal.core.kernels import (
    FIELDS,
    NllDerivatives,
    finished_sums,
    raw_sums,
    row_cumulants,
    row_moments,
    row_range,
    row_terms,
)
from tempcal.core.scan import Scratch


def reference_sums(z: torch.Tensor, y: torch.Tensor, beta: float) -> np.ndarray:
    """Sums of ``[1, NLL, d1..d4, mu2^2, sqrt(mu2^3 mu4)]`` straight from the definitions (no shared code)."""
    z = z.double().numpy()
    finite = np.isfinite(z)
    zz = np.where(finite, z, 0.0)
    x = np.where(finite, beta * zz, -np.inf)
    top = x.max(1, keepdims=True)
    e = np.exp(x - top)
    lse = top[:, 0] + np.log(e.sum(1))
    p = e / e.sum(1, keepdims=True)
    mean = (p * zz).sum(1)
    u = zz - mean[:, None]
    mu2, mu3, mu4 = ((p * u**k).sum(1) for k in (2, 3, 4))
    true = zz[np.arange(len(y)), y.numpy()]
    rows = [np.ones_like(mean), lse - beta * true, mean - true, mu2, mu3, mu4 - 3 * mu2**2, mu2**2,
            np.sqrt(mu2**3 * mu4)]
    return np.array([r.sum() for r in rows])


def finite_differences(z: torch.Tensor, y: torch.Tensor, beta: float, h: float = 1e-2) -> list[float]:
    """d1..d4 of the float64 NLL sum by central differences of the NLL itself (an independent check of the
    cumulant identities)."""

    def nll(b: float) -> float:
        return float(reference_sums(z, y, b)[1])

    f = [nll(beta + k * h) for k in (-3, -2, -1, 0, 1, 2, 3)]
    d1 = (f[1] - 8 * f[2] + 8 * f[4] - f[5]) / (12 * h)
    d2 = (-f[1] + 16 * f[2] - 30 * f[3] + 16 * f[4] - f[5]) / (12 * h * h)
    d3 = (f[0] - 8 * f[1] + 13 * f[2] - 13 * f[4] + 8 * f[5] - f[6]) / (8 * h**3)
    d4 = (-f[0] + 12 * f[1] - 39 * f[2] + 56 * f[3] - 39 * f[4] + 12 * f[5] - f[6]) / (6 * h**4)
    return [d1, d2, d3, d4]


def data(n=300, c=40, scale=3.0, neginf=0.0, seed=0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g, dtype=torch.float64) * scale + offset
    y = torch.randint(0, c, (n,), generator=g)
    if neginf:
        mask = torch.rand(n, c, generator=g) < neginf
        mask[torch.arange(n), y] = False
        z = z.masked_fill(mask, -math.inf)
    return z, y


def relative_error(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = np.maximum(np.abs(b), 1e-12 * np.abs(b).max())
    return float(np.max(np.abs(a - b) / scale))


@pytest.mark.parametrize("beta", [1e-3, 0.3, 1.0, 7.0])
@pytest.mark.parametrize("neginf", [0.0, 0.3])
def test_a_chunk_matches_the_definitions_in_float64_and_float32(beta, neginf):
    z, y = data(neginf=neginf)
    assert relative_error(row_cumulants(z, y, beta).numpy(), reference_sums(z, y, beta)) < 1e-11
    z32 = z.float()
    assert relative_error(row_cumulants(z32, y, beta).numpy(), reference_sums(z32, y, beta)) < 2e-4


def test_the_cumulants_are_the_derivatives_of_the_nll():
    z, y = data(n=200, c=15, scale=1.0, seed=2)
    sums = row_cumulants(z, y, 0.8)
    for k, numeric in enumerate(finite_differences(z, y, 0.8), start=2):
        assert sums[k].item() == pytest.approx(numeric, rel=1e-4, abs=1e-6), FIELDS[k]


def test_large_row_offsets_keep_float32_exact_near_the_top():
    z, y = data(n=200, c=30, scale=2.0, seed=3, offset=0.0)
    shifted = z + 1000 * torch.randn(200, 1, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    z32 = shifted.float()  # the offsets are exact in float32's view of the rows: compare against that
    assert relative_error(row_cumulants(z32, y, 1.2).numpy(), reference_sums(z32, y, 1.2)) < 2e-4


def test_beta_zero_is_the_uniform_distribution_over_finite_entries():
    z, y = data(neginf=0.3)
    finite = torch.isfinite(z)
    zz = torch.where(finite, z, torch.zeros((), dtype=torch.float64))
    count = finite.sum(1)
    mean = zz.sum(1) / count
    var = torch.where(finite, (zz - mean[:, None]) ** 2, torch.zeros((), dtype=torch.float64)).sum(1) / count
    sums = row_cumulants(z, y, 0.0)
    assert sums[0].item() == len(y)
    assert sums[1].item() == pytest.approx(torch.log(count.double()).sum().item(), rel=1e-12)
    assert sums[2].item() == pytest.approx((mean - z.gather(1, y[:, None])[:, 0]).sum().item(), rel=1e-12)
    assert sums[3].item() == pytest.approx(var.sum().item(), rel=1e-12)


def test_a_binary_logit_as_zero_z_matches_the_definitions():
    g = torch.Generator().manual_seed(3)
    z = torch.randn(500, generator=g, dtype=torch.float64) * 4
    y = (torch.rand(500, generator=g) < 0.5).long()
    two = torch.stack([torch.zeros_like(z), z], 1)
    assert relative_error(row_cumulants(two, y, 0.7).numpy(), reference_sums(two, y, 0.7)) < 1e-11


def test_per_row_betas_equal_separate_calls():
    z, y = data(n=50, c=12)
    betas = [0.1, 0.5, 2.0]
    n = z.shape[0]
    per_row = torch.tensor(betas, dtype=torch.float64).repeat_interleave(n)
    moments = row_moments(z.repeat(3, 1), per_row, y.repeat(3))
    together = row_terms(moments, z.gather(1, y[:, None])[:, 0].repeat(3), per_row).view(len(FIELDS), 3, n).sum(2)
    for k, beta in enumerate(betas):
        assert torch.allclose(together[:, k], row_cumulants(z, y, beta), rtol=1e-12, atol=1e-300), beta


def test_row_terms_sum_to_the_chunk_sums():
    z, y = data(n=80, c=9, neginf=0.2, seed=5)
    moments = row_moments(z, 1.7, y)
    z_true = z.gather(1, y[:, None])[:, 0]
    assert torch.allclose(row_terms(moments, z_true, 1.7).sum(1), finished_sums(raw_sums(moments, z_true), 80, 1.7),
                          rtol=1e-12)


def test_known_row_maxima_reused_buffers_and_the_impossible_flag_change_nothing():
    z, y = data(neginf=0.2, seed=6)
    plain = row_cumulants(z, y, 0.9)
    scratch = Scratch()
    for _ in range(2):  # the second call reuses the buffers the first one grew
        again = row_cumulants(z, y, 0.9, scratch, top=z.amax(1), impossible=True)
        assert torch.allclose(again, plain, rtol=1e-13, atol=0)
    # Without -inf in the chunk, saying so (impossible=False) skips the check and gives the same sums.
    dense, labels = data(seed=7)
    assert torch.allclose(row_cumulants(dense, labels, 0.9, impossible=False), row_cumulants(dense, labels, 0.9),
                          rtol=1e-14, atol=0)


def test_huge_mask_values_stay_finite_and_match_minus_infinity():
    z, y = data(neginf=0.4)
    masked = z.float().nan_to_num(neginf=-1e30)
    a = row_cumulants(masked, y, 0.8)
    assert torch.isfinite(a).all()
    assert torch.allclose(a, row_cumulants(z.float(), y, 0.8), rtol=1e-5, atol=1e-6)


def test_a_true_class_whose_probability_underflows_keeps_an_exact_nll():
    z = torch.tensor([[0.0, -150.0, 1.0], [2.0, 0.5, -300.0], [0.3, 0.2, 0.1]])
    y = torch.tensor([1, 2, 0])
    for beta in (1.0, 0.4):
        sums = row_cumulants(z, y, beta)
        assert torch.isfinite(sums).all()
        assert relative_error(sums.numpy(), reference_sums(z, y, beta)) < 1e-5, beta


def test_row_range_ignores_impossible_entries():
    z = torch.tensor([[1.0, -math.inf, -2.0], [5.0, 4.0, 3.0], [0.0, -math.inf, -math.inf]])
    assert row_range(z, z.amax(1)).tolist() == [3.0, 2.0, 0.0]


def test_derivatives_are_means_of_the_chunk_sums():
    s = NllDerivatives.from_sums(0.5, torch.tensor([4.0, 8.0, -4.0, 2.0, 0.4, 0.8, 1.2, 1.6], dtype=torch.float64))
    assert (s.beta, s.nll, s.d1, s.d2, s.d3, s.d4, s.q, s.q5) == (0.5, 2.0, -1.0, 0.5, 0.1, 0.2, 0.3, 0.4)


@pytest.mark.parametrize("classes", [2, 10, 100, 1000])
def test_row_moments_probabilities_match_a_float64_softmax(classes):
    """The CPU's exp-sum-divide softmax of ``beta (z - max z)`` (short rows, an impossible class, per-row betas):
    each row's moments within float32 rounding of a float64 ``torch.softmax`` reference."""
    g = torch.Generator().manual_seed(classes)
    z = 3 * torch.randn(257, classes, generator=g)
    z[5, 1] = -math.inf
    y = torch.randint(0, classes, (257,), generator=g)
    y[5] = 0 if z[5, 0] > -math.inf else 1
    beta = torch.rand(257, generator=g, dtype=torch.float64) * 4 + 0.05
    moments = row_moments(z, beta, y, impossible=True)
    p = torch.softmax(beta[:, None] * z.double(), 1)
    finite = torch.where(torch.isfinite(z), z.double(), torch.zeros((), dtype=torch.float64))
    mean = (p * finite).sum(1)
    mu2 = (p * (finite - mean[:, None]) ** 2).sum(1)
    assert torch.allclose(moments.mean + moments.top.double(), mean, rtol=1e-5, atol=1e-4)
    assert torch.allclose(moments.mu2.double(), mu2, rtol=1e-4, atol=1e-5)
    log_mass = torch.logsumexp(beta[:, None] * (z.double() - z.double().amax(1, keepdim=True)), 1)
    assert torch.allclose(moments.log_mass.double(), log_mass, rtol=1e-5, atol=1e-5)
