"""The penalised certified search (a group drawn toward the global T) and the subset fits' edge cases."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import miscalibrated
from subsets_reference import penalised_temperature

from tempcal.core.certified import FitStart, Prior, certify
from tempcal.core.data import LogitsData
from tempcal.core.kernels import NllDerivatives, row_cumulants, row_range
from tempcal.core.scan import ALL_ROWS, Scan
from tempcal.subsets.cells import CellLayout
from tempcal.subsets.fits import fit_with_subsets


def _point(z, y, beta):
    return NllDerivatives.from_sums(beta, row_cumulants(z.double(), y, beta))


def test_prior_derivatives_match_finite_differences():
    prior = Prior(0.3, 0.7)
    base = NllDerivatives(1.3, 0.0, 0.0, 0.0, 0.0, 0.0)

    def value(beta):
        return prior.add(NllDerivatives(beta, 0.0, 0.0, 0.0, 0.0, 0.0)).nll

    h = 1e-4
    total = prior.add(base)
    numeric = [(value(1.3 + h) - value(1.3 - h)) / (2 * h),
               (value(1.3 + h) - 2 * value(1.3) + value(1.3 - h)) / h ** 2]
    assert total.d1 == pytest.approx(numeric[0], rel=1e-7)
    assert total.d2 == pytest.approx(numeric[1], rel=1e-5)
    d1 = [prior.add(NllDerivatives(b, 0.0, 0.0, 0.0, 0.0, 0.0)).d1 for b in (1.3 - h, 1.3 + h)]
    assert total.d2 == pytest.approx((d1[1] - d1[0]) / (2 * h), rel=1e-7)
    d3 = [prior.add(NllDerivatives(b, 0.0, 0.0, 0.0, 0.0, 0.0)).d3 for b in (1.3 - h, 1.3 + h)]
    assert total.d4 == pytest.approx((d3[1] - d3[0]) / (2 * h), rel=1e-6)


@pytest.mark.parametrize("lam", [0.5, 20.0, 500.0])
def test_every_finite_penalised_bound_contains_the_true_error(lam):
    z, y = miscalibrated(60, 5, 3.0, seed=2)
    centre_t = 1.2
    n = len(y)
    prior = Prior(lam / n, 1.0 / centre_t)
    star = 1.0 / penalised_temperature(z, y, lam, centre_t)
    span = float(row_range(z.double(), z.double().amax(1)).max())
    finite = 0
    for offset in (0.1, 0.03, 1e-2, 1e-3, 1e-5, -1e-5, -1e-3, -1e-2, -0.1):
        estimate, bound = certify(_point(z, y, star * (1 + offset)), span, 5, prior)
        if math.isfinite(bound):
            finite += 1
            assert abs(estimate - star) <= bound + 1e-9 * star, (offset, estimate, bound)
    assert finite >= 3


def test_a_group_without_rows_outside_a_fold_takes_that_folds_t():
    z, y = miscalibrated(90, 4, 2.0, seed=3)
    groups = torch.zeros(90, dtype=torch.int64)
    groups[:5] = 1
    folds = torch.arange(90) % 3
    folds[:5] = 0  # group 1 lies in fold 0 alone
    scan = Scan(LogitsData(z, y), device="cpu", fit_rows=ALL_ROWS)
    layout = CellLayout(groups * 3 + folds, 2, 3)
    fits = fit_with_subsets(scan, layout, groups=True, lam=0.0)
    assert fits.group_fold_temperatures[1][0] == pytest.approx(fits.fold_temperatures[0], rel=1e-12)
    outside = (folds != 1).numpy() & (groups == 1).numpy()
    assert fits.group_fold_temperatures[1][1] == pytest.approx(penalised_temperature(z[outside], y[outside]),
                                                                rel=1e-6)


def test_fit_start_unchanged_by_the_prior():
    start = FitStart(10, 3)
    assert start.rows is None and start == FitStart(10, 3)
