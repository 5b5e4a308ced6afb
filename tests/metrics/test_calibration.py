"""Calibration figures (tempcal.metrics.calibration) against torchmetrics, a numpy loop, torch's cross-entropy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import logits_and_labels, miscalibrated, miscalibrated_binary
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import brier, ece_loop, entropy, probabilities

import tempcal


@pytest.mark.parametrize("tau", [0.5, 1.0, 2.7])
def test_figures_match_independent_implementations(tau):
    logits, labels = miscalibrated(3000, 12, 2.2, seed=3)
    m = tempcal.calibration_metrics(logits, labels, tau, device="cpu")
    z = logits.double()
    assert m.nll == pytest.approx(float(F.cross_entropy(z / tau, labels)), rel=1e-6)
    ece, mce = ece_loop(logits, labels, tau)
    assert m.ece == pytest.approx(ece, abs=1e-6)
    assert m.mce == pytest.approx(mce, abs=1e-6)
    assert m.brier == pytest.approx(brier(logits, labels, tau), rel=1e-6)
    assert m.entropy == pytest.approx(entropy(logits, tau), rel=1e-6)
    assert m.accuracy == pytest.approx(float((z.argmax(1) == labels).double().mean()), abs=0)
    assert m.mean_confidence == pytest.approx(float(probabilities(logits, tau).max(1).mean()), rel=1e-6)
    assert sum(b.count for b in m.bins) == len(labels)


def test_ece_matches_torchmetrics():
    """torchmetrics bins with right-closed edges [i/B, (i+1)/B) (torch.bucketize(right=True)) and puts a
    confidence of exactly 1.0 in the last bin; the contract's bins are (i/B, (i+1)/B]. The two agree unless a
    confidence lies exactly on an interior edge, which continuous random logits never do."""
    from torchmetrics.functional.classification import multiclass_calibration_error

    logits, labels = miscalibrated(4000, 10, 2.0, seed=5, dtype=torch.float64)
    for tau in (1.0, 1.9):
        m = tempcal.calibration_metrics(logits, labels, tau, device="cpu", bins=15)
        probs = torch.softmax(logits / tau, 1)
        expected = multiclass_calibration_error(probs, labels, num_classes=10, n_bins=15, norm="l1")
        expected_max = multiclass_calibration_error(probs, labels, num_classes=10, n_bins=15, norm="max")
        assert m.ece == pytest.approx(float(expected), abs=1e-6)
        assert m.mce == pytest.approx(float(expected_max), abs=1e-6)


def test_confidence_on_a_bin_edge_goes_to_the_lower_bin():
    # Two classes with p = (0.6, 0.4) ... confidence 0.6 lies on the edge 3/5 of 5 bins: bin (0.4, 0.6].
    p = 0.6
    logits = torch.tensor([[math.log(p), math.log(1 - p)]] * 4, dtype=torch.float64)
    labels = torch.tensor([0, 0, 0, 1])
    m = tempcal.calibration_metrics(logits, labels, 1.0, device="cpu", bins=5)
    counts = [b.count for b in m.bins]
    assert counts == [0, 0, 4, 0, 0]
    assert m.bins[2].confidence == pytest.approx(0.6)
    assert m.bins[2].accuracy == pytest.approx(0.75)
    assert m.bins[0].confidence is None and m.bins[0].accuracy is None


def test_binary_single_logit_is_two_classes():
    z, y = miscalibrated_binary(2000, 2.0, seed=2)
    m = tempcal.calibration_metrics(z, y, 1.3, device="cpu")
    p = torch.sigmoid(z.double() / 1.3)
    assert m.brier == pytest.approx(float((2 * (p - y) ** 2).mean()), rel=1e-6)
    assert m.nll == pytest.approx(float(F.binary_cross_entropy(p, y.double())), rel=1e-6)
    assert m.accuracy == pytest.approx(float(((p >= 0.5).long() == y).double().mean()))
    ece, _ = ece_loop(z, y, 1.3)
    assert m.ece == pytest.approx(ece, abs=1e-6)


def test_binary_zero_logit_predicts_class_one():
    m = tempcal.calibration_metrics(torch.zeros(4), torch.tensor([1, 1, 1, 0]), device="cpu")
    assert m.accuracy == 0.75


def test_neginf_logits_mean_probability_zero():
    logits = torch.tensor([[2.0, -math.inf, 0.0], [-math.inf, 1.0, 1.0]])
    labels = torch.tensor([0, 2])
    m = tempcal.calibration_metrics(logits, labels, device="cpu")
    finite = torch.tensor([[2.0, -1e30, 0.0], [-1e30, 1.0, 1.0]], dtype=torch.float64)
    assert m.nll == pytest.approx(float(F.cross_entropy(finite, labels)), rel=1e-6)
    assert m.entropy == pytest.approx(entropy(finite.numpy()), rel=1e-6)
    assert m.brier == pytest.approx(brier(finite.numpy(), labels.numpy()), rel=1e-6)


def test_half_precision_input_is_computed_in_float32():
    logits, labels = miscalibrated(2000, 10, 2.0, seed=4, dtype=torch.float16)
    m = tempcal.calibration_metrics(logits, labels, 1.5, device="cpu")
    assert m.nll == pytest.approx(float(F.cross_entropy(logits.double() / 1.5, labels)), rel=1e-5)


@settings(max_examples=60, deadline=None)
@given(logits_and_labels(), st.floats(0.05, 20), st.integers(1, 30))
def test_ece_properties(data, tau, bins):
    logits, labels = data
    m = tempcal.calibration_metrics(logits, labels, tau, device="cpu", bins=bins)
    assert 0 <= m.ece <= 1 + 1e-12
    assert m.mce >= m.ece - 1e-12
    assert 0 <= m.brier <= 2 + 1e-12
    assert m.nll >= 0 and m.entropy >= 0
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    shuffled = tempcal.calibration_metrics(logits[perm], labels[perm], tau, device="cpu", bins=bins)
    for key in ("nll", "ece", "mce", "brier", "accuracy", "entropy"):
        assert getattr(shuffled, key) == pytest.approx(getattr(m, key), rel=1e-9, abs=1e-12)


def test_numpy_arrays_are_accepted():
    logits, labels = miscalibrated(500, 4, 1.5, seed=1)
    a = tempcal.calibration_metrics(logits.numpy(), labels.numpy(), device="cpu")
    b = tempcal.calibration_metrics(logits, labels, device="cpu")
    assert a == b
    assert np.isfinite(a.nll)


# -- Wilson intervals on the reliability bins ----------------------------------------------------------------


def wilson_reference(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The closed form, with z from scipy (Wilson 1927; Agresti & Coull 1998, eq. 2)."""
    from scipy.stats import norm

    z = norm.ppf(0.5 + level / 2)
    p = k / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


@pytest.mark.parametrize(("k", "n"), [(0, 1), (1, 1), (0, 3), (1, 3), (2, 3), (3, 3), (7, 10), (0, 50), (50, 50),
                                      (123, 1000), (2999, 3000)])
def test_wilson_interval_matches_the_closed_form_and_its_defining_equation(k, n):
    from scipy.stats import norm

    from tempcal.metrics.calibration import wilson_interval

    low, high = wilson_interval(k, n)
    ref_low, ref_high = wilson_reference(k, n)
    assert low == pytest.approx(max(ref_low, 0.0), abs=1e-12) and high == pytest.approx(min(ref_high, 1.0), abs=1e-12)
    assert 0 <= low <= k / n <= high <= 1
    # The score interval is every q with |p - q| <= z sqrt(q (1 - q) / n): its ends solve the equality, i.e. the
    # roots of (1 + z^2/n) q^2 - (2p + z^2/n) q + p^2 = 0, found here by numpy.
    z2n = norm.ppf(0.975) ** 2 / n
    roots = sorted(np.roots([1 + z2n, -(2 * k / n + z2n), (k / n) ** 2]).real)
    assert low == pytest.approx(roots[0], abs=1e-9) and high == pytest.approx(roots[1], abs=1e-9)
    if k == 0:
        assert low == 0.0
    if k == n:
        assert high == 1.0


def test_a_wilson_interval_narrows_with_the_sample_and_widens_with_the_level():
    from tempcal.metrics.calibration import wilson_interval

    widths = [np.subtract(*reversed(wilson_interval(n * 0.8, n))) for n in (5, 50, 500, 5000)]
    assert widths == sorted(widths, reverse=True) and widths[0] > 0.3 > 0.03 > widths[-1]
    assert np.subtract(*reversed(wilson_interval(8, 10, 0.99))) > np.subtract(*reversed(wilson_interval(8, 10)))
    with pytest.raises(ValueError):
        wilson_interval(1, 0)
    with pytest.raises(ValueError):
        wilson_interval(4, 3)


def test_every_bin_carries_the_wilson_interval_of_its_accuracy():
    """Per-bin counts recounted from the contract's bins by a plain loop; empty bins have no interval."""
    from reference import predictions

    logits, labels = miscalibrated(700, 6, 2.5, seed=9)
    m = tempcal.calibration_metrics(logits, labels, 1.0, device="cpu", bins=20)
    confidence = probabilities(logits).max(1)
    correct = predictions(logits) == labels.numpy()
    assert any(b.count == 0 for b in m.bins) and any(0 < b.count < 5 for b in m.bins)  # both cases are exercised
    for i, b in enumerate(m.bins):
        inside = (confidence > i / 20) & (confidence <= (i + 1) / 20) | ((i == 0) & (confidence == 0))
        assert b.count == int(inside.sum())
        if b.count == 0:
            assert b.accuracy is None and b.accuracy_low is None and b.accuracy_high is None
            continue
        low, high = wilson_reference(int(correct[inside].sum()), b.count)
        assert b.accuracy_low == pytest.approx(max(low, 0.0), abs=1e-12)
        assert b.accuracy_high == pytest.approx(min(high, 1.0), abs=1e-12)
        assert b.accuracy_low <= b.accuracy <= b.accuracy_high
