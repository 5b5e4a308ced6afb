"""The RMS calibration error (``rms_ce``) against a plain numpy loop written from its definition.

Definition (docs/metrics.md): the ECE's bins, (i/B, (i+1)/B] with 0 in the first;
``rms_ce = sqrt(sum over bins of (n_b / N) (accuracy_b - mean confidence_b)^2)``, every bin counted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import miscalibrated, miscalibrated_binary
from reference import predictions, probabilities

import tempcal


def rms_loop(logits, labels, temperature: float = 1.0, bins: int = 15) -> float:
    """Each sample into its bin by a loop, then the square root of the count-weighted mean squared gap."""
    confidence = probabilities(logits, temperature).max(axis=1)
    correct = predictions(logits) == np.asarray(labels)
    counts, conf_sums, correct_sums = [0] * bins, [0.0] * bins, [0.0] * bins
    for c, ok in zip(confidence, correct, strict=True):
        b = 0
        while b < bins - 1 and not (c <= (b + 1) / bins):  # (b/B, (b+1)/B]; 0 falls in bin 0
            b += 1
        counts[b] += 1
        conf_sums[b] += float(c)
        correct_sums[b] += float(ok)
    total = 0.0
    for b in range(bins):
        if counts[b]:
            gap = correct_sums[b] / counts[b] - conf_sums[b] / counts[b]
            total += counts[b] / len(confidence) * gap * gap
    return math.sqrt(total)


def hle_calib_err(confidence: np.ndarray, correct: np.ndarray, beta: int = 100) -> float:
    """The HLE script's ``calib_err(p='2')``: equal-mass bins of ``beta`` sorted samples, its last bin skipped."""
    order = np.argsort(confidence)
    confidence, correct = confidence[order], correct[order]
    edges = [[i * beta, (i + 1) * beta] for i in range(len(confidence) // beta)]
    edges[-1] = [edges[-1][0], len(confidence)]
    total = 0.0
    for lo, hi in edges[:-1]:
        total += (hi - lo) / len(confidence) * (np.mean(confidence[lo:hi]) - np.mean(correct[lo:hi])) ** 2
    return math.sqrt(total)


@pytest.mark.parametrize("tau", [0.5, 1.0, 2.7])
@pytest.mark.parametrize("bins", [1, 10, 15])
def test_rms_ce_matches_a_plain_loop_multiclass(tau, bins):
    logits, labels = miscalibrated(2000, 7, 2.2, seed=5)
    m = tempcal.calibration_metrics(logits, labels, tau, bins=bins, device="cpu")
    assert m.rms_ce == pytest.approx(rms_loop(logits, labels, tau, bins), abs=1e-9)
    assert m.ece <= m.rms_ce + 1e-12  # Jensen: a weighted mean of gaps is at most their weighted RMS
    assert m.rms_ce <= m.mce + 1e-12


@pytest.mark.parametrize("tau", [0.7, 1.0, 3.0])
def test_rms_ce_matches_a_plain_loop_binary(tau):
    logits, labels = miscalibrated_binary(1500, 2.5, seed=2)
    m = tempcal.calibration_metrics(logits, labels, tau, device="cpu")
    assert m.rms_ce == pytest.approx(rms_loop(logits, labels, tau), abs=1e-9)


def test_one_bin_is_the_gap_of_the_means():
    """With one bin the RMS error is |accuracy - mean confidence|, as is the ECE."""
    logits, labels = miscalibrated(800, 4, 3.0, seed=9)
    m = tempcal.calibration_metrics(logits, labels, bins=1, device="cpu")
    assert m.rms_ce == pytest.approx(abs(m.accuracy - m.mean_confidence), abs=1e-12)
    assert m.rms_ce == pytest.approx(m.ece, abs=1e-12)


def test_known_value_by_hand():
    """Binary logits whose top-label confidence is 0.7 (right 5 of 10) and 0.9 (right 9 of 10): two bins of half
    the rows, gaps 0.2 and 0, so RMS = sqrt(0.5 * 0.2^2) and ECE = 0.5 * 0.2."""
    z = torch.tensor([math.log(0.7 / 0.3)] * 10 + [math.log(0.9 / 0.1)] * 10, dtype=torch.float64)
    y = torch.tensor([1] * 5 + [0] * 5 + [1] * 9 + [0], dtype=torch.int64)
    m = tempcal.calibration_metrics(z, y, bins=10, device="cpu")
    assert m.rms_ce == pytest.approx(math.sqrt(0.5 * 0.2 ** 2), abs=1e-9)
    assert m.ece == pytest.approx(0.5 * 0.2, abs=1e-9)


def test_differs_from_the_hle_script_which_skips_its_last_bin():
    """The HLE script bins 100 sorted samples at a time and leaves its last (most confident) bin out; tempcal's
    equal-width bins count every sample. On data whose most confident samples are the worst calibrated the two
    differ; on data calibrated everywhere both are small."""
    rng = np.random.default_rng(0)
    c = np.sort(rng.uniform(0.5, 1.0, 1000))
    correct = (rng.uniform(size=1000) < np.where(c > 0.9, 0.5, c)).astype(np.int64)  # overconfident at the top
    logits = torch.tensor(np.log(c / (1 - c)))
    m = tempcal.calibration_metrics(logits, torch.tensor(correct), bins=15, device="cpu")
    assert m.rms_ce == pytest.approx(rms_loop(logits, correct), abs=1e-9)
    hle = hle_calib_err(c, correct.astype(np.float64))
    assert m.rms_ce > hle + 0.05  # the skipped top bin holds most of the miscalibration


def test_rms_ce_in_json_of_fit_and_report(tmp_path):
    from safetensors.torch import save_file

    logits, labels = miscalibrated(600, 5, 2.0, seed=1)
    path = tmp_path / "x.safetensors"
    save_file({"logits": logits.float().contiguous(), "labels": labels}, str(path))
    report = tempcal.fit_file(str(path), val_fraction=1.0, device="cpu")
    data = report.to_json()
    t = report.temperature
    assert data["before"]["rms_ce"] == pytest.approx(rms_loop(logits.float(), labels, 1.0), abs=1e-6)
    assert data["after"]["rms_ce"] == pytest.approx(rms_loop(logits.float(), labels, t), abs=1e-6)
    result = tempcal.report_file(str(path), taus=[1.0, 2.0], device="cpu").to_json()
    for row in result["results"]:
        assert row["rms_ce"] == pytest.approx(rms_loop(logits.float(), labels, row["tau"]), abs=1e-6)
