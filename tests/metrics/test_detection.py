"""AUROC, AUPR and FPR95 (tempcal.metrics.detection) against scikit-learn and plain numpy loops, ties included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import ref_auroc, ref_fpr95, sk_figures

from tempcal.metrics.detection import detection_metrics, fpr_at_recall


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
