"""The ECE-minimising temperature (tempcal.core.ece_fit) is certified against a dense grid of the numpy ECE."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import miscalibrated
from reference import ece_loop, predictions, probabilities

import tempcal


def test_ece_objective_is_certified_against_a_dense_grid():
    from tempcal.core.ece_fit import minimise_ece

    logits, labels = miscalibrated(2000, 6, 2.0, seed=5)
    scan = tempcal.Scan(tempcal.as_logits_data(logits, labels), device="cpu")
    temperature, ece, certified = minimise_ece(scan, 2.0, bins=15, tol=1e-4)
    assert certified
    assert ece == pytest.approx(ece_loop(logits, labels, temperature)[0], abs=1e-9)
    correct = predictions(logits) == labels.numpy()
    grid = np.exp(np.linspace(math.log(2.0 / 100), math.log(2.0 * 100), 4001))
    dense = []
    for t in grid:
        confidence = probabilities(logits, t).max(1)
        index = np.clip(np.ceil(confidence * 15).astype(int) - 1, 0, 14)
        dense.append(sum(abs(correct[index == b].sum() - confidence[index == b].sum()) for b in range(15)) / 2000)
    assert ece <= min(dense) + 1e-4
