"""ECE estimators beside the contract's (tempcal.metrics.calibration) against numpy loops, torchmetrics, papers."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from conftest import miscalibrated, scan_of
from scipy.special import softmax

from tempcal.errors import TempcalError
from tempcal.metrics.calibration import (
    ESTIMATORS,
    classwise_ece,
    debiased_l2_calibration_error,
    ece_equal_mass,
    equal_mass_bins,
    estimators_for,
    rms_calibration_error,
)

# -- independent references (plain loops over the definitions) -------------------------------


def contract_bin(value: float, bins: int) -> int:
    """Bin i holds (i/B, (i+1)/B]; the first also holds 0 (a loop, not a search)."""
    for i in range(bins):
        if (i / bins < value <= (i + 1) / bins) or (i == 0 and value == 0):
            return i
    raise AssertionError(value)


def equal_mass_loop(confidence, correct, bins: int) -> list[list[tuple[float, float]]]:
    """The documented equal-mass rule as a loop: nominal cuts after rank round(jN/B) (halves up), each moved to
    the nearer end of a run of ties (the upper end when both are as near), coinciding cuts merged."""
    pairs = sorted(zip((float(c) for c in confidence), (float(k) for k in correct), strict=True))
    n = len(pairs)
    allowed = [0, *(i for i in range(1, n) if pairs[i - 1][0] != pairs[i][0]), n]
    cuts = {0, n}
    for j in range(1, bins):
        q = math.floor(Fraction(j * n, bins) + Fraction(1, 2))
        cuts.add(min(allowed, key=lambda a, q=q: (abs(a - q), -a)))
    cuts = sorted(cuts)
    return [pairs[a:b] for a, b in itertools.pairwise(cuts) if b > a]


def binned_ece(groups, n: int) -> float:
    return sum(len(g) / n * abs(np.mean([k for _, k in g]) - np.mean([c for c, _ in g])) for g in groups)


def array_split_bins(confidence, correct, bins: int):
    """Equal-mass bins as Roelofs et al.'s code forms them: np.array_split of the sorted samples."""
    order = np.argsort(confidence, kind="stable")
    return [list(zip(confidence[part], correct[part], strict=True)) for part in np.array_split(order, bins)]


def debiased_formula(groups, n: int) -> float:
    """Kumar et al. 2019: sqrt(max(0, sum_b (n_b/N)[(conf_b - acc_b)^2 - acc_b(1 - acc_b)/(n_b - 1)]))."""
    total = 0.0
    for g in groups:
        m = len(g)
        if m < 2:
            continue
        acc = sum(k for _, k in g) / m
        conf = sum(c for c, _ in g) / m
        total += m / n * ((conf - acc) ** 2 - acc * (1 - acc) / (m - 1))
    return math.sqrt(max(total, 0.0))


def rms_loop(confidence, correct, bins: int) -> float:
    n = len(confidence)
    groups: list[list[int]] = [[] for _ in range(bins)]
    for i, c in enumerate(confidence):
        groups[contract_bin(float(c), bins)].append(i)
    total = 0.0
    for members in groups:
        if members:
            total += len(members) / n * (np.mean(correct[members]) - np.mean(confidence[members])) ** 2
    return math.sqrt(total)


def classwise_loop(p: np.ndarray, y: np.ndarray, bins: int) -> float:
    """Kull et al. 2019: mean over classes of the ECE of p_c against [y == c], contract bins."""
    n, classes = p.shape
    total = 0.0
    for c in range(classes):
        slots = np.array([contract_bin(v, bins) for v in p[:, c]])
        for b in range(bins):
            members = slots == b
            if members.any():
                total += members.sum() / n * abs(np.mean(y[members] == c) - np.mean(p[members, c]))
    return total / classes


def tied_confidences(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Heavy ties: 40% exactly 1.0, 30% from four repeated values, the rest continuous."""
    rng = np.random.default_rng(seed)
    kind = rng.random(n)
    c = np.where(kind < 0.4, 1.0, np.where(kind < 0.7, rng.choice([0.5, 0.75, 0.9, 0.99], n), rng.uniform(0.3, 1, n)))
    k = rng.random(n) < c - 0.05
    return c, k


# -- equal-mass ECE ---------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "bins", "seed"), [(300, 15, 0), (1000, 10, 1), (997, 15, 2), (7, 15, 3), (50, 1, 4)])
def test_equal_mass_matches_loop_on_tied_data(n, bins, seed):
    c, k = tied_confidences(n, seed)
    groups = equal_mass_loop(c, k, bins)
    assert ece_equal_mass(c, k, bins) == pytest.approx(binned_ece(groups, n), abs=1e-12)
    b = equal_mass_bins(c, k, bins)
    assert b.count.tolist() == [len(g) for g in groups]
    assert b.lower.tolist() == [g[0][0] for g in groups]
    assert b.upper.tolist() == [g[-1][0] for g in groups]


def test_equal_mass_matches_array_split_without_ties():
    """Without ties and with N a multiple of B the bins are Roelofs et al.'s np.array_split bins exactly."""
    rng = np.random.default_rng(5)
    c = rng.uniform(0.2, 1.0, 1500)
    k = rng.random(1500) < c**2
    for bins in (5, 15, 30):
        groups = array_split_bins(c, k, bins)
        assert ece_equal_mass(c, k, bins) == pytest.approx(binned_ece(groups, 1500), abs=1e-12)
        assert equal_mass_bins(c, k, bins).count.tolist() == [1500 / bins] * bins


def test_equal_mass_never_splits_ties_and_is_order_invariant():
    c, k = tied_confidences(2000, 6)
    rng = np.random.default_rng(7)
    reference = {f: f(c, k, 15) for f in (ece_equal_mass, debiased_l2_calibration_error, rms_calibration_error)}
    b = equal_mass_bins(c, k, 15)
    assert np.all(b.upper[:-1] < b.lower[1:])  # every distinct confidence lives in one bin
    assert b.upper[-1] == 1.0 and b.count[-1] == np.sum(c == 1.0)  # the run of 1.0s is a bin of its own
    for _ in range(5):
        order = rng.permutation(len(c))
        for f, value in reference.items():
            assert f(c[order], k[order], 15) == value  # exactly, not approximately
    # A split-the-sorted-array estimator is not: tied 1.0s with different correctness land in either bin.
    splits = {binned_ece(array_split_bins(c[o], k[o], 15), len(c)) for o in (rng.permutation(len(c)) for _ in range(5))}
    assert len(splits) > 1


def test_all_confidences_tied():
    c = np.ones(100)
    k = np.arange(100) < 90
    assert equal_mass_bins(c, k, 15).count.tolist() == [100.0]
    assert ece_equal_mass(c, k, 15) == pytest.approx(0.1, abs=1e-15)
    assert debiased_l2_calibration_error(c, k, 15) == pytest.approx(math.sqrt(max(0.01 - 0.09 / 99, 0)))


def test_scan_estimators_are_invariant_to_row_order_with_saturated_confidences():
    """Logits with huge margins give confidence exactly 1.0 for many rows; shuffling rows changes nothing."""
    logits, labels = miscalibrated(1200, 6, 3.0, seed=8, dtype=torch.float64)
    logits[:500, 0] += 200.0  # 500 rows whose confidence is exactly 1.0, some of them wrong
    confidence = torch.softmax(logits, 1).max(1).values
    assert int((confidence == 1.0).sum()) >= 500
    order = torch.randperm(1200, generator=torch.Generator().manual_seed(9))
    first = estimators_for(scan_of(logits, labels, chunk_rows=100), 1.0, 15, ESTIMATORS)
    second = estimators_for(scan_of(logits[order], labels[order], chunk_rows=77), 1.0, 15, ESTIMATORS)
    for name in ("ece_equal_mass", "l2_ce_debiased"):
        assert first[name] == second[name]
    for name in ("rms_ce", "ece_classwise"):
        assert first[name] == pytest.approx(second[name], abs=1e-14)


# -- RMS calibration error ---------------------------------------------------------------------


def test_rms_matches_loop_and_torchmetrics():
    from torchmetrics.functional.classification import multiclass_calibration_error

    logits, labels = miscalibrated(3000, 10, 2.0, seed=10, dtype=torch.float64)
    p = softmax(logits.numpy() / 1.4, axis=1)
    confidence = p.max(1)
    correct = (p.argmax(1) == labels.numpy()).astype(float)
    expected = rms_loop(confidence, correct, 15)
    assert rms_calibration_error(confidence, correct, 15) == pytest.approx(expected, abs=1e-12)
    scan = scan_of(logits, labels)
    assert estimators_for(scan, 1.4, 15, ["rms_ce"])["rms_ce"] == pytest.approx(expected, abs=1e-10)
    # torchmetrics' norm="l2" is the same estimator, in float32; its bins are [i/B, (i+1)/B) (equal for
    # continuous data).
    tm = multiclass_calibration_error(torch.from_numpy(p), labels, num_classes=10, n_bins=15, norm="l2")
    assert float(tm) == pytest.approx(expected, abs=1e-6)


def test_rms_on_a_bin_edge_uses_the_lower_bin():
    # Confidence 0.6 on the edge 3/5 of 5 bins belongs to (0.4, 0.6]; with 0.61 there it is one bin, gap 0.
    c = np.array([0.6, 0.6, 0.61, 0.61])
    k = np.array([1, 0, 1, 1])
    assert rms_calibration_error(c, k, 5) == pytest.approx(rms_loop(c, k.astype(float), 5), abs=1e-15)
    assert rms_calibration_error(c, k, 5) == pytest.approx(math.sqrt(0.5 * 0.1**2 + 0.5 * 0.39**2))


# -- debiased L2 (Kumar et al. 2019) --------------------------------------------------------------


@pytest.mark.parametrize(("n", "bins"), [(1500, 15), (600, 10), (30, 15)])
def test_debiased_matches_the_papers_formula(n, bins):
    rng = np.random.default_rng(n)
    c = rng.uniform(0.3, 1.0, n)
    k = rng.random(n) < c - 0.08
    groups = array_split_bins(c, k, bins)
    assert debiased_l2_calibration_error(c, k, bins) == pytest.approx(debiased_formula(groups, n), abs=1e-12)


def test_debiased_matches_the_formula_on_tied_bins():
    c, k = tied_confidences(800, 11)
    groups = equal_mass_loop(c, k, 15)
    assert debiased_l2_calibration_error(c, k, 15) == pytest.approx(debiased_formula(groups, 800), abs=1e-12)


def test_debiased_removes_the_plug_in_bias():
    """A constant 0.1 gap has binned squared error 0.01: the debiased square averages to it over seeds, the
    plug-in square (the same bins, no correction) sits near 0.01 + acc(1 - acc)/n_b = 0.02."""
    rng = np.random.default_rng(12)
    debiased, plug_in = [], []
    for _ in range(200):
        c = rng.uniform(0.5, 1.0, 300)
        k = rng.random(300) < c - 0.1
        groups = equal_mass_loop(c, k, 15)
        plug_in.append(sum(len(g) / 300 * (np.mean([x for _, x in g]) - np.mean([x for x, _ in g])) ** 2
                           for g in groups))
        debiased.append(debiased_l2_calibration_error(c, k, 15) ** 2)
    assert np.mean(debiased) == pytest.approx(0.01, abs=0.002)
    assert np.mean(plug_in) > 0.016


# -- classwise ECE (Kull et al. 2019) --------------------------------------------------------------


def test_classwise_matches_loop_and_torchmetrics():
    from torchmetrics.functional.classification import binary_calibration_error

    logits, labels = miscalibrated(2000, 7, 2.5, seed=13, dtype=torch.float64)
    logits[(labels != 3) & (torch.arange(2000) % 5 == 0), 3] = -math.inf  # p_3 = 0 exactly: the first bin
    scan = scan_of(logits, labels, chunk_rows=333)
    before = scan.passes
    value = classwise_ece(scan.classwise(1 / 1.7, 15))
    assert scan.passes == before + 1
    p = softmax(logits.numpy() / 1.7, axis=1)
    y = labels.numpy()
    assert value == pytest.approx(classwise_loop(p, y, 15), abs=1e-12)
    # torchmetrics has no classwise ECE; binary_calibration_error of (p_c, y == c) is one class's term, with bins
    # [i/B, (i+1)/B) and exact 1.0 in a bin of its own; continuous p (and p = 0, first bin in both) agree.
    terms = [float(binary_calibration_error(torch.from_numpy(p[:, c].copy()), torch.from_numpy(y == c).long(),
                                            n_bins=15, norm="l1")) for c in range(7)]
    assert value == pytest.approx(np.mean(terms), abs=1e-10)


def test_classwise_binary_single_logit_counts_two_classes():
    g = torch.Generator().manual_seed(14)
    z = torch.randn(1500, dtype=torch.float64, generator=g) * 3
    y = torch.bernoulli(torch.sigmoid(z / 2), generator=g).long()
    value = estimators_for(scan_of(z, y), 1.3, 10, ["ece_classwise"])["ece_classwise"]
    p1 = torch.sigmoid(z / 1.3).numpy()
    assert value == pytest.approx(classwise_loop(np.stack([1 - p1, p1], 1), y.numpy(), 10), abs=1e-12)


# -- the entry point ---------------------------------------------------------------------------------


def test_estimators_for_matches_per_sample_functions_and_counts_passes():
    logits, labels = miscalibrated(2500, 12, 2.2, seed=15, dtype=torch.float32)
    scan = scan_of(logits, labels, chunk_rows=600)
    before = scan.passes
    out = estimators_for(scan, 0.8, 15, ["l2_ce_debiased", "ece_equal_mass", "rms_ce"])
    assert scan.passes == before + 1  # one calibration pass serves all three
    assert list(out) == ["l2_ce_debiased", "ece_equal_mass", "rms_ce"]
    p = softmax(logits.double().numpy() / 0.8, axis=1)
    confidence = p.max(1)
    correct = p.argmax(1) == labels.numpy()
    groups = equal_mass_loop(confidence, correct, 15)
    assert out["ece_equal_mass"] == pytest.approx(binned_ece(groups, 2500), abs=1e-9)
    assert out["l2_ce_debiased"] == pytest.approx(debiased_formula(groups, 2500), abs=1e-9)
    assert out["rms_ce"] == pytest.approx(rms_loop(confidence, correct.astype(float), 15), abs=1e-9)
    everything = estimators_for(scan, 0.8, 15, ESTIMATORS)
    assert scan.passes == before + 3  # plus one calibration pass and one classwise pass
    assert everything["ece_classwise"] == pytest.approx(classwise_loop(p, labels.numpy(), 15), abs=1e-9)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"names": ["ece_smooth"]}, "unknown calibration estimator 'ece_smooth'"),
    ({"tau": 0.0}, "temperature must be a positive finite number"),
    ({"tau": math.inf}, "temperature must be a positive finite number"),
    ({"bins": 0}, "bins must be a whole number >= 1"),
])
def test_bad_arguments_are_one_line_errors(kwargs, message):
    logits, labels = miscalibrated(50, 3, 1.0, seed=16, dtype=torch.float64)
    args = {"tau": 1.0, "bins": 15, "names": ESTIMATORS, **kwargs}
    with pytest.raises(TempcalError, match=message) as info:
        estimators_for(scan_of(logits, labels), **args)
    assert "\n" not in str(info.value)


def test_bad_per_sample_input():
    with pytest.raises(TempcalError, match="at least one sample"):
        ece_equal_mass(np.array([]), np.array([]), 15)
    with pytest.raises(TempcalError, match="3 values but correct has 2"):
        ece_equal_mass(np.array([0.5, 0.6, 0.7]), np.array([1, 0]), 15)
    with pytest.raises(TempcalError, match="1 confidences outside"):
        rms_calibration_error(np.array([0.5, math.nan]), np.array([1, 0]), 15)
