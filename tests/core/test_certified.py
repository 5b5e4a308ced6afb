"""The certified fit (tempcal.core.certified): its error bound is honest, its models of the slope are right, and
L-BFGS still finds T when the certificate is not reached."""

from __future__ import annotations

import math

import pytest
import torch
from fit_corpus import corpus, references

import tempcal
from tempcal.core import certified
from tempcal.core.certified import FitStart, certified_fit, certify, cubic_step, hermite_root_log, pade_log_step
from tempcal.core.kernels import NllDerivatives, row_cumulants, row_range

CASES = corpus()
BOUND_CASES = ("gauss-n2000-c100-s1.0-sig3.0", "lm-c1000", "neginf-0.5", "binary-n10000-s1.0-sig5.0",
               "mask-1e4", "huge-T-n500", "tiny-T-n1000-e1", "margin-n1000-c5-m5.0-noise0.9")
#: Relative distances from the optimum at which the certificate is tried.
OFFSETS = (0.5, 0.3, 0.1, 0.03, 1e-2, 1e-3, 1e-4, 1e-6, -1e-6, -1e-4, -1e-2, -0.1, -0.3)


class Exact:
    """Every pass over float64 rows in one chunk (a binary logit as ``[0, z]``), counting its calls."""

    def __init__(self, logits: torch.Tensor, labels: torch.Tensor):
        z = logits.double()
        self.z = torch.stack([torch.zeros_like(z), z], 1) if z.dim() == 1 else z
        self.y = labels
        self.calls: list[float] = []

    def __call__(self, beta: float) -> NllDerivatives:
        self.calls.append(beta)
        return NllDerivatives.from_sums(beta, row_cumulants(self.z, self.y, beta))

    def start(self, reference_beta: float) -> FitStart:
        return FitStart(len(self.y), self.z.shape[1], float(row_range(self.z, self.z.amax(1)).max()),
                        reference_beta=reference_beta)


@pytest.fixture(scope="module")
def refs():
    return references([*BOUND_CASES, "gauss-n2000-c100-s50.0-sig3.0", "margin-n5000-c100-m2.0-noise0.5"])


@pytest.mark.parametrize("name", BOUND_CASES)
def test_every_finite_bound_contains_the_true_error(name, refs):
    z, y = CASES[name]()
    data = Exact(z, y)
    start = data.start(1.0)
    star = 1.0 / refs[name]["polished"]
    certified_points = 0
    for offset in OFFSETS:
        estimate, bound = certify(data(star * (1 + offset)), start.span, start.num_classes)
        if math.isfinite(bound):
            certified_points += 1
            # float64 rounding of the reference root itself: a few ulps of beta
            assert abs(estimate - star) <= bound + 1e-13 * star, (offset, estimate, bound)
    assert certified_points >= 3  # near the optimum the bound is finite: the test exercises it


def test_the_bound_shrinks_towards_the_optimum_and_certifies_there(refs):
    name = "gauss-n2000-c100-s1.0-sig3.0"
    data = Exact(*CASES[name]())
    start = data.start(1.0)
    star = 1.0 / refs[name]["polished"]
    bounds = [certify(data(star * (1 + offset)), start.span, start.num_classes)[1] / star
              for offset in (1e-2, 1e-3, 1e-4)]
    assert bounds[0] > bounds[1] > bounds[2]
    assert bounds[2] <= certified.TOL


def test_a_fit_from_any_start_without_a_grid_is_certified_and_right(refs):
    name = "gauss-n2000-c100-s50.0-sig3.0"
    data = Exact(*CASES[name]())
    star = 1.0 / refs[name]["polished"]
    for reference in (1e-5, 1.0, 1e4):
        result = certified_fit(data.start(reference), data)
        assert result.converged and result.bound is None
        assert result.passes == 1 + len(data.calls) <= certified.MAX_PASSES
        assert abs(result.beta / star - 1) <= max(result.error_bound, 1e-12) + 1e-12
        assert abs(result.beta / star - 1) < 2e-7
        data.calls.clear()


def test_a_tolerance_beyond_reach_stops_at_the_pass_budget_and_says_so():
    data = Exact(*CASES["margin-n5000-c100-m2.0-noise0.5"]())
    result = certified_fit(data.start(1.0), data, tol=1e-30, max_passes=4)
    assert result.passes == 1 + len(data.calls) == 4
    assert not result.converged and result.warnings and "not certified" in result.warnings[0]


def test_an_exact_grid_can_settle_the_fit_without_a_pass(refs):
    name = "gauss-n2000-c100-s1.0-sig3.0"
    data = Exact(*CASES[name]())
    star = 1.0 / refs[name]["polished"]
    grid = tuple(data(star * f) for f in (0.9, 1 + 1e-9, 1.1))
    data.calls.clear()
    start = FitStart(len(data.y), data.z.shape[1], float(row_range(data.z, data.z.amax(1)).max()), grid, True)
    result = certified_fit(start, data)
    assert result.converged and result.passes == 1 and data.calls == []
    assert abs(result.beta / star - 1) < 1e-8


def test_the_slope_models_find_the_root_of_a_known_slope():
    # d1(beta) = log(beta / 2): the root is 2; its derivatives in beta are 1/b, -1/b^2, 2/b^3.
    def point(b: float) -> NllDerivatives:
        return NllDerivatives(b, 0.0, math.log(b / 2), 1 / b, -1 / b**2, 2 / b**3)

    # In log beta this slope is linear: Newton, Householder and Hermite are all exact.
    assert pade_log_step(point(1.7)) == pytest.approx(2.0, rel=1e-12)
    assert hermite_root_log(point(1.0), point(5.0)) == pytest.approx(2.0, rel=1e-10)
    # In beta the cubic Taylor model is close, not exact: from 1.9 its root lies within 1e-5 of 2.
    assert 1.9 + cubic_step(point(1.9)) == pytest.approx(2.0, abs=1e-5)
    assert hermite_root_log(point(3.0), point(5.0)) is None  # no sign change inside


def test_far_from_the_root_a_step_is_capped_at_the_largest_factor():
    far = NllDerivatives(1.0, 0.0, -50.0, 1e-3, 0.0, 0.0)  # Newton would go 5e4 further
    assert pade_log_step(far) == pytest.approx(certified.MAX_FACTOR)


def test_lbfgs_takes_over_when_the_certificate_is_never_reached(monkeypatch, refs):
    name = "margin-n5000-c100-m2.0-noise0.5"  # too large for the whole fit to happen within the scan
    z, y = CASES[name]()
    reference = refs[name]["scipy"]
    # A certificate that never certifies, and one pass after the scan: too few for two passes to bracket T.
    monkeypatch.setattr(certified, "certify", lambda s, span, num_classes: (s.beta, math.inf))
    monkeypatch.setattr(certified, "MAX_PASSES", 2)
    result = tempcal.fit_temperature(z, y, device="cpu")
    assert result.method == "l-bfgs" and result.converged
    assert result.error_bound is None
    assert abs(result.temperature / reference - 1) < 1e-6
    assert any("not certified" in w for w in result.warnings)
    assert result.passes > 2  # the fallback's reads are counted


def test_degenerate_data_go_to_the_documented_bounds_in_two_reads():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(300, 5, generator=g)
    lower = tempcal.fit_temperature(z, z.argmax(1), device="cpu")
    assert (lower.bound, lower.temperature, lower.passes, lower.method) == ("lower", certified.T_MIN, 2, "bound")
    upper = tempcal.fit_temperature(z, z.argmin(1), device="cpu")
    assert (upper.bound, upper.temperature, upper.passes, upper.method) == ("upper", certified.T_MAX, 2, "bound")
