"""Risk-coverage figures and smooth ECE against independent float64 references: a plain loop over every order of
each tie (AURC, E-AURC, AUGRC) and relplot itself (smooth ECE)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from conftest import EXAMPLE

from tempcal.metrics import decisions
from tempcal.metrics.decisions import rank_in_place, ranked_curve, ranked_metrics, smooth_ece


def loop_reference(conf: np.ndarray, correct: np.ndarray) -> tuple[float, float, float]:
    """The contract's sums by a plain loop, ties averaged over every order of each tie block (small blocks)."""
    n = conf.size
    values = sorted(set(conf.tolist()), reverse=True)
    orders = [[i for i in range(n) if conf[i] == v] for v in values]
    totals = np.zeros(3)
    count = 0
    for perms in itertools.product(*(itertools.permutations(block) for block in orders)):
        order = [i for block in perms for i in block]
        errors = np.cumsum([0 if correct[i] else 1 for i in order])
        ks = np.arange(1, n + 1)
        aurc = float(np.sum(errors / ks)) / n
        best = float(np.sum(np.maximum(0, ks - int(correct.sum())) / ks)) / n
        totals += [aurc, aurc - best, float(np.sum(errors)) / n / n]
        count += 1
    return tuple(totals / count)


def ranked(values: np.ndarray) -> np.ndarray:
    """A ranked float64 copy of ``values``, as the passes hand them over."""
    return rank_in_place(np.array(values, dtype=np.float64))


def by_blocks(conf: np.ndarray, correct: np.ndarray, *, right: bool = False) -> tuple[float, float, float]:
    """The figures from every row's confidence and the misclassified rows' (``right``: the correct rows')."""
    kept = conf[correct] if right else conf[~correct]
    return tuple(vars(ranked_metrics(ranked(conf), ranked(kept), right=right)).values())


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_risk_coverage_figures_match_a_loop_over_every_tie_order(seed, right):
    rng = np.random.default_rng(seed)
    n = 9
    conf = rng.choice([0.3, 0.5, 0.5, 0.7, 0.9, 0.95], size=n)  # ties of up to 4 rows
    correct = rng.random(n) < 0.6
    assert by_blocks(conf, correct, right=right) == pytest.approx(loop_reference(conf, correct), abs=1e-12)


def test_without_ties_aurc_is_the_plain_sum_and_a_perfect_ranking_has_zero_eaurc():
    rng = np.random.default_rng(7)
    conf = rng.random(5000)
    correct = rng.random(5000) < conf
    order = np.argsort(-conf)
    errors = np.cumsum(~correct[order])
    k = np.arange(1, 5001)
    aurc, eaurc, augrc = by_blocks(conf, correct)
    assert aurc == pytest.approx(np.mean(errors / k), rel=1e-12)
    assert augrc == pytest.approx(np.mean(errors) / 5000, rel=1e-12)
    perfect = np.where(correct, 1.0 + conf, conf)  # every correct row ranked first
    assert by_blocks(perfect, correct)[1] == pytest.approx(0.0, abs=1e-12)
    assert eaurc > 0


def test_all_rows_tied_is_the_error_rate_at_every_coverage():
    conf = np.full(1000, 0.8)
    correct = np.arange(1000) % 4 != 0
    aurc, _, augrc = by_blocks(conf, correct)
    assert aurc == pytest.approx(0.25, abs=1e-12)
    assert augrc == pytest.approx(0.25 * (1001 / 2) / 1000, abs=1e-12)


def test_chunks_do_not_split_a_tie_block(monkeypatch):
    rng = np.random.default_rng(3)
    conf = rng.choice(np.linspace(0.1, 1, 40), size=3000)
    correct = rng.random(3000) < 0.7
    whole = by_blocks(conf, correct)
    monkeypatch.setattr(decisions, "CHUNK", 7)
    assert by_blocks(conf, correct) == pytest.approx(whole, abs=1e-12)


def test_large_inputs_keep_the_harmonic_sums_accurate():
    rng = np.random.default_rng(11)
    n = 300_000
    conf = np.round(rng.random(n), 3)  # many ties of about 300 rows
    correct = rng.random(n) < conf
    order = np.lexsort((correct, -conf))  # any order: averaged below by blocks
    k = np.arange(1, n + 1, dtype=np.float64)
    # Expectation over tie orders, done directly: within a block, errors grow linearly from start to end.
    ranked = conf[order]
    starts = np.searchsorted(-ranked, -ranked, side="left")
    ends = np.searchsorted(-ranked, -ranked, side="right")
    err_cum = np.concatenate([[0], np.cumsum(~correct[order])])
    expected = err_cum[starts] + (k - starts) * (err_cum[ends] - err_cum[starts]) / (ends - starts)
    aurc, _, augrc = by_blocks(conf, correct)
    assert aurc == pytest.approx(np.mean(expected / k), rel=1e-10)
    assert augrc == pytest.approx(np.mean(expected) / n, rel=1e-10)


def test_risk_coverage_curve_ends_at_the_error_rate():
    rng = np.random.default_rng(5)
    conf = rng.random(500)
    correct = rng.random(500) < conf
    coverage, risk = ranked_curve(ranked(conf), ranked(conf[~correct]))
    assert coverage[-1] == 1.0 and risk[-1] == pytest.approx(1 - correct.mean())
    order = np.argsort(-conf)
    assert risk[0] == float(~correct[order[0]])
    k = np.round(coverage * 500).astype(np.int64)  # no ties: the plain error rate among the k most confident
    assert risk == pytest.approx(np.cumsum(~correct[order])[k - 1] / k, abs=1e-12)
    same = ranked_curve(ranked(conf), ranked(conf[correct]), right=True)
    assert np.array_equal(same[0], coverage) and same[1] == pytest.approx(risk, abs=1e-12)


relplot = pytest.importorskip("relplot", reason="relplot (a dev dependency) checks the smooth ECE")


@pytest.mark.parametrize("case", ["uniform", "overconfident", "tied", "small", "perfect"])
def test_smooth_ece_equals_relplot(case):
    rng = np.random.default_rng(1)
    if case == "uniform":
        conf = rng.random(4000)
        correct = rng.random(4000) < conf
    elif case == "overconfident":
        conf = 0.5 + 0.5 * rng.random(3000) ** 0.3
        correct = rng.random(3000) < conf - 0.15
    elif case == "tied":
        conf = rng.choice([0.2, 0.6, 0.9, 1.0], 2000)
        correct = rng.random(2000) < 0.7
    elif case == "small":
        conf = rng.random(20)
        correct = rng.random(20) < 0.5
    else:
        conf = rng.random(3000)
        correct = rng.random(3000) < conf
    expected = relplot.smECE(conf, correct.astype(np.float64))
    assert smooth_ece(conf, conf[~correct]) == pytest.approx(expected, abs=1e-4)


def test_smooth_ece_of_the_shipped_example_equals_relplot():
    from safetensors.numpy import load_file

    data = load_file(str(EXAMPLE))
    z = data["logits"].astype(np.float64) / 2.0
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    conf, correct = p.max(1), p.argmax(1) == data["labels"]
    assert smooth_ece(conf, conf[~correct]) == pytest.approx(relplot.smECE(conf, correct.astype(float)), abs=1e-4)
    assert not math.isnan(smooth_ece(conf, conf[~correct]))


# -- conformal sets ----------------------------------------------------------------------------------------


def set_sums(probs, labels, thresholds):
    """Per score, ``[len(thresholds), 2]`` float64 sums over the rows: (rows covered, classes in the sets)."""
    import torch

    from tempcal.conformal import sets as conformal

    return {score: torch.stack([covered.sum(1), size.sum(1)], 1).double()
            for score, (covered, size) in conformal.set_rows(probs, labels, thresholds).items()}


def direct_sets(p: np.ndarray, labels: np.ndarray, q: float, score: str) -> list[set[int]]:
    """Each row's set built one class at a time, as the contract words it."""
    sets = []
    for row in p:
        if score == "lac":
            sets.append({c for c in range(row.size) if 1 - row[c] <= q})
            continue
        order = sorted(range(row.size), key=lambda c: (-row[c], c))
        chosen, running = set(), 0.0
        for c in order:
            chosen.add(c)
            running += row[c]
            if running >= q:
                break
        sets.append(chosen)
    return sets


def direct_threshold(scores: list[float], alpha: float) -> float:
    n = len(scores)
    rank = math.ceil(round((n + 1) * (1 - alpha), 9))
    return math.inf if rank > n else sorted(scores)[rank - 1]


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2, 0.5, 0.001])
def test_conformal_sets_match_a_direct_construction(alpha):
    import torch

    from tempcal.conformal import sets as conformal

    rng = np.random.default_rng(int(alpha * 1000))
    z = rng.normal(size=(400, 6)) * 2
    z[:50, 1] = z[:50, 2]  # tied probabilities inside rows
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    labels = np.array([rng.choice(6, p=row) for row in p])
    fit, ev = slice(0, 199), slice(199, 400)
    scores = conformal.row_scores(torch.from_numpy(p[fit]), torch.from_numpy(labels[fit]))
    qs = {}
    for name in conformal.SCORES:
        if name == "lac":
            ref_scores = [1 - p[i, labels[i]] for i in range(199)]
        else:
            ref_scores = [sum(v for v in p[i] if v > p[i, labels[i]]) + p[i, labels[i]] for i in range(199)]
        np.testing.assert_allclose(scores[name].numpy(), ref_scores, atol=1e-15)
        qs[name] = conformal.thresholds(scores[name].numpy(), [alpha])[0]
        assert qs[name] == direct_threshold(ref_scores, alpha)
    sums = set_sums(torch.from_numpy(p[ev]), torch.from_numpy(labels[ev]),
                              {k: [v] for k, v in qs.items()})
    found = conformal.results([alpha], {k: [v] for k, v in qs.items()}, sums, 201)
    for result in found:
        sets = direct_sets(p[ev], labels[ev], qs[result.score], result.score)
        assert result.coverage == pytest.approx(np.mean([y in s for y, s in zip(labels[ev], sets, strict=True)]),
                                                abs=1e-15)
        assert result.mean_size == pytest.approx(np.mean([len(s) for s in sets]), abs=1e-15)
    if alpha == 0.001:  # rank (n + 1)(1 - alpha) > n: every class
        assert all(r.threshold == math.inf and r.mean_size == 6 and r.to_json()["threshold"] is None for r in found)
