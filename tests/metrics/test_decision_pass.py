"""The decision figures of every metrics object (AURC, E-AURC, AUGRC, smooth ECE, the risk-coverage curve) and the
conformal sets, as the metrics pass computes them from its own read, against independent float64 references: a
plain loop over k for the risk-coverage figures, relplot for the smooth ECE, a direct set construction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import DEVICES, EXAMPLE, miscalibrated, scan_of
from reference import probabilities, ref_conformal, ref_risk_coverage

from tempcal.conformal.passes import ConformalPlan, SetSums, fit_thresholds
from tempcal.conformal.passes import probabilities as chunk_probabilities
from tempcal.conformal.sets import set_rows
from tempcal.core.data import as_logits_data
from tempcal.core.scan import Scan
from tempcal.metrics import decisions
from tempcal.metrics.bootstrap import bootstrap_replicates
from tempcal.metrics.calibration import evaluate_many


def set_sums(probs: torch.Tensor, labels: torch.Tensor, thresholds) -> dict[str, torch.Tensor]:
    """Per score, ``[len(thresholds), 2]`` float64 sums over the rows: (rows covered, classes in the sets)."""
    return {score: torch.stack([covered.sum(1), size.sum(1)], 1).double()
            for score, (covered, size) in set_rows(probs, labels, thresholds).items()}


def tied(n: int = 600, c: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits whose rows repeat (blocks of tied confidences, right and wrong in one block) and whose classes tie
    inside rows; labels drawn independently of the repeats."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n // 4, c, generator=g, dtype=torch.float64) * 2.5
    base[:10, 1] = base[:10, 0]  # two classes tied at the top of some rows
    z = base.repeat(4, 1)[torch.randperm(n, generator=g)]
    y = torch.multinomial(torch.softmax(z / 2.5, 1), 1, generator=g)[:, 0]
    return z, y


def test_each_metrics_object_holds_the_reference_figures_of_its_rows_confidences():
    z, y = tied()
    scan = scan_of(z, y, chunk_rows=97)
    taus = [0.5, 1.0, 2.5]
    for tau, m in zip(taus, evaluate_many(scan, taus), strict=True):
        rows = scan.per_sample(1 / tau)  # the same confidences, bit for bit, as the metrics pass's
        confidence, correct = rows["confidence"].numpy(), rows["correct"].numpy()
        assert len(np.unique(confidence)) < len(confidence) // 3  # ties: blocks of four rows, and more
        ref = ref_risk_coverage(confidence, correct)
        assert (m.aurc, m.eaurc, m.augrc) == pytest.approx((ref["aurc"], ref["eaurc"], ref["augrc"]), abs=1e-12)
        curve = m.risk_coverage
        assert 50 <= len(curve["coverage"]) <= 100 and curve["coverage"][-1] == 1.0
        assert curve["risk"][-1] == pytest.approx(1 - m.accuracy, abs=1e-12)
        reference_conf = probabilities(z, tau).max(1)
        np.testing.assert_allclose(confidence, reference_conf, rtol=1e-12)


def test_smooth_ece_equals_relplot_on_ties_and_on_the_shipped_example():
    relplot = pytest.importorskip("relplot", reason="relplot (a dev dependency) checks the smooth ECE")
    from safetensors.torch import load_file

    digits = load_file(str(EXAMPLE))
    for (z, y), tau in (((tied()), 1.0), ((digits["logits"], digits["labels"]), 2.0)):
        scan = scan_of(z, y)
        [m] = evaluate_many(scan, [tau])
        rows = scan.per_sample(1 / tau)
        expected = relplot.smECE(rows["confidence"].numpy(), rows["correct"].numpy().astype(np.float64))
        assert m.smece == pytest.approx(expected, abs=1e-4)
        ref = ref_risk_coverage(rows["confidence"].numpy(), rows["correct"].numpy())
        assert m.aurc == pytest.approx(ref["aurc"], abs=1e-12) and m.augrc == pytest.approx(ref["augrc"], abs=1e-12)


def test_chunks_and_the_read_split_change_nothing(monkeypatch):
    """Whatever the chunk size, and when memory lets one read keep only one temperature's confidences (then one
    read per temperature), the figures are the same."""
    z, y = tied(seed=3)
    taus = [0.7, 1.0, 1.9]
    whole = evaluate_many(scan_of(z, y), taus)
    scan = scan_of(z, y, chunk_rows=13)
    monkeypatch.setattr(decisions, "available_bytes", lambda device: decisions.ROW_BYTES * len(y) * 5)
    assert decisions.temperatures_per_read(len(y), "cpu") == 1
    before = scan.passes
    split = evaluate_many(scan, taus)
    assert scan.passes == before + 3
    for a, b in zip(whole, split, strict=True):
        assert (a.aurc, a.eaurc, a.augrc, a.nll) == pytest.approx((b.aurc, b.eaurc, b.augrc, b.nll), rel=1e-12)
        assert a.smece == pytest.approx(b.smece, abs=1e-12) and a.risk_coverage == b.risk_coverage


def test_one_read_serves_every_figure_and_the_switch_turns_them_off(monkeypatch):
    z, y = miscalibrated(500, 5, 2.0, seed=4)
    scan = scan_of(z, y)
    before = scan.passes
    [m] = evaluate_many(scan, [1.3])
    assert scan.passes == before + 1 and not math.isnan(m.aurc + m.smece)
    monkeypatch.setenv(decisions.SKIP_VARIABLE, "1")
    [off] = evaluate_many(scan, [1.3])
    assert math.isnan(off.aurc) and math.isnan(off.smece) and off.risk_coverage == {}
    assert off.nll == m.nll and off.ece == m.ece


def test_decision_figures_of_any_subset_of_rows():
    """The hook groups and folds use: the figures of a subset are those of its rows alone."""
    rng = np.random.default_rng(2)
    confidence = np.round(rng.random(900), 2)
    correct = rng.random(900) < confidence
    subset = rng.random(900) < 0.3
    figures = decisions.decision_figures(confidence[subset], correct[subset])
    ref = ref_risk_coverage(confidence[subset], correct[subset])
    assert (figures.aurc, figures.eaurc, figures.augrc) == pytest.approx(tuple(ref.values()), abs=1e-12)
    kept = confidence.copy()
    decisions.decision_figures(kept, correct)
    assert np.array_equal(kept, confidence)  # not overwritten unless asked
    assert math.isnan(decisions.decision_figures(np.zeros(0), np.zeros(0, bool)).aurc)


def test_conformal_sets_from_fitting_rows_on_evaluation_rows_match_a_direct_construction():
    z, y = tied(800, 7, seed=5)
    fit_rows, eval_rows = np.arange(0, 800, 2), np.arange(1, 800, 2)
    scan = scan_of(z, y, chunk_rows=101)
    fitting, evaluation = scan.select(torch.from_numpy(fit_rows)), scan.select(torch.from_numpy(eval_rows))
    alphas, taus = [0.1, 0.25], [1.0, 1.7]
    before = fitting.passes
    thresholds = fit_thresholds(fitting, taus, alphas)
    assert fitting.passes == before + 1
    results = evaluate_many(evaluation, taus, extra=ConformalPlan(alphas, thresholds))
    for tau, m in zip(taus, results, strict=True):
        p = probabilities(z, tau)
        assert [(c.alpha, c.score) for c in m.conformal] == [(a, s) for a in alphas for s in ("lac", "aps")]
        for c in m.conformal:
            q, coverage, size = ref_conformal(p[fit_rows], y.numpy()[fit_rows], p[eval_rows], y.numpy()[eval_rows],
                                              c.alpha)[c.score]
            assert c.threshold == pytest.approx(q, abs=1e-12)
            assert (c.coverage, c.mean_size) == pytest.approx((coverage, size), abs=1e-12)


def test_set_sums_per_group_add_up_to_each_groups_own_sums():
    z, y = miscalibrated(300, 5, 2.0, seed=6, dtype=torch.float64)
    groups = torch.arange(300) % 3
    thresholds = [{"lac": [0.4, 0.8], "aps": [0.9, 0.95]}]
    sums = SetSums(thresholds, torch.device("cpu"), groups=groups, num_groups=3)
    Scan(as_logits_data(z, y), device="cpu", chunk_rows=37).visit([1 / 1.5], sums)
    [reduced] = sums.reduced()
    p = chunk_probabilities(z - z.max(1, keepdim=True).values, 1 / 1.5)
    for g in range(3):
        rows = groups == g
        alone = set_sums(p[rows], y[rows], thresholds[0])
        for score in ("lac", "aps"):
            torch.testing.assert_close(reduced[score][g], alone[score], rtol=0, atol=1e-12)


def test_bootstrap_resamples_the_risk_coverage_figures_with_the_same_draws():
    rng = np.random.default_rng(8)
    confidence = np.round(0.3 + 0.7 * rng.random(150), 2)  # ties, and duplicates in every resample
    correct = rng.random(150) < confidence
    nll = -np.log(np.where(correct, confidence, 1 - confidence))
    replicates = bootstrap_replicates(confidence, correct, nll, 12, seed=3, bins=10, batch=5)
    draws = np.random.default_rng(3)
    for r in range(12):
        index = draws.integers(0, 150, size=150)
        c, k = confidence[index], correct[index]
        ref = ref_risk_coverage(c, k)
        assert replicates["aurc"][r] == pytest.approx(ref["aurc"], abs=1e-12)
        assert replicates["eaurc"][r] == pytest.approx(ref["eaurc"], abs=1e-12)
        assert replicates["augrc"][r] == pytest.approx(ref["augrc"], abs=1e-12)


def test_a_plan_with_judged_rows_forms_their_sets_alone_from_the_same_read():
    """A plan with ``judged`` rows (and their count) forms the sets over those rows alone, on the one metrics read."""
    z, y = tied(900, 6, seed=7)
    scan = scan_of(z, y, chunk_rows=111)
    thresholds = fit_thresholds(scan_of(z[:300], y[:300]), [1.4], [0.2])
    judged = torch.arange(900) % 3 != 0
    plan = ConformalPlan([0.2], thresholds, judged=judged, rows=int(judged.sum()))
    before = scan.passes
    [m] = evaluate_many(scan, [1.4], extra=plan)
    assert scan.passes == before + 1
    p, rows = probabilities(z, 1.4), judged.numpy()
    want = ref_conformal(p[:300], y.numpy()[:300], p[rows], y.numpy()[rows], 0.2)
    for c in m.conformal:
        assert (c.coverage, c.mean_size) == pytest.approx(want[c.score][1:], abs=1e-12)
    assert [c.score for c in m.conformal] == ["lac", "aps"]


@pytest.mark.parametrize("accuracy", [0.08, 0.5, 0.93])
def test_the_smaller_subset_kept_gives_the_same_figures(accuracy):
    """Mostly wrong rows (a language model's next tokens) keep the right rows' confidences, mostly right ones the
    wrong rows': either way the reference figures, and relplot's smooth ECE."""
    rng = np.random.default_rng(int(accuracy * 100))
    confidence = np.round(rng.random(3000), 3)
    correct = rng.random(3000) < accuracy
    figures = decisions.decision_figures(confidence, correct)
    ref = ref_risk_coverage(confidence, correct)
    assert (figures.aurc, figures.eaurc, figures.augrc) == pytest.approx(tuple(ref.values()), abs=1e-12)
    assert figures.risk_coverage["risk"][-1] == pytest.approx(1 - correct.mean(), abs=1e-12)
    relplot = pytest.importorskip("relplot", reason="relplot (a dev dependency) checks the smooth ECE")
    assert figures.smece == pytest.approx(relplot.smECE(confidence, correct.astype(np.float64)), abs=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_on_any_device_the_figures_and_sets_are_the_cpus(device):
    """Confidences kept on the device (a GPU's memory), brought to the host for the ranking; sets summed there."""
    z, y = tied(600, 5, seed=9)
    alphas, taus = [0.1], [1.0, 2.0]
    cpu, there = scan_of(z, y), Scan(as_logits_data(z, y), device=device)
    plans = [ConformalPlan(alphas, fit_thresholds(scan, taus, alphas)) for scan in (cpu, there)]
    for a, b in zip(evaluate_many(cpu, taus, extra=plans[0]), evaluate_many(there, taus, extra=plans[1]),
                    strict=True):
        assert (a.aurc, a.eaurc, a.augrc, a.smece) == pytest.approx((b.aurc, b.eaurc, b.augrc, b.smece), abs=1e-9)
        assert [v for c in a.conformal for v in (c.threshold, c.coverage, c.mean_size)] == pytest.approx(
            [v for c in b.conformal for v in (c.threshold, c.coverage, c.mean_size)], abs=1e-9)
