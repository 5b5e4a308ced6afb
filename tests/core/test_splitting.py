"""stratified_split (tempcal.core.splitting): sizes, stratification, seeding and bad fractions."""

from __future__ import annotations

import numpy as np
import pytest

import tempcal


class TestSplit:
    def test_sizes_and_stratification(self):
        labels = np.repeat(np.arange(5), [100, 50, 7, 1, 2])
        fit, held = tempcal.stratified_split(labels, 0.3, seed=1)
        assert len(fit) == round(0.3 * len(labels))
        assert len(np.intersect1d(fit, held)) == 0 and len(fit) + len(held) == len(labels)
        for c, n in zip(range(5), [100, 50, 7, 1, 2], strict=True):
            assert abs((labels[fit] == c).sum() - 0.3 * n) < 1

    def test_seeded_and_order_free(self):
        labels = np.random.default_rng(0).integers(0, 10, 1000)
        a = tempcal.stratified_split(labels, 0.5, seed=7)
        b = tempcal.stratified_split(labels, 0.5, seed=7)
        c = tempcal.stratified_split(labels, 0.5, seed=8)
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
        assert not np.array_equal(a[0], c[0])

    @pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5, float("nan")])
    def test_bad_fraction(self, fraction):
        with pytest.raises(tempcal.TempcalError):
            tempcal.stratified_split(np.zeros(10), fraction)
