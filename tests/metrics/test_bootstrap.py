"""Bootstrap intervals (tempcal.metrics.bootstrap) against a naive resampling loop, and how they behave."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import miscalibrated, scan_of
from reference import reference_per_sample

import tempcal
from tempcal.errors import TempcalError
from tempcal.metrics.bootstrap import bootstrap_intervals, bootstrap_replicates, bootstrap_scan


def ece_loop(confidence, correct, bins: int) -> float:
    """The contract's ECE by a loop: bin i holds (i/B, (i+1)/B], the first also 0."""
    n = len(confidence)
    total = 0.0
    for i in range(bins):
        lower, upper = i / bins, (i + 1) / bins
        members = [j for j in range(n) if lower < confidence[j] <= upper or (i == 0 and confidence[j] == 0)]
        if members:
            total += len(members) / n * abs(np.mean(correct[members]) - np.mean(confidence[members]))
    return total


def test_vectorised_resampling_matches_a_naive_loop_with_the_same_draws():
    logits, labels = miscalibrated(240, 5, 2.0, seed=2, dtype=torch.float64)
    confidence, correct, nll = reference_per_sample(logits, labels, 1.3)
    replicates = bootstrap_replicates(confidence, correct, nll, 20, seed=11, bins=10)
    rng = np.random.default_rng(11)
    naive_ece, naive_nll = [], []
    for _ in range(20):
        idx = rng.integers(0, 240, size=240)  # one materialised resample
        naive_ece.append(ece_loop(confidence[idx], correct[idx].astype(float), 10))
        naive_nll.append(float(np.mean(nll[idx])))
    np.testing.assert_allclose(replicates["ece"], naive_ece, rtol=0, atol=1e-12)
    np.testing.assert_allclose(replicates["nll"], naive_nll, rtol=1e-12)
    intervals = bootstrap_intervals(confidence, correct, nll, 20, seed=11, bins=10, level=0.9)
    assert intervals["ece"] == pytest.approx(tuple(np.percentile(naive_ece, [5, 95])), abs=1e-12)
    assert intervals["nll"] == pytest.approx(tuple(np.percentile(naive_nll, [5, 95])), rel=1e-12)


def test_batching_does_not_change_the_draws():
    confidence, correct, nll = reference_per_sample(*miscalibrated(500, 4, 2.0, seed=3, dtype=torch.float64), 1.0)
    whole = bootstrap_replicates(confidence, correct, nll, 37, seed=4, batch=100)
    pieces = bootstrap_replicates(confidence, correct, nll, 37, seed=4, batch=5)
    for name in whole:  # the same draws; only the rounding of the matrix products may differ
        np.testing.assert_allclose(whole[name], pieces[name], rtol=1e-13, atol=1e-16)


def test_seeded():
    logits, labels = miscalibrated(2000, 10, 2.0, seed=5, dtype=torch.float64)
    a = bootstrap_scan(scan_of(logits, labels), 1.0, 200, seed=7)
    b = bootstrap_scan(scan_of(logits, labels), 1.0, 200, seed=7)
    c = bootstrap_scan(scan_of(logits, labels), 1.0, 200, seed=8)
    assert a == b
    assert a != c


def test_interval_holds_the_point_estimate():
    logits, labels = miscalibrated(5000, 10, 2.5, seed=6, dtype=torch.float32)
    scan = scan_of(logits, labels)
    for tau in (1.0, 2.5):
        point = tempcal.evaluate(scan, tau)
        intervals = bootstrap_scan(scan, tau, 300, seed=0)
        assert intervals["ece"][0] < point.ece < intervals["ece"][1]
        assert intervals["nll"][0] < point.nll < intervals["nll"][1]


def test_width_shrinks_like_one_over_root_n():
    logits, labels = miscalibrated(16000, 10, 2.5, seed=7, dtype=torch.float64)
    confidence, correct, nll = reference_per_sample(logits, labels, 1.0)
    small = bootstrap_intervals(confidence[:1000], correct[:1000], nll[:1000], 400, seed=1)
    large = bootstrap_intervals(confidence, correct, nll, 400, seed=1)
    for name in ("ece", "nll"):
        ratio = (small[name][1] - small[name][0]) / (large[name][1] - large[name][0])
        assert 2.5 < ratio < 6.5  # sqrt(16) = 4


def test_nll_interval_covers_the_population_mean():
    """95% intervals for the mean NLL cover the population's mean in about 95% of independent samples."""
    g = torch.Generator().manual_seed(8)
    z = torch.randn(200_000, 5, dtype=torch.float64, generator=g) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
    confidence, correct, nll = reference_per_sample(z * 1.5, y, 1.0)
    truth = float(nll.mean())
    covered = 0
    for trial in range(100):
        rows = slice(trial * 400, (trial + 1) * 400)
        low, high = bootstrap_intervals(confidence[rows], correct[rows], nll[rows], 300, seed=trial)["nll"]
        covered += low <= truth <= high
    assert 85 <= covered <= 100


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n_resamples": 0}, "bootstrap resamples must be a whole number >= 1, got 0"),
    ({"level": 1.0}, "confidence level must be strictly between 0 and 1"),
    ({"bins": 0}, "bins must be a whole number >= 1"),
    ({"nll_per_sample": np.zeros(3)}, "differ in length: 4 confidences, 4 correctness flags, 3 NLL values"),
    ({"nll_per_sample": np.array([0.1, math.inf, 0.2, 0.3])}, "1 non-finite per-sample NLL values; first at index 1"),
    ({"confidence": np.array([0.5, 0.6, 1.5, 0.7])}, "1 confidences outside"),
])
def test_bad_arguments_are_one_line_errors(kwargs, message):
    args = {"confidence": np.array([0.5, 0.6, 0.9, 0.7]), "correct": np.array([1, 0, 1, 1]),
            "nll_per_sample": np.array([0.7, 0.9, 0.1, 0.4]), "n_resamples": 10, "seed": 0, "bins": 15, **kwargs}
    with pytest.raises(TempcalError, match=message) as info:
        bootstrap_intervals(**args)
    assert "\n" not in str(info.value)
