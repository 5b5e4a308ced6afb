"""The ECE-minimising temperature (tempcal.core.ece_fit) is certified against a dense grid of the numpy ECE."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from conftest import DEVICES, miscalibrated
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


# -- memory: nothing per sample between chunks (issue 18, item 5) -----------------------------------------------


class _LargestTensor(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the most elements of any tensor an operation returns while the mode is on."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_one_pass_of_the_ece_search_keeps_nothing_per_sample():
    """The pass the search repeats (bins and drifts at several temperatures): no tensor longer than a chunk's logits,
    and the bins those of the calibration pass. The whole search is checked so in the slow test below."""
    logits, labels = miscalibrated(3000, 10, 2.0, seed=7)
    scan = tempcal.Scan(tempcal.as_logits_data(logits, labels), device="cpu", chunk_rows=1024)
    betas = [0.3, 0.45, 0.7]
    with _LargestTensor() as seen:
        per_bin, drift = scan.ece_terms(betas, 15)
    assert 0 < seen.largest <= 1024 * 10 and drift.shape == (2,)
    [(sums, _)] = scan.calibration([betas[1]], 15)
    assert torch.equal(per_bin[1, 0], sums.bin_count)


@pytest.mark.slow  # about 80 s on two busy cores; its faster sibling is the test above
def test_the_ece_search_keeps_nothing_per_sample():
    """It kept, for 65 temperatures, confidence and energy per row plus copies and an int64 bin index (about 2 KB a
    row: out of memory near 65M token rows on a 141 GB GPU). Now no tensor it makes is longer than a chunk's
    logits, and it finds the same certified T in as many passes, with the ECE the calibration pass gives."""
    from tempcal.core.ece_fit import minimise_ece

    logits, labels = miscalibrated(3000, 10, 2.0, seed=7)
    scan = tempcal.Scan(tempcal.as_logits_data(logits, labels), device="cpu", chunk_rows=1024)
    passes = scan.passes
    with _LargestTensor() as seen:
        temperature, ece, certified = minimise_ece(scan, 2.0, bins=15)
    assert 0 < seen.largest <= 1024 * 10  # a chunk of logits, never 3000 rows of anything
    assert certified and ece == pytest.approx(ece_loop(logits, labels, temperature)[0], abs=1e-12)
    assert tempcal.evaluate(scan, temperature, bins=15).ece == ece  # the same confidences in the same bins
    assert scan.passes - passes <= 1 + 40


def _old_drift(scan, a: float, b: float, bins: int) -> float:
    """The drift bound as the search first computed it: from every row's confidence at both ends, held at once."""
    [(_, kept_a)] = scan.calibration([math.exp(-a)], bins, keep_scores=True)
    [(_, kept_b)] = scan.calibration([math.exp(-b)], bins, keep_scores=True)
    conf_a, conf_b = kept_a["confidence"], kept_b["confidence"]
    edges = torch.arange(bins + 1, dtype=torch.float64) / bins
    bin_a, bin_b = ((torch.searchsorted(edges, c) - 1).clamp(0, bins - 1) for c in (conf_a, conf_b))
    correct = scan.stats.correct.double()
    slack = torch.maximum((correct - conf_a).abs(), (correct - conf_b).abs())
    return float(((conf_b - conf_a).abs() + 2 * (bin_b - bin_a).abs() * slack).sum())


def test_the_chunked_drift_is_the_drift_of_every_row():
    logits, labels = miscalibrated(3000, 7, 2.5, seed=2)
    scan = tempcal.Scan(tempcal.as_logits_data(logits, labels), device="cpu", chunk_rows=333)
    thetas = [-1.0, -0.2, 0.3, 0.31, 1.7]
    per_bin, drift = scan.ece_terms([math.exp(-t) for t in thetas], 15)
    assert per_bin.shape == (5, 3, 15) and drift.shape == (4,)
    for k, (a, b) in enumerate(itertools.pairwise(thetas)):
        assert float(drift[k]) == pytest.approx(_old_drift(scan, a, b, 15), rel=1e-12)
    [(sums, _)] = scan.calibration([math.exp(-0.3)], 15)
    assert torch.equal(per_bin[2, 0], sums.bin_count) and torch.equal(per_bin[2, 1], sums.bin_confidence)


# On the CPU the reference is the same computation: only with CUDA does this say more than the tests above.
@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.slow), *DEVICES[1:]])
def test_the_ece_search_finds_the_same_t_on_every_device_in_bounded_memory(device):
    from tempcal.core.ece_fit import minimise_ece

    logits, labels = miscalibrated(200_000 if device == "cuda" else 3000, 10, 2.0, seed=9)
    scan = tempcal.Scan(tempcal.as_logits_data(logits, labels), device=device, chunk_rows=4096)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    temperature, ece, certified = minimise_ece(scan, 2.0, bins=15)
    reference = minimise_ece(tempcal.Scan(tempcal.as_logits_data(logits, labels), device="cpu",
                                          dtype=scan.compute_dtype), 2.0, bins=15)
    assert certified and temperature == pytest.approx(reference[0], rel=1e-9) and ece == pytest.approx(reference[1])
    if device == "cuda":  # chunks and per-bin sums: far below 65 float64 confidences a row (104 MB here)
        assert torch.cuda.max_memory_allocated() - before < 16 << 20
