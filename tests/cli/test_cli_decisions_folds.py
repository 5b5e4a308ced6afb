"""``fit --folds K --conformal-alpha A``: each fold's thresholds from the other folds' rows (T = 1 for ``before``, T_k
for ``after``), each row's sets from its fold's, coverage and mean size over all N rows; the deployed thresholds from
every row; per-group coverage with ``--group-by``; two more reads (more past the score budget); torchrun, ``--head``,
streamed files, ``--objective ece``. Against a float64 construction one row at a time, fold Ts checked by scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import EXAMPLE, assert_one_error_line, hidden_and_head, snapshot
from reference import optimal_temperature, probabilities, ref_conformal_scores, ref_conformal_sets, ref_threshold
from safetensors.torch import load_file, save_file
from subsets_reference import penalised_temperature
from test_cli_decisions import counted, grouped_file, tied_file  # noqa: F401 (counted: a fixture)
from test_cli_distributed import assert_same_figures, needs_torchrun, one_and_two_processes

from tempcal.conformal import passes
from tempcal.subsets.cells import assign_folds

SCORES = ("lac", "aps")


def ref_fold_sets(z, y: np.ndarray, folds: np.ndarray, fold_ts, global_t: float, alpha: float) -> dict:
    """Per (side, score): the deployed threshold (every row at T = 1 or the deployed T), each fold's (the rows outside
    it, at T = 1 or T_k), and every row's coverage and set size from its fold's threshold at its fold's T."""
    n, p1 = y.size, probabilities(z, 1.0)
    at_one = ref_conformal_scores(p1, y)
    out = {}
    for side, deployed_t in (("before", 1.0), ("after", global_t)):
        deployed = ref_conformal_scores(probabilities(z, deployed_t), y)
        found = {s: {"threshold": ref_threshold(deployed[s], alpha), "fold_thresholds": [],
                     "covered": np.zeros(n, bool), "size": np.zeros(n)} for s in SCORES}
        for f, t in enumerate(fold_ts):
            p = p1 if side == "before" else probabilities(z, t)
            scores = at_one if side == "before" else ref_conformal_scores(p, y)
            inside = np.flatnonzero(folds == f)
            for s in SCORES:
                q = ref_threshold([v for v, k in zip(scores[s], folds, strict=True) if k != f], alpha)
                found[s]["fold_thresholds"].append(q)
                for i, chosen in zip(inside, ref_conformal_sets(p[inside], q, s), strict=True):
                    found[s]["covered"][i], found[s]["size"][i] = y[i] in chosen, len(chosen)
        out.update({(side, s): found[s] for s in SCORES})
    return out


def _json(q: float) -> float | None:
    return None if math.isinf(q) else q


def check_entries(entries: list[dict], refs: dict[float, dict], side: str, rows=slice(None), folds: bool = True):
    """The JSON's conformal list of one block against the reference on ``rows``."""
    assert [(c["alpha"], c["score"]) for c in entries] == [(a, s) for a in refs for s in SCORES]
    for c in entries:
        ref = refs[c["alpha"]][side, c["score"]]
        assert c["threshold"] == pytest.approx(_json(ref["threshold"]), abs=1e-12)
        if folds:
            assert c["fold_thresholds"] == pytest.approx([_json(q) for q in ref["fold_thresholds"]], abs=1e-12)
        else:
            assert "fold_thresholds" not in c
        assert c["coverage"] == pytest.approx(ref["covered"][rows].mean(), abs=1e-12)
        assert c["mean_size"] == pytest.approx(ref["size"][rows].mean(), abs=1e-12)


def references(result: dict, z, y: np.ndarray, folds: np.ndarray, alphas) -> dict[float, dict]:
    assert result["folds"]["sizes"] == np.bincount(folds, minlength=len(result["folds"]["temperatures"])).tolist()
    return {a: ref_fold_sets(z, y, folds, result["folds"]["temperatures"], result["temperature"], a) for a in alphas}


def test_five_folds_on_the_example_match_a_direct_construction_per_fold(run_json):
    alphas = [0.1, 0.05]
    result = run_json(["fit", str(EXAMPLE), "--folds", "5", "--no-write", "--conformal-alpha", "0.1",
                       "--conformal-alpha", "0.05"])
    data = load_file(str(EXAMPLE))
    z, y = data["logits"], data["labels"].numpy()
    folds = assign_folds(y, 5, 0)
    assert result["temperature"] == pytest.approx(optimal_temperature(z, y), rel=1e-6)
    for f, t in enumerate(result["folds"]["temperatures"]):
        assert t == pytest.approx(penalised_temperature(z[folds != f], y[folds != f]), rel=1e-6)
    refs = references(result, z, y, folds, alphas)
    for side in ("before", "after"):
        check_entries(result[side]["conformal"], refs, side)
        lac = result[side]["conformal"][0]
        assert len(set(lac["fold_thresholds"])) == 5  # each fold's own rows left out
    assert result["before"]["conformal"][0]["threshold"] != result["after"]["conformal"][0]["threshold"]


def test_leave_one_out_on_tied_rows(tmp_path, run_json):
    """K = N: row i is fold i (the contract), its thresholds from the other N - 1 rows; rows repeat three times, so
    a row's twins sit at the thresholds."""
    z, y = tied_file(tmp_path / "tied.safetensors", n=300)
    path = str(tmp_path / "tied.safetensors")
    plain = run_json(["fit", path, "--folds", "300", "--no-write"])
    result = run_json(["fit", path, "--folds", "300", "--no-write", "--conformal-alpha", "0.1",
                       "--conformal-alpha", "0.3"])
    assert result["passes"] == plain["passes"] + 2 and result["folds"] == plain["folds"]
    refs = references(result, z, y.numpy(), np.arange(300), [0.1, 0.3])
    for side in ("before", "after"):
        check_entries(result[side]["conformal"], refs, side)
        assert len(result[side]["conformal"][0]["fold_thresholds"]) == 300


@pytest.fixture
def streamed(monkeypatch):
    monkeypatch.setenv("TEMPCAL_RESIDENT_BYTES", "0")  # every pass reads the file again


def test_two_more_reads_of_every_row_and_passes_says_so(tmp_path, run_json, counted, streamed):  # noqa: F811
    grouped_file(tmp_path / "grouped.safetensors", n=900)
    path = tmp_path / "grouped.safetensors"
    reads, rows = counted
    for extra in ([], ["--group-by", "group"]):
        argv = ["fit", str(path), "--folds", "4", "--no-write", "--chunk-rows", "100", *extra]
        reads.clear(), rows.clear()
        plain = run_json(argv)
        plain_reads, plain_rows = reads[path.name], rows[path.name]
        reads.clear(), rows.clear()
        result = run_json([*argv, "--conformal-alpha", "0.2"])
        assert reads[path.name] == plain_reads + 2 and rows[path.name] == plain_rows + 2 * 900
        assert result["passes"] == plain["passes"] + 2 and result["temperature"] == plain["temperature"]
        assert "conformal" not in plain["after"] and len(result["after"]["conformal"]) == 2


def test_past_the_score_budget_the_folds_take_more_reads_and_give_the_same_sets(tmp_path, run_json, counted,  # noqa: F811
                                                                                 streamed, monkeypatch):
    tied_file(tmp_path / "tied.safetensors", n=600)
    path = tmp_path / "tied.safetensors"
    argv = ["fit", str(path), "--folds", "5", "--no-write", "--conformal-alpha", "0.1"]
    reads, _ = counted
    whole = run_json(argv)
    one_read = reads[path.name]
    reads.clear()
    monkeypatch.setattr(passes, "SCORE_BYTES", 16 * 600 * 3)  # three temperatures a read: 7 in 3 reads
    held = []

    class Recorded(passes.ScoreRows):
        def __init__(self, count, rows, device):
            super().__init__(count, rows, device)
            held.append(self.scores.numel() * self.scores.element_size())

    monkeypatch.setattr(passes, "ScoreRows", Recorded)
    batched = run_json(argv)
    assert reads[path.name] == one_read + 2 and batched["passes"] == whole["passes"] + 2
    assert held == [16 * 600 * 3, 16 * 600 * 3, 16 * 600]  # never more scores than the budget at once
    assert batched["before"]["conformal"] == whole["before"]["conformal"]
    assert batched["after"]["conformal"] == whole["after"]["conformal"]


def test_folds_and_groups_give_each_groups_coverage_out_of_fold(tmp_path, run_json):
    z, y, group = grouped_file(tmp_path / "grouped.safetensors", n=1500, groups=3)
    result = run_json(["fit", str(tmp_path / "grouped.safetensors"), "--folds", "4", "--group-by", "group",
                       "--no-write", "--conformal-alpha", "0.1"])
    y = y.numpy()
    refs = references(result, z, y, assign_folds(y, 4, 0), [0.1])
    for side, block in (("before", "before"), ("after", "after_global")):
        check_entries(result[side]["conformal"], refs, side)
        coverages = []
        for g in result["groups"]:
            rows = group == int(g["group"])
            check_entries(g[block]["conformal"], refs, side, rows, folds=False)
            coverages.append(g[block]["conformal"][0]["coverage"])
            assert "conformal" not in g["after"]  # the sets are the global ones: not at the group's own T
        assert len(set(coverages)) > 1  # the groups differ: what the per-group figure is for
        weighted = sum(g["n_eval"] * g[block]["conformal"][0]["coverage"] for g in result["groups"]) / 1500
        assert weighted == pytest.approx(result[side]["conformal"][0]["coverage"], abs=1e-12)


@pytest.mark.slow  # the ECE fits with folds take tens of passes (10-30 s here)
def test_the_ece_objective_takes_each_folds_ece_temperature(tmp_path, run_json):
    z, y = tied_file(tmp_path / "tied.safetensors", n=300)
    result = run_json(["fit", str(tmp_path / "tied.safetensors"), "--folds", "3", "--objective", "ece", "--no-write",
                       "--conformal-alpha", "0.2"])
    nll = run_json(["fit", str(tmp_path / "tied.safetensors"), "--folds", "3", "--no-write"])
    assert result["objective"] == "ece" and result["folds"]["temperatures"] != nll["folds"]["temperatures"]
    refs = references(result, z, y.numpy(), assign_folds(y.numpy(), 3, 0), [0.2])
    for side in ("before", "after"):
        check_entries(result[side]["conformal"], refs, side)


def test_hidden_states_and_a_head_give_the_materialised_logits_sets(tmp_path, run_json):
    h, w, b, y = hidden_and_head(480, 16, 40, seed=3)
    save_file({"hidden": h, "labels": y}, str(tmp_path / "hidden.safetensors"))
    save_file({"weight": w, "bias": b}, str(tmp_path / "head.safetensors"))
    argv = ["--folds", "4", "--no-write", "--conformal-alpha", "0.1"]
    head = run_json(["fit", str(tmp_path / "hidden.safetensors"), "--head", str(tmp_path / "head.safetensors"), *argv])
    z = (h.double() @ w.double().T + b.double())
    refs = references(head, z, y.numpy(), assign_folds(y.numpy(), 4, 0), [0.1])
    for side in ("before", "after"):
        entries = head[side]["conformal"]
        for c in entries:  # h W^T in float32 against float64: the thresholds to float32's rounding
            ref = refs[0.1][side, c["score"]]
            assert c["threshold"] == pytest.approx(ref["threshold"], abs=1e-5)
            assert c["fold_thresholds"] == pytest.approx(ref["fold_thresholds"], abs=1e-5)
            assert c["coverage"] == pytest.approx(ref["covered"].mean(), abs=2 / 480)
            assert c["mean_size"] == pytest.approx(ref["size"].mean(), abs=2 / 480)


@pytest.mark.parametrize("argv", [
    ["--folds", "1"],  # K below 2
    ["--folds", "5000"],  # more folds than rows
    ["--folds", "3", "--conformal-alpha", "1.5"],  # a miscoverage level outside (0, 1)
    ["--folds", "3", "--val-fraction", "0.5"],
    ["--folds", "3", "--eval", "{path}"],
])
def test_bad_input_with_folds_and_sets_is_refused_with_nothing_written(tmp_path, cli, argv):
    tied_file(tmp_path / "tied.safetensors", n=300)
    path = str(tmp_path / "tied.safetensors")
    before = snapshot(tmp_path)
    code, out, err = cli(["fit", path, "--conformal-alpha", "0.1", *(a.replace("{path}", path) for a in argv),
                          "--json", str(tmp_path / "out.json")])
    assert code == 2 and out == "", err
    assert_one_error_line(err)
    assert snapshot(tmp_path) == before  # no T written back, no JSON


@needs_torchrun
@pytest.mark.parametrize("objective", ["nll", pytest.param("ece", marks=pytest.mark.slow)])
def test_folds_groups_and_sets_under_two_processes_match_one(tmp_path, monkeypatch, objective):
    monkeypatch.setenv("TEMPCAL_RESIDENT_BYTES", "0")  # streamed, each rank its share of the file
    grouped_file(tmp_path / "grouped.safetensors", n=1500, groups=3)
    one, two = one_and_two_processes(tmp_path, ["fit", str(tmp_path / "grouped.safetensors"), "--folds", "4",
                                                "--group-by", "group", "--objective", objective, "--no-write",
                                                "--chunk-rows", "128", "--conformal-alpha", "0.2",
                                                "--conformal-alpha", "0.05"])
    if objective == "ece":  # the ECE fits' own passes differ by one under torchrun (80 vs 81), with or without sets
        assert abs(one.pop("passes") - two.pop("passes")) <= 1
    assert_same_figures(one, two)
    assert len(two["after"]["conformal"][0]["fold_thresholds"]) == 4
    assert all("conformal" in g["after_global"] and "conformal" in g["before"] for g in two["groups"])

