"""Out-of-fold conformal pieces: thresholds at many alphas from one partition, the sets summed fold by fold (each fold's
rows at its own temperature and thresholds, per group), the JSON of fold thresholds, and the score reads' batches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import DEVICES, miscalibrated
from reference import ref_conformal_scores, ref_conformal_sets, ref_threshold

from tempcal import Scan, as_logits_data
from tempcal.conformal import commands as fold_conformal
from tempcal.conformal import passes
from tempcal.conformal.passes import FoldSetSums
from tempcal.conformal.passes import probabilities as chunk_probabilities
from tempcal.conformal.sets import ConformalResult, thresholds


@pytest.mark.parametrize("n", [0, 1, 2, 9, 10, 11, 99, 500])
def test_thresholds_at_many_alphas_are_each_the_ranked_score(n):
    rng = np.random.default_rng(n)
    scores = np.round(rng.random(n), 1)  # heavily tied
    alphas = [0.01, 0.05, 0.1, 0.3, 0.5, 0.9, 0.99]
    found = thresholds(scores, alphas)
    assert found == [ref_threshold(list(scores), a) for a in alphas]
    assert n > 20 or math.inf in found  # a small n leaves the strictest levels at +inf
    assert np.array_equal(scores, np.round(np.random.default_rng(n).random(n), 1))  # the input is not reordered


def test_fold_set_sums_take_each_row_at_its_folds_temperature_and_thresholds():
    z, y = miscalibrated(420, 6, 2.0, seed=4, dtype=torch.float64)
    z[::7] = z[1::7][: z[::7].shape[0]]  # repeated rows: scores tied across folds
    folds = torch.from_numpy(np.random.default_rng(1).integers(0, 3, 420))
    groups = torch.arange(420) % 4
    betas = [[1.0, 1.0, 1.0], [1 / 1.6, 1 / 2.1, 1 / 2.4]]
    qs = [[{"lac": [0.3 + 0.1 * f + 0.2 * slot, 0.6], "aps": [0.8, 0.9 + 0.01 * f]} for f in range(3)]
          for slot in range(2)]
    sets = FoldSetSums(betas, qs, folds, torch.device("cpu"), groups=groups, num_groups=4)
    scan = Scan(as_logits_data(z, y), device="cpu", chunk_rows=53)  # folds and groups straddle chunks
    passes = scan.passes
    scan.visit([1.0, 1.0], sets)
    sums = sets.reduced()
    assert scan.passes == passes + 1 and sums["lac"].shape == (2, 4, 2, 2)
    for score in ("lac", "aps"):
        expected = torch.zeros(2, 4, 2, 2, dtype=torch.float64)
        for slot in range(2):
            for f in range(3):
                p = chunk_probabilities(z - z.max(1, keepdim=True).values, betas[slot][f]).numpy()
                for g in range(4):
                    rows = ((folds == f) & (groups == g)).numpy()
                    for a, q in enumerate(qs[slot][f][score]):
                        chosen = ref_conformal_sets(p[rows], q, score)
                        expected[slot, g, a, 0] += sum(int(c) in s for c, s in zip(y[rows], chosen, strict=True))
                        expected[slot, g, a, 1] += sum(len(s) for s in chosen)
        torch.testing.assert_close(sums[score], expected, rtol=0, atol=1e-9)
    assert sums["lac"][:, :, :, 0].sum() < 2 * 420 * 2  # not every set covers: the thresholds matter
    assert not torch.equal(sums["lac"][0], sums["lac"][1])  # the slots differ: each its own temperatures


@pytest.mark.parametrize("device", DEVICES)
def test_fold_thresholds_and_sets_on_any_device_are_the_cpus(device):
    z, y = miscalibrated(500, 7, 2.0, seed=8, dtype=torch.float64)
    folds = np.arange(500) % 4
    found = {}
    for where in ("cpu", device):
        scan = Scan(as_logits_data(z, y), device=where, chunk_rows=97)
        q = fold_conformal.fold_thresholds(scan, folds, 1.9, [1.7, 1.8, 2.0, 2.2], [0.1, 0.2])
        sets = FoldSetSums([[1.0] * 4, [1 / 1.7, 1 / 1.8, 1 / 2.0, 1 / 2.2]], [q.before, q.after],
                           torch.from_numpy(folds), scan.device)
        scan.visit([1.0, 1.0], sets)
        found[where] = q, sets.reduced()
    (q_cpu, sums_cpu), (q_there, sums_there) = found["cpu"], found[device]
    def flat(q):
        return [v for per in (q.deployed, q.before, q.after) for t in per for score in ("lac", "aps") for v in t[score]]

    assert len(flat(q_cpu)) == (2 + 4 + 4) * 2 * 2 and flat(q_there) == pytest.approx(flat(q_cpu), abs=1e-12)
    for score in ("lac", "aps"):
        torch.testing.assert_close(sums_there[score], sums_cpu[score], rtol=0, atol=1e-9)


def test_scores_at_t_come_from_the_softmax_there():
    z, y = miscalibrated(50, 4, 1.5, seed=2, dtype=torch.float64)
    p = chunk_probabilities(z - z.max(1, keepdim=True).values, 1 / 1.5).numpy()
    ref = ref_conformal_scores(p, y.numpy())
    assert ref["lac"] == pytest.approx(list(1 - p[np.arange(50), y.numpy()]), abs=1e-15)


def test_fold_thresholds_in_json_write_infinity_as_null_and_are_absent_without_folds():
    plain = ConformalResult(alpha=0.1, score="lac", threshold=math.inf, coverage=1.0, mean_size=3.0)
    assert plain.to_json() == {"alpha": 0.1, "score": "lac", "threshold": None, "coverage": 1.0, "mean_size": 3.0}
    folded = ConformalResult(0.1, "aps", 0.5, 0.9, 1.2, fold_thresholds=(0.4, math.inf, 0.6))
    assert folded.to_json()["fold_thresholds"] == [0.4, None, 0.6] and folded.to_json()["threshold"] == 0.5


@pytest.mark.parametrize(("rows", "k", "budget", "reads"), [
    (300, 300, 1 << 28, 1),  # leave-one-out on a small file: one read
    (1000, 5, 16 * 1000 * 7, 1),  # K + 2 = 7 temperatures fit exactly
    (1000, 5, 16 * 1000 * 7 - 1, 2),  # one byte short: six, then one
    (1000, 5, 16 * 1000 * 3, 3),  # three a read
    (10 ** 9, 10, 1 << 28, 6),  # never fewer than two temperatures a read
])
def test_score_reads_take_the_temperatures_in_batches_past_the_budget(monkeypatch, rows, k, budget, reads):
    monkeypatch.setattr(passes, "SCORE_BYTES", budget)
    assert passes.score_reads(rows, k + 2) == reads  # T = 1, the deployed T and K fold temperatures
    per_read = passes.temperatures_per_read(rows)
    assert per_read >= 2 and (per_read == 2 or per_read * 16 * rows <= budget)
