"""AUROC, AUPR and FPR95 (tempcal.metrics.detection) against scikit-learn and plain numpy loops, ties included;
the bootstrap intervals against resampling from scratch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import ref_auroc, ref_fpr95, sk_figures

from tempcal.errors import TempcalError
from tempcal.metrics.detection import detection_intervals, detection_metrics, fpr_at_recall


def check_metrics(id_scores, ood_scores):
    m = detection_metrics(id_scores, ood_scores)
    sk = sk_figures(id_scores, ood_scores)
    assert m.auroc == pytest.approx(sk["auroc"], abs=1e-12)
    assert m.auroc == pytest.approx(ref_auroc(id_scores, ood_scores), abs=1e-12)
    assert m.aupr_in == pytest.approx(sk["aupr_in"], abs=1e-12)
    assert m.aupr_out == pytest.approx(sk["aupr_out"], abs=1e-12)
    assert m.fpr95 == ref_fpr95(id_scores, ood_scores)
    assert m.mean_id == pytest.approx(np.mean(id_scores)) and m.mean_ood == pytest.approx(np.mean(ood_scores))
    return m


def test_metrics_with_ties_from_quantized_scores():
    rng = np.random.default_rng(0)
    id_scores = np.round(rng.beta(5, 2, 333), 1)  # few distinct values: many ties across and within sides
    ood_scores = np.round(rng.beta(2, 3, 211), 1)
    m = check_metrics(id_scores, ood_scores)
    assert 0.5 < m.auroc < 1 and 0 < m.fpr95 < 1
    # the threshold keeps at least 95% of ID, and any higher ID value keeps fewer
    assert np.mean(id_scores >= m.fpr95_threshold) >= 0.95
    assert np.mean(id_scores >= np.min(id_scores[id_scores > m.fpr95_threshold])) < 0.95


def test_metrics_all_equal_scores():
    m = check_metrics(np.full(40, 0.25), np.full(60, 0.25))
    assert m.auroc == 0.5 and m.fpr95 == 1.0
    assert m.aupr_in == pytest.approx(0.4) and m.aupr_out == pytest.approx(0.6)


def test_metrics_perfectly_separable():
    m = check_metrics(np.linspace(0.6, 1.0, 50), np.linspace(0.0, 0.5, 70))
    assert (m.auroc, m.aupr_in, m.aupr_out, m.fpr95) == (1.0, 1.0, 1.0, 0.0)
    reverse = check_metrics(np.linspace(0.0, 0.5, 50), np.linspace(0.6, 1.0, 70))
    assert reverse.auroc == 0.0 and reverse.fpr95 == 1.0


def test_fpr95_threshold_at_exactly_95_percent():
    # 20 ID samples: keeping 19 is exactly 95%, so the threshold is the 19th largest (2), and OOD at 2 counts.
    fpr, threshold = fpr_at_recall(np.arange(1, 21), np.array([1.0, 2.0, 1.5, 0.0]))
    assert threshold == 2.0 and fpr == 0.25


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=45), st.lists(st.integers(0, 6), min_size=1, max_size=30))
def test_fpr95_matches_the_contract_loop(id_scores, ood_scores):
    fpr, _ = fpr_at_recall(np.array(id_scores, float), np.array(ood_scores, float))
    assert fpr == ref_fpr95(id_scores, ood_scores)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=40), st.lists(st.integers(-3, 3), min_size=1, max_size=40))
def test_one_sort_figures_equal_scikit_learn_with_ties(id_scores, ood_scores):
    """AUROC, AUPR-In and AUPR-Out come from one sort of both sides; scikit-learn is the reference, ties included."""
    check_metrics(np.array(id_scores, float) / 2, np.array(ood_scores, float) / 2)


def test_infinite_scores_tie_with_each_other():
    """MaxLogit beyond float64's range is +-inf: equal infinities tie (scikit-learn refuses them; Mann-Whitney here)."""
    id_scores = np.array([np.inf, np.inf, 1.0, -np.inf])
    ood_scores = np.array([np.inf, 0.0, -np.inf])
    m = detection_metrics(id_scores, ood_scores)
    assert m.auroc == pytest.approx(ref_auroc(id_scores, ood_scores), abs=1e-15)


# -- bootstrap intervals ------------------------------------------------------------------------------------
def naive_replicates(id_scores, ood_scores, n_resamples, seed, ood_stream=1):
    """Each resample drawn as documented and scored from scratch by detection_metrics (itself checked above)."""
    id_rng, ood_rng = np.random.default_rng(seed), np.random.default_rng([seed, ood_stream])
    auroc, fpr = [], []
    for _ in range(n_resamples):
        i = id_rng.integers(0, len(id_scores), size=len(id_scores))
        j = ood_rng.integers(0, len(ood_scores), size=len(ood_scores))
        m = detection_metrics(id_scores[i], ood_scores[j])
        auroc.append(m.auroc)
        fpr.append(m.fpr95)
    return np.array(auroc), np.array(fpr)


@pytest.mark.parametrize("quantised", [False, True])
def test_intervals_equal_resampling_from_scratch(quantised):
    rng = np.random.default_rng(4)
    id_scores, ood_scores = rng.normal(1.0, 1.0, 157), rng.normal(0.0, 1.0, 93)
    if quantised:  # ties within and across the sides
        id_scores, ood_scores = np.round(id_scores, 1), np.round(ood_scores, 1)
    auroc, fpr = naive_replicates(id_scores, ood_scores, 60, seed=11, ood_stream=3)
    rows = detection_intervals([id_scores, -id_scores], [ood_scores, -ood_scores], 60, 11, ood_stream=3, batch=7)
    want = {"auroc": tuple(np.quantile(auroc, [0.025, 0.975])), "fpr95": tuple(np.quantile(fpr, [0.025, 0.975]))}
    for key in ("auroc", "fpr95"):
        assert rows[0][key] == pytest.approx(want[key], abs=1e-12), key
    reverse_auroc, _ = naive_replicates(-id_scores, -ood_scores, 60, seed=11, ood_stream=3)
    assert rows[1]["auroc"] == pytest.approx(tuple(np.quantile(reverse_auroc, [0.025, 0.975])), abs=1e-12)


def test_intervals_are_seeded_and_do_not_depend_on_batching():
    rng = np.random.default_rng(5)
    id_scores, ood_scores = rng.normal(1.0, 1.0, 400), rng.normal(0.0, 1.0, 300)
    a = detection_intervals([id_scores], [ood_scores], 200, 3)
    assert a == detection_intervals([id_scores], [ood_scores], 200, 3, batch=1)
    assert a == detection_intervals([id_scores], [ood_scores], 200, 3, batch=64)
    assert a != detection_intervals([id_scores], [ood_scores], 200, 4)
    assert a != detection_intervals([id_scores], [ood_scores], 200, 3, ood_stream=2)
    m = detection_metrics(id_scores, ood_scores)
    assert a[0]["auroc"][0] < m.auroc < a[0]["auroc"][1] and a[0]["fpr95"][0] <= m.fpr95 <= a[0]["fpr95"][1]
    wide = detection_intervals([id_scores], [ood_scores], 200, 3, level=0.99)[0]
    assert wide["auroc"][0] <= a[0]["auroc"][0] and wide["auroc"][1] >= a[0]["auroc"][1]


def test_fpr_threshold_found_beyond_the_lowest_scores():
    """The FPR95 threshold of a resample lies among the lowest ID scores; with few samples it may need all of them."""
    id_scores, ood_scores = np.arange(8, dtype=float), np.array([0.5, 3.0, 9.0])
    auroc, fpr = naive_replicates(id_scores, ood_scores, 40, seed=0)
    got = detection_intervals([id_scores], [ood_scores], 40, 0)[0]
    assert got["fpr95"] == pytest.approx(tuple(np.quantile(fpr, [0.025, 0.975])), abs=1e-12)
    assert got["auroc"] == pytest.approx(tuple(np.quantile(auroc, [0.025, 0.975])), abs=1e-12)


def test_bad_bootstrap_arguments():
    a, b = np.arange(5.0), np.arange(4.0)
    for n in (0, -1, 2.5, True):
        with pytest.raises(TempcalError):
            detection_intervals([a], [b], n, 0)
    with pytest.raises(TempcalError):
        detection_intervals([a], [b], 10, 0, level=1.0)
    with pytest.raises(TempcalError):
        detection_intervals([np.empty(0)], [b], 10, 0)


@pytest.mark.parametrize("ties", [0, 2, 5])
def test_figures_against_a_sorted_ood_set_equal_scikit_learns(ties):
    """``ood --group-by``'s path: one OOD set sorted once, many small ID subsets against it (ties included, in
    either set and across them), figure for figure as scikit-learn and :func:`detection_metrics` give them."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    from tempcal.metrics.detection import SortedOod, detection_against

    rng = np.random.default_rng(ties)
    ood = rng.normal(0.0, 1.0, 300)
    if ties:
        ood = np.round(ood * ties) / ties
    sorted_ood = SortedOod(ood)
    for n in (1, 2, 7, 40):
        ids = rng.normal(0.7, 1.0, n)
        if ties:
            ids = np.round(ids * ties) / ties
        got, plain = detection_against(ids, sorted_ood), detection_metrics(ids, ood)
        labels, scores = np.r_[np.ones(n), np.zeros(ood.size)], np.r_[ids, ood]
        assert got.auroc == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
        assert got.aupr_in == pytest.approx(average_precision_score(labels, scores), abs=1e-12)
        assert got.aupr_out == pytest.approx(average_precision_score(1 - labels, -scores), abs=1e-12)
        assert (got.fpr95, got.fpr95_threshold) == (plain.fpr95, plain.fpr95_threshold)
