"""The ECE-minimising temperature (tempcal.core.ece_fit) is certified against a dense grid of the numpy ECE."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import DEVICES, EXAMPLE, miscalibrated, miscalibrated_binary
from reference import ece_loop, predictions, two_class

import tempcal


def numpy_ece(logits, labels, temperatures, bins: int = 15) -> np.ndarray:
    """The binned ECE at each temperature, in float64 numpy, straight from the softmax (bins (i/B, (i+1)/B])."""
    z = two_class(torch.as_tensor(logits).double().numpy())
    correct = (predictions(logits) == np.asarray(labels)).astype(np.float64)
    temperatures = np.atleast_1d(np.asarray(temperatures, dtype=np.float64))
    step = max(1, 2_000_000 // z.size)
    out = []
    for start in range(0, len(temperatures), step):
        scaled = z[None] / temperatures[start:start + step, None, None]
        confidence = 1 / np.exp(scaled - scaled.max(2, keepdims=True)).sum(2)  # [T, N]: the max softmax
        index = np.clip(np.ceil(confidence * bins).astype(int) - 1, 0, bins - 1)
        index += bins * np.arange(len(scaled))[:, None]  # one run of bins per temperature
        sums = np.bincount(index.ravel(), (correct - confidence).ravel(), bins * len(scaled))
        out.append(np.abs(sums.reshape(-1, bins)).sum(1) / len(correct))
    return np.concatenate(out)


def dense_minimum(logits, labels, centre: float, points: int) -> float:
    """The least numpy ECE on a grid of ``points`` temperatures, log-spaced over the search's range."""
    return float(numpy_ece(logits, labels, np.exp(np.linspace(math.log(centre / 100), math.log(centre * 100),
                                                              points))).min())


def test_ece_objective_is_certified_against_a_dense_grid():
    from tempcal.core.ece_fit import minimise_ece

    logits, labels = miscalibrated(2000, 6, 2.0, seed=5)
    scan = tempcal.Scan(tempcal.as_logits_data(logits, labels), device="cpu")
    temperature, ece, certified = minimise_ece(scan, 2.0, bins=15, tol=1e-4)
    assert certified
    assert ece == pytest.approx(ece_loop(logits, labels, temperature)[0], abs=1e-9)
    assert ece <= dense_minimum(logits, labels, 2.0, 4001) + 1e-4


def _points(scan, thetas):
    from tempcal.core.ece_fit import _point, bin_sums

    return [_point(sums, scan.num_samples) for sums in bin_sums(scan, [math.exp(-t) for t in thetas], 15)]


@pytest.mark.parametrize("width", [1.0, 0.1, 0.01, 1e-3])
def test_the_bound_holds_on_a_dense_grid_inside_every_interval(width):
    """The lower bound from two ends' bin sums alone: below the numpy ECE everywhere between them, on intervals from
    wide (many crossings) to narrow (one or none: the one-crossing rule), for multi-class and binary logits."""
    from tempcal.core.ece_fit import lower_bound

    rng = np.random.default_rng(int(1 / width))
    one_crossing = 0
    for logits, labels in (miscalibrated(300, 5, 2.0, seed=3), miscalibrated_binary(200, 2.0, seed=4)):
        scan = tempcal.Scan(tempcal.as_logits_data(logits, labels), device="cpu", dtype=torch.float64)
        starts = np.sort(rng.uniform(-1.0, 2.5, 25))
        for a, b in zip(starts, starts + width, strict=True):
            ends = _points(scan, [float(a), float(b)])
            one_crossing += round(ends[0].index_sum - ends[1].index_sum) == 1
            inside = numpy_ece(logits, labels, np.exp(np.linspace(a, b, 401)))
            assert inside.min() >= lower_bound(ends[0], ends[1], 0.0) - 1e-12
    if width <= 1e-3:
        assert one_crossing >= 5  # the narrow intervals do exercise the one-crossing rule


def _synthetic(rows: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Overconfident float32 logits (labels drawn at half their scale: T* near 2), as benchmarks/ece_fit_passes.py
    makes them."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, classes, generator=g) * 3
    return z, torch.multinomial(torch.softmax(z.double() / 2, 1), 1, generator=g)[:, 0]


def test_the_search_takes_a_few_passes_on_10k_rows_of_100_classes():
    """The first search took 39 passes on these rows (42 for the whole fit); now a handful, and the ECE found is
    still within tol of the numpy minimum."""
    from tempcal.core.ece_fit import minimise_ece

    logits, labels = _synthetic(10_000, 100, seed=0)
    scan = tempcal.Scan(tempcal.as_logits_data(logits, labels), device="cpu")
    passes = scan.passes
    calls: list[tuple[int, int]] = []
    temperature, ece, certified = minimise_ece(scan, 2.0, bins=15, on_pass=lambda *call: calls.append(call))
    assert certified and scan.passes - passes <= 10
    assert [done for done, _ in calls] == list(range(1, scan.passes - passes + 1)) and calls[-1][1] == 0
    assert all(left > 0 for _, left in calls[:-1])
    assert ece == pytest.approx(float(numpy_ece(logits, labels, temperature)[0]), abs=1e-6)  # float32 confidences
    near = np.exp(np.linspace(math.log(temperature) - 0.05, math.log(temperature) + 0.05, 61))
    assert ece <= numpy_ece(logits, labels, near).min() + 1e-4  # the whole range: the slow test below


@pytest.mark.slow
def test_the_search_on_10k_rows_is_certified_against_a_dense_grid():
    from tempcal.core.ece_fit import minimise_ece

    logits, labels = _synthetic(10_000, 100, seed=0)
    _, ece, certified = minimise_ece(tempcal.Scan(tempcal.as_logits_data(logits, labels)), 2.0, bins=15)
    assert certified and ece <= dense_minimum(logits, labels, 2.0, 4001) + 1e-4


def test_the_first_search_style_finds_a_t_of_the_same_ece():
    """Two pieces a round from 65 points (the first search's shape) and the default give ECEs within tol."""
    from tempcal.core.ece_fit import minimise_ece

    logits, labels = miscalibrated(1500, 8, 2.5, seed=11)
    scan = tempcal.Scan(tempcal.as_logits_data(logits, labels), device="cpu")
    start = scan.passes
    _, old_ece, old_certified = minimise_ece(scan, 2.5, bins=15, initial_points=65, max_pieces=2)
    old_passes, start = scan.passes - start, scan.passes
    _, ece, certified = minimise_ece(scan, 2.5, bins=15)
    assert old_certified and certified and abs(ece - old_ece) <= 1e-4
    assert scan.passes - start < old_passes


def test_rows_repeated_many_times_do_not_take_forty_passes():
    """Fifty copies of each row cross every edge together: no split separates them, so those intervals close only
    at the narrowest width. Cut into many pieces once a split leaves their crossings together, they get there in
    about a dozen passes instead of 37, and T is still certified against the dense grid."""
    from tempcal.core.ece_fit import minimise_ece

    logits, labels = miscalibrated(20, 5, 2.0, seed=2)
    logits, labels = logits.repeat(50, 1), labels.repeat(50)
    scan = tempcal.Scan(tempcal.as_logits_data(logits, labels), device="cpu")
    centre = tempcal.fit_temperature(scan).temperature
    start = scan.passes
    _, ece, certified = minimise_ece(scan, centre, bins=15)
    assert certified and scan.passes - start <= 16
    assert ece <= dense_minimum(logits, labels, centre, 4001) + 1e-4


def test_fit_on_the_shipped_example_certifies_in_a_few_passes(run_json):
    """``tempcal fit examples/digits_logits.safetensors --objective ece`` (every row fitted): 42 passes before."""
    from safetensors.numpy import load_file

    out = run_json(["fit", str(EXAMPLE), "--objective", "ece", "--val-fraction", "1", "--no-write"])
    assert out["converged"] and out["objective"] == "ece" and out["passes"] <= 12
    tensors = load_file(EXAMPLE)
    logits, labels = torch.from_numpy(tensors["logits"]), tensors["labels"]
    found = float(numpy_ece(logits, labels, out["temperature"])[0])
    nll_t = tempcal.fit_temperature(logits, torch.from_numpy(labels)).temperature
    assert found <= dense_minimum(logits, labels, nll_t, 4001) + 1e-4


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
    """The pass the search repeats (bins at several temperatures): no tensor longer than a chunk's logits, and the
    bins those of the calibration pass. The whole search is checked so in the slow test below."""
    from tempcal.core.ece_fit import bin_sums

    logits, labels = miscalibrated(3000, 10, 2.0, seed=7)
    scan = tempcal.Scan(tempcal.as_logits_data(logits, labels), device="cpu", chunk_rows=1024)
    betas = [0.3, 0.45, 0.7]
    with _LargestTensor() as seen:
        per_bin = bin_sums(scan, betas, 15)
    assert 0 < seen.largest <= 1024 * 10 and per_bin.shape == (3, 3, 15)
    [(sums, _)] = scan.calibration([betas[1]], 15)
    assert torch.equal(per_bin[1, 0], sums.bin_count) and torch.equal(per_bin[1, 1], sums.bin_confidence)


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
    # the same confidences in the same bins: one sample in another bin would move the ECE by far more
    assert tempcal.evaluate(scan, temperature, bins=15).ece == pytest.approx(ece, abs=1e-14)
    assert scan.passes - passes <= 10


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
