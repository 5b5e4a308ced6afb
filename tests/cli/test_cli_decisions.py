"""What T does to decisions, end to end: the risk-coverage figures and smooth ECE in every metrics object of fit and
report, ``fit --conformal-alpha`` (thresholds from the fitting rows, sets on the evaluation rows, one more read of
the fitting rows and ``passes`` saying so), the sweep's best tau per figure, ``report --plot``'s risk-coverage
curves, under torchrun too; against direct float64 constructions on the shipped example and on tied data."""

from __future__ import annotations

import collections
import json
import math

import numpy as np
import pytest
import torch
from conftest import EXAMPLE, assert_one_error_line, miscalibrated, snapshot
from reference import probabilities, ref_conformal, ref_risk_coverage
from safetensors.torch import load_file, save_file
from test_cli_distributed import assert_same_figures, needs_torchrun, one_and_two_processes

import tempcal
from tempcal.output import plots
from tempcal.sources.safetensors import ShardedLogits
from tempcal.workflows.report import report_file

DECISIONS = ("aurc", "eaurc", "augrc", "smece", "risk_coverage")


def tied_file(path, n: int = 900, c: int = 6, seed: int = 0):
    """float64 logits whose rows repeat three times (tied confidences) and whose top classes tie in some rows."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n // 3, c, generator=g, dtype=torch.float64) * 3
    base[:20, 2] = base[:20].max(1).values
    z = base.repeat(3, 1)[torch.randperm(n, generator=g)]
    y = torch.multinomial(torch.softmax(z / 3, 1), 1, generator=g)[:, 0]
    save_file({"logits": z.contiguous(), "labels": y}, str(path))
    return z, y


def check_conformal(side: dict, p_fit, y_fit, p_eval, y_eval, alphas) -> None:
    assert [(c["alpha"], c["score"]) for c in side["conformal"]] == [(a, s) for a in alphas for s in ("lac", "aps")]
    for c in side["conformal"]:
        q, coverage, size = ref_conformal(p_fit, y_fit, p_eval, y_eval, c["alpha"])[c["score"]]
        assert c["threshold"] == pytest.approx(q, abs=1e-12)
        assert c["coverage"] == pytest.approx(coverage, abs=1e-12) and c["mean_size"] == pytest.approx(size, abs=1e-12)


def test_fit_on_the_example_gives_the_direct_sets_and_figures_before_and_after(run_json):
    alphas = [0.1, 0.05]
    result = run_json(["fit", str(EXAMPLE), "--no-write", "--conformal-alpha", "0.1", "--conformal-alpha", "0.05"])
    data = load_file(str(EXAMPLE))
    z, y = data["logits"], data["labels"].numpy()
    fit_index, eval_index = tempcal.stratified_split(y, 0.5, 0)
    for side, tau in (("before", 1.0), ("after", result["temperature"])):
        p = probabilities(z, tau)
        check_conformal(result[side], p[fit_index], y[fit_index], p[eval_index], y[eval_index], alphas)
        confidence, correct = p[eval_index].max(1), p[eval_index].argmax(1) == y[eval_index]
        ref = ref_risk_coverage(confidence, correct)
        assert result[side]["aurc"] == pytest.approx(ref["aurc"], abs=1e-9)
        assert result[side]["eaurc"] == pytest.approx(ref["eaurc"], abs=1e-9)
        assert result[side]["augrc"] == pytest.approx(ref["augrc"], abs=1e-9)
        curve = result[side]["risk_coverage"]
        assert curve["coverage"][-1] == 1.0 and curve["risk"][-1] == pytest.approx(1 - correct.mean())
    lac = {side: result[side]["conformal"][0] for side in ("before", "after")}
    assert lac["before"]["threshold"] != lac["after"]["threshold"]  # T moves the thresholds and the sets
    assert lac["before"]["mean_size"] != lac["after"]["mean_size"]


def test_eval_file_takes_its_thresholds_from_source_and_its_sets_from_file(tmp_path, run_json):
    z, y = tied_file(tmp_path / "fit.safetensors")
    z_eval, y_eval = tied_file(tmp_path / "eval.safetensors", n=600, seed=1)
    result = run_json(["fit", str(tmp_path / "fit.safetensors"), "--eval", str(tmp_path / "eval.safetensors"),
                       "--no-write", "--conformal-alpha", "0.2"])
    for side, tau in (("before", 1.0), ("after", result["temperature"])):
        check_conformal(result[side], probabilities(z, tau), y.numpy(), probabilities(z_eval, tau), y_eval.numpy(),
                        [0.2])
        p = probabilities(z_eval, tau)
        ref = ref_risk_coverage(p.max(1), p.argmax(1) == y_eval.numpy())
        assert result[side]["aurc"] == pytest.approx(ref["aurc"], abs=1e-9)


@pytest.fixture
def counted(monkeypatch):
    """Per file: the chunk reads started and the rows they yielded."""
    reads: collections.Counter[str] = collections.Counter()
    rows: collections.Counter[str] = collections.Counter()
    plain = ShardedLogits.chunks

    def chunks(self, *args, **kwargs):
        name = self.shards[0].header.path.name
        reads[name] += 1
        for item in plain(self, *args, **kwargs):
            rows[name] += item[1].shape[0]
            yield item

    monkeypatch.setattr(ShardedLogits, "chunks", chunks)
    return reads, rows


def test_conformal_sets_cost_one_read_of_the_fitting_rows_and_passes_says_so(tmp_path, run_json, counted,
                                                                          monkeypatch):
    monkeypatch.setenv("TEMPCAL_RESIDENT_BYTES", "0")  # streamed: every pass reads the file again
    logits, labels = miscalibrated(6000, 30, 2.2, seed=3)
    path = tmp_path / "logits.safetensors"
    save_file({"logits": logits, "labels": labels}, str(path))
    reads, rows = counted
    plain = run_json(["fit", str(path), "--no-write", "--chunk-rows", "500"])
    plain_reads, plain_rows = reads[path.name], rows[path.name]
    reads.clear()
    rows.clear()
    with_sets = run_json(["fit", str(path), "--no-write", "--chunk-rows", "500", "--conformal-alpha", "0.1"])
    assert reads[path.name] == plain_reads + 1 and rows[path.name] == plain_rows + with_sets["n_fit"]
    assert with_sets["passes"] == plain["passes"] + 1
    assert with_sets["temperature"] == plain["temperature"]
    for side in ("before", "after"):  # the decision figures came with the metrics pass, at no read of their own
        assert all(not isinstance(plain[side][key], float) or math.isfinite(plain[side][key]) for key in DECISIONS)
        assert "conformal" not in plain[side] and len(with_sets[side]["conformal"]) == 2


@pytest.mark.parametrize("alpha", ["0", "1", "-0.1", "1.5", "nan", "x"])
def test_a_conformal_alpha_outside_zero_one_is_refused_before_any_work(tmp_path, cli, alpha):
    path = tmp_path / "logits.safetensors"
    save_file(load_file(str(EXAMPLE)), str(path))
    before = snapshot(tmp_path)
    code, out, err = cli(["fit", str(path), "--conformal-alpha", alpha, "--json", str(tmp_path / "out.json")])
    assert code == 2 and out == ""
    assert_one_error_line(err, "--conformal-alpha")
    assert snapshot(tmp_path) == before  # nothing written: no T, no JSON


def test_conformal_alpha_from_a_configuration_file(tmp_path, cli, monkeypatch):
    path = tmp_path / "logits.safetensors"
    save_file(load_file(str(EXAMPLE)), str(path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tempcal.toml").write_text("[fit]\nconformal-alpha = [0.1, 0.2]\nno-write = true\n")
    code, out, err = cli(["fit", str(path), "--json", "-"])
    assert code == 0, err
    assert [c["alpha"] for c in json.loads(out)["after"]["conformal"]] == [0.1, 0.1, 0.2, 0.2]
    (tmp_path / "tempcal.toml").write_text("[fit]\nconformal-alpha = [0.1, 2]\nno-write = true\n")
    code, _, err = cli(["fit", str(path), "--json", "-"])
    assert code == 2 and "conformal" in assert_one_error_line(err)


def test_report_rows_and_the_sweep_name_the_best_tau_of_each_figure(tmp_path, run_json, cli):
    z, y = tied_file(tmp_path / "tied.safetensors")
    result = run_json(["report", str(tmp_path / "tied.safetensors"), "--sweep", "0.3:8:9"])
    rows = result["results"]
    for row in rows:
        p = probabilities(z, row["tau"])
        ref = ref_risk_coverage(p.max(1), p.argmax(1) == y.numpy())
        assert (row["aurc"], row["eaurc"], row["augrc"]) == pytest.approx(tuple(ref.values()), abs=1e-9)
        assert 50 <= len(row["risk_coverage"]["coverage"]) <= 100 and 0 <= row["smece"] <= 1
    sweep = result["sweep"]
    for figure in ("nll", "ece", "smece", "aurc"):
        assert sweep[f"best_{figure}_tau"] == min(rows, key=lambda r: r[figure])["tau"]
    code, out, _ = cli(["report", str(tmp_path / "tied.safetensors"), "--sweep", "0.3:8:9"])
    assert code == 0
    assert "AURC" in out and "smooth ECE" in out
    best = next(line for line in out.splitlines() if line.startswith("best tau over the sweep"))
    assert f"AURC {sweep['best_aurc_tau']:.4g}" in best and f"smooth ECE {sweep['best_smece_tau']:.4g}" in best


def test_the_sweep_sentence_says_a_stored_t_beside_it_is_not_one_of_its_points(tmp_path, run_json, cli):
    path = tmp_path / "fitted.safetensors"
    save_file(load_file(str(EXAMPLE)), str(path))
    stored = run_json(["fit", str(path), "--val-fraction", "1"])["temperature"]
    result = run_json(["report", str(path), "--sweep", "1:10:5"])
    taus = result["sweep"]["taus"]
    assert not any(math.isclose(stored, t) for t in taus)  # the stored T is a row, not a point of the sweep
    code, out, _ = cli(["report", str(path), "--sweep", "1:10:5"])
    best = next(line for line in out.splitlines() if line.startswith("best tau over the sweep"))
    assert code == 0 and f"NLL {result['sweep']['best_nll_tau']:.4g}" in best
    assert f"its {len(taus)} points; tau {stored:.4g} is not one" in best


def test_report_plot_draws_a_risk_coverage_curve_per_tau(tmp_path):
    tied_file(tmp_path / "tied.safetensors")
    result = report_file(str(tmp_path / "tied.safetensors"), taus=[0.5, 1, 4], device="cpu")
    figure = plots.reliability_figure([(f"tau = {m.tau:.4g}", m) for m in result.results], risk_coverage=True)
    [ax] = [ax for ax in figure.axes if ax.get_ylabel() == "risk (error rate)"]
    assert len(ax.lines) == 3
    for line, m in zip(ax.lines, result.results, strict=True):
        assert list(line.get_xdata()) == m.risk_coverage["coverage"]
        assert list(line.get_ydata()) == m.risk_coverage["risk"]
        assert f"AURC {m.aurc:.4f}" in line.get_label()
    sweep = report_file(str(tmp_path / "tied.safetensors"), sweep=plots.log_spaced(0.3, 8, 14), device="cpu")
    figure = plots.sweep_figure([m.to_dict() for m in sweep.results], {})
    [ax] = [ax for ax in figure.axes if ax.get_ylabel() == "risk (error rate)"]
    assert len(ax.lines) == 14  # more than are named: shaded by tau, with a colour bar
    assert {a.get_ylabel() for a in figure.axes} >= {"NLL", "ECE", "smooth ECE", "AURC", "tau"}


def test_the_bootstrap_brackets_the_risk_coverage_figures(tmp_path, run_json):
    result = run_json(["fit", str(EXAMPLE), "--no-write", "--bootstrap", "200"])
    for side in ("before", "after"):
        for figure in ("aurc", "eaurc", "augrc"):
            low, high = result[side][f"{figure}_ci"]
            assert low < result[side][figure] < high


@needs_torchrun
def test_conformal_sets_and_decision_figures_under_two_processes_match_one(tmp_path):
    from conftest import write_shards

    write_shards(tmp_path, [900, 650, 1100, 300], seed=9, dtype=torch.float32)
    one, two = one_and_two_processes(tmp_path, ["fit", str(tmp_path / "part-*.safetensors"), "--no-write",
                                                "--val-fraction", "0.6", "--conformal-alpha", "0.1",
                                                "--conformal-alpha", "0.3"])
    assert_same_figures(one, two)
    assert all(key in two["after"] for key in (*DECISIONS, "conformal"))
    assert np.isfinite(two["after"]["aurc"]) and len(two["after"]["conformal"]) == 4


# -- groups and folds -------------------------------------------------------------------------------------------


def grouped_file(path, n: int = 1200, groups: int = 4):
    """Tied logits (rows repeat) with an integer ``group`` per row; the groups' scales differ."""
    g = torch.Generator().manual_seed(12)
    base = torch.randn(n // 3, 5, generator=g, dtype=torch.float64)
    z = base.repeat(3, 1)
    group = torch.arange(n) % groups
    z = z * (1.5 + group[:, None].double())
    y = torch.multinomial(torch.softmax(z / 2.5, 1), 1, generator=g)[:, 0]
    save_file({"logits": z.contiguous(), "labels": y, "group": group}, str(path))
    return z, y, group.numpy()


def assert_reference(block: dict, p: np.ndarray, y: np.ndarray) -> None:
    ref = ref_risk_coverage(p.max(1), p.argmax(1) == y)
    assert (block["aurc"], block["eaurc"], block["augrc"]) == pytest.approx(tuple(ref.values()), abs=1e-9)


def test_each_group_of_a_fit_and_a_report_has_its_own_rows_figures(tmp_path, run_json):
    z, y, group = grouped_file(tmp_path / "grouped.safetensors")
    fitted = run_json(["fit", str(tmp_path / "grouped.safetensors"), "--group-by", "group", "--val-fraction", "1.0",
                       "--no-write"])
    y = y.numpy()
    for g in fitted["groups"]:
        rows = group == int(g["group"])
        for side, tau in (("before", 1.0), ("after", g["temperature"]), ("after_global", fitted["temperature"])):
            assert_reference(g[side], probabilities(z[rows], tau), y[rows])
            assert 0 <= g[side]["smece"] <= 1 and "risk_coverage" not in g[side]
    assert_reference(fitted["after"], probabilities(z, fitted["temperature"]), y)
    report = run_json(["report", str(tmp_path / "grouped.safetensors"), "--group-by", "group", "--tau", "2"])
    [row] = report["results"]
    assert_reference(row, probabilities(z, 2.0), y)
    for g in row["groups"]:
        rows = group == int(g["group"])
        assert_reference(g, probabilities(z[rows], 2.0), y[rows])


def test_out_of_fold_figures_take_each_row_at_its_folds_t(tmp_path, run_json):
    from tempcal.subsets.cells import assign_folds

    z, y, _ = grouped_file(tmp_path / "grouped.safetensors")
    result = run_json(["fit", str(tmp_path / "grouped.safetensors"), "--folds", "4", "--no-write"])
    folds = assign_folds(y.numpy(), 4, 0)
    temperatures = np.asarray(result["folds"]["temperatures"])[folds]
    p = probabilities(z / torch.from_numpy(temperatures)[:, None], 1.0)
    assert_reference(result["after"], p, y.numpy())
    assert_reference(result["before"], probabilities(z, 1.0), y.numpy())
    assert len(result["after"]["risk_coverage"]["coverage"]) == 100


def test_many_groups_leave_out_their_own_decision_figures_not_the_global_ones(tmp_path, run_json, monkeypatch):
    import tempcal.metrics.decisions as decisions

    grouped_file(tmp_path / "grouped.safetensors")
    monkeypatch.setattr(decisions, "MAX_GROUPS", 3)  # four groups: one too many
    result = run_json(["fit", str(tmp_path / "grouped.safetensors"), "--group-by", "group", "--no-write"])
    assert all(g["after"]["aurc"] is None and g["after"]["smece"] is None for g in result["groups"])
    assert result["after"]["aurc"] is not None and result["after"]["smece"] is not None


def test_group_by_gives_every_groups_coverage_under_the_global_sets(tmp_path, run_json):
    """The thresholds are the global ones (fitting rows, T = 1 and the global T); each group's coverage and set
    size are those sets on its evaluation rows: a direct construction per group, and two more reads."""
    z, y, group = grouped_file(tmp_path / "grouped.safetensors", n=1500, groups=3)
    path = str(tmp_path / "grouped.safetensors")
    plain = run_json(["fit", path, "--group-by", "group", "--no-write"])
    result = run_json(["fit", path, "--group-by", "group", "--no-write", "--conformal-alpha", "0.1"])
    assert result["passes"] == plain["passes"] + 2 and result["temperature"] == plain["temperature"]
    fit_index, eval_index = tempcal.stratified_split(y.numpy(), 0.5, 0)
    y = y.numpy()
    for side, block, tau in (("before", "before", 1.0), ("after", "after_global", result["temperature"])):
        p = probabilities(z, tau)
        check_conformal(result[side], p[fit_index], y[fit_index], p[eval_index], y[eval_index], [0.1])
        coverages = []
        for g in result["groups"]:
            rows = eval_index[group[eval_index] == int(g["group"])]
            check_conformal(g[block], p[fit_index], y[fit_index], p[rows], y[rows], [0.1])
            coverages.append(g[block]["conformal"][0]["coverage"])
        assert len(set(coverages)) > 1  # the groups differ: what the per-group figure is for
        assert [c["threshold"] for c in g[block]["conformal"]] == [c["threshold"] for c in result[side]["conformal"]]


@needs_torchrun
@pytest.mark.slow  # the default run: test_cli_decisions_folds.test_folds_groups_and_sets_under_two_processes_match_one
def test_group_sets_under_two_processes_match_one(tmp_path):
    grouped_file(tmp_path / "grouped.safetensors", n=1500, groups=3)
    one, two = one_and_two_processes(tmp_path, ["fit", str(tmp_path / "grouped.safetensors"), "--group-by", "group",
                                                "--no-write", "--conformal-alpha", "0.2"])
    assert_same_figures(one, two)
    assert all("conformal" in g["after_global"] and g["after"]["aurc"] is not None for g in two["groups"])
