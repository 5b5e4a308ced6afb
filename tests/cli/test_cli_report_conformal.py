"""``report --conformal-alpha A``: LAC and APS sets at every tau, so a sweep shows how T moves the mean set size.

Thresholds from the stored split's fitting rows (else a seeded half of SOURCE), coverage and size on the other rows;
checked against a direct float64 construction per tau (tied rows included), against ``fit``'s own figures at tau 1
and at the stored T, per group, under torchrun, and on bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import EXAMPLE, assert_one_error_line
from reference import probabilities, ref_conformal, ref_conformal_sets
from safetensors.torch import load_file, save_file
from test_cli_decisions import grouped_file, tied_file
from test_cli_distributed import assert_same_figures, needs_torchrun, one_and_two_processes

import tempcal

ALPHAS = [0.1, 0.05]


def check_sets(row: dict, z, y: np.ndarray, calibration: np.ndarray, evaluation: np.ndarray, alphas,
               p: np.ndarray | None = None) -> None:
    """``row``'s conformal entries against the direct construction at its tau (or from the probabilities ``p``).
    Rows that repeat can hold a score equal to the threshold up to the last bit, where two float64 softmaxes may
    disagree: the figures must lie between the direct sets at q - 1e-12 and at q + 1e-12 (sets only grow with q),
    which is equality elsewhere."""
    p = probabilities(z, row["tau"]) if p is None else p
    assert [(c["alpha"], c["score"]) for c in row["conformal"]] == [(a, s) for a in alphas for s in ("lac", "aps")]
    for c in row["conformal"]:
        q, _, _ = ref_conformal(p[calibration], y[calibration], p[evaluation], y[evaluation], c["alpha"])[c["score"]]
        assert (c["threshold"] if c["threshold"] is not None else np.inf) == pytest.approx(q, abs=1e-12)
        ends = []
        for edge in (q - 1e-12, q + 1e-12):
            sets = ref_conformal_sets(p[evaluation], edge, c["score"])
            ends.append((np.mean([label in found for label, found in zip(y[evaluation], sets, strict=True)]),
                         np.mean([len(found) for found in sets])))
        assert ends[0][0] - 1e-12 <= c["coverage"] <= ends[1][0] + 1e-12
        assert ends[0][1] - 1e-12 <= c["mean_size"] <= ends[1][1] + 1e-12


def alpha_args(alphas) -> list[str]:
    return [arg for a in alphas for arg in ("--conformal-alpha", str(a))]


def test_without_a_stored_split_a_seeded_half_sets_the_thresholds_at_every_tau(tmp_path, run_json):
    z, y = tied_file(tmp_path / "tied.safetensors")
    y = y.numpy()
    for seed in (0, 3):
        result = run_json(["report", str(tmp_path / "tied.safetensors"), "--sweep", "0.3:6:7", "--tau", "1",
                           "--seed", str(seed), *alpha_args(ALPHAS)])
        calibration, evaluation = tempcal.stratified_split(y, 0.5, seed)
        assert result["conformal_rows"] == {"calibration": calibration.size, "evaluation": evaluation.size,
                                            "split": "seeded", "seed": seed}
        assert result["conformal_reads"] == 1
        for row in result["results"]:
            check_sets(row, z, y, calibration, evaluation, ALPHAS)
        sweep = [r for r in result["results"] if r["tau"] in result["sweep"]["taus"]]
        for k, best in enumerate(result["sweep"]["best_set_size_tau"]):
            sizes = [r["conformal"][k]["mean_size"] for r in sweep]
            assert best["tau"] == sweep[int(np.argmin(sizes))]["tau"] and best["mean_size"] == min(sizes)
            assert (best["alpha"], best["score"]) == (ALPHAS[k // 2], ("lac", "aps")[k % 2])
        assert len({r["conformal"][0]["mean_size"] for r in sweep}) > 1  # T moves the sets: what the sweep shows


def test_after_a_split_fit_the_stored_split_gives_the_fits_own_figures(tmp_path, run_json):
    copy = tmp_path / "digits.safetensors"
    fitted = run_json(["fit", str(EXAMPLE), "--output", str(copy), *alpha_args(ALPHAS)])
    for extra in ([], ["--eval-rows"]):
        result = run_json(["report", str(copy), "--tau", "1", "--tau", "fitted", *alpha_args(ALPHAS), *extra])
        assert result["conformal_rows"] == {"calibration": fitted["n_fit"], "evaluation": fitted["n_eval"],
                                            "split": "stored"}
        before, after = result["results"]
        for ours, fits in ((before, fitted["before"]), (after, fitted["after"])):
            assert_same_figures(ours["conformal"], fits["conformal"])
    data = load_file(str(EXAMPLE))
    fit_index, eval_index = tempcal.stratified_split(data["labels"].numpy(), 0.5, 0)
    check_sets(after, data["logits"], data["labels"].numpy(), fit_index, eval_index, ALPHAS)


def test_a_stored_split_of_another_file_falls_back_to_the_seeded_half_and_says_so(tmp_path, cli, run_json):
    copy = tmp_path / "digits.safetensors"
    run_json(["fit", str(EXAMPLE), "--output", str(copy)])
    data = load_file(str(copy))
    from safetensors import safe_open

    with safe_open(str(copy), "pt") as f:
        metadata = f.metadata()
    labels = data["labels"].clone()
    labels[:2] = labels[:2].flip(0) if labels[0] != labels[1] else (labels[:2] + 1) % 10
    save_file({"logits": data["logits"], "labels": labels}, str(copy), metadata=metadata)
    code, _, err = cli(["report", str(copy), "--conformal-alpha", "0.1", "--json", "-"])
    assert code == 0, err
    assert "the conformal thresholds come from a seeded half of SOURCE instead" in err


def test_group_by_gives_each_groups_coverage_under_the_global_sets(tmp_path, run_json):
    z, y, group = grouped_file(tmp_path / "grouped.safetensors", n=1500, groups=3)
    y = y.numpy()
    result = run_json(["report", str(tmp_path / "grouped.safetensors"), "--group-by", "group", "--tau", "1",
                       "--tau", "2.5", "--conformal-alpha", "0.1"])
    calibration, evaluation = tempcal.stratified_split(y, 0.5, 0)
    assert result["conformal_reads"] == 2
    for row in result["results"]:
        check_sets(row, z, y, calibration, evaluation, [0.1])
        for g in row["groups"]:
            mine = evaluation[group[evaluation] == int(g["group"])]
            check_sets({"tau": row["tau"], "conformal": g["conformal"]}, z, y, calibration, mine, [0.1])
            assert [c["threshold"] for c in g["conformal"]] == [c["threshold"] for c in row["conformal"]]


def test_the_per_group_stored_row_forms_each_rows_sets_at_its_own_groups_t(tmp_path, cli, run_json):
    """At the stored per-group temperatures every row's scores (for the thresholds) and sets are at its own group's
    T_g, as a deployment applying T_g row by row forms them; the global T's row keeps its own sets beside."""
    z, y, group = grouped_file(tmp_path / "grouped.safetensors", n=1500, groups=3)
    y = y.numpy()
    path = str(tmp_path / "grouped.safetensors")
    fitted = run_json(["fit", path, "--group-by", "group"])
    code, out, err = cli(["report", path, "--group-by", "group", "--tau", "fitted", "--tau", "1",
                          "--conformal-alpha", "0.1", "--conformal-alpha", "0.05", "--json", "-"])
    assert code == 0, err
    import json

    result = json.loads(out)
    [own] = [r for r in result["results"] if r["per_group"]]
    plain = [r for r in result["results"] if not r["per_group"]]
    assert sorted(r["tau"] for r in plain) == [1.0, fitted["temperature"]] and own is result["results"][-1]
    assert own["basis"]["at"] == "per-group T" and own["basis"]["tau"] is None
    assert "left out" not in err and result["conformal_reads"] == 4  # thresholds, sets, and two at the T_g
    calibration, evaluation = tempcal.stratified_split(y, 0.5, 0)  # the stored split's rows
    t_g = {g["group"]: g["temperature"] for g in fitted["groups"]}
    own_t = np.array([t_g[str(int(v))] for v in group])[:, None]
    p = probabilities(z, own_t)  # every row at its own group's T
    check_sets(own, z, y, calibration, evaluation, [0.1, 0.05], p=p)
    for g in own["groups"]:
        mine = evaluation[group[evaluation] == int(g["group"])]
        check_sets({"conformal": g["conformal"]}, z, y, calibration, mine, [0.1, 0.05], p=p)
    for row in plain:
        check_sets(row, z, y, calibration, evaluation, [0.1, 0.05])
    assert own["conformal"] != plain[0]["conformal"]


def test_the_console_shows_every_tau_and_marks_the_smallest_sets(tmp_path, cli):
    tied_file(tmp_path / "tied.safetensors")
    code, out, err = cli(["report", str(tmp_path / "tied.safetensors"), "--sweep", "0.3:6:5",
                          "--conformal-alpha", "0.1"])
    assert code == 0, err
    start = out.index("conformal sets (thresholds from the")
    lines = out[start:].splitlines()
    assert max(len(line) for line in lines) <= 80
    table = [line.split() for line in lines if line.split() and line.split()[0].replace(".", "").isdigit()]
    assert len(table) == 5
    sizes = [[float(cell.rstrip("*")) for cell in row[4::3]] for row in table]
    for j in range(2):  # LAC, APS
        marked = [k for k, row in enumerate(table) if row[4 + 3 * j].endswith("*")]
        assert marked == [int(np.argmin([s[j] for s in sizes]))]


@pytest.mark.parametrize("value", ["0", "1", "1.5", "-0.1", "nan", "x"])
def test_a_bad_alpha_is_one_line_and_exit_2(tmp_path, cli, value):
    code, out, err = cli(["report", str(EXAMPLE), "--conformal-alpha", value])
    assert code == 2 and out == ""
    assert_one_error_line(err, "--conformal-alpha")


@needs_torchrun
@pytest.mark.slow  # the sets under torchrun in the default run: test_cli_decisions (fit's sets, same reductions)
def test_report_sets_under_two_processes_match_one(tmp_path):
    grouped_file(tmp_path / "grouped.safetensors", n=1500, groups=3)
    path = str(tmp_path / "grouped.safetensors")
    for extra in ([], ["--group-by", "group"]):
        one, two = one_and_two_processes(tmp_path, ["report", path, "--tau", "1", "--tau", "3",
                                                    "--conformal-alpha", "0.2", *extra])
        assert_same_figures(one, two)
        assert all(r["conformal"] for r in two["results"])


def test_the_python_api_takes_conformal_alpha(tmp_path):
    z, y = tied_file(tmp_path / "tied.safetensors")
    result = tempcal.report_file(tmp_path / "tied.safetensors", taus=[2.0], conformal_alpha=[0.2])
    calibration, evaluation = tempcal.stratified_split(y.numpy(), 0.5, 0)
    check_sets({"tau": 2.0, "conformal": [c.to_json() for c in result.results[0].conformal]}, z, y.numpy(),
               calibration, evaluation, [0.2])
    torch.testing.assert_close(torch.tensor(result.conformal_rows.evaluation), torch.tensor(evaluation))


def test_the_plot_and_the_page_show_the_set_sizes_across_tau(tmp_path, run_json):
    pytest.importorskip("matplotlib")
    pytest.importorskip("jinja2")
    from tempcal.output.plots import sweep_figure

    tied_file(tmp_path / "tied.safetensors")
    page = tmp_path / "report.html"
    result = run_json(["report", str(tmp_path / "tied.safetensors"), "--sweep", "0.3:6:5", "--conformal-alpha", "0.1",
                       "--conformal-alpha", "0.2", "--html", str(page), "--plot", str(tmp_path / "sweep.png")])
    figure = sweep_figure(result["results"], {})
    [sizes] = [ax for ax in figure.axes if ax.get_ylabel() == "mean set size"]
    drawn = sorted(tuple(line.get_ydata()) for line in sizes.lines)
    expected = sorted(tuple(r["conformal"][k]["mean_size"] for r in sorted(result["results"], key=lambda r: r["tau"]))
                      for k in range(4))
    assert drawn == [pytest.approx(e) for e in expected]
    html = page.read_text()
    table = html[html.index("Conformal sets"):]
    table = table[:table.index("</table>")]
    assert table.count('<tr class="mark">') == len(result["sweep"]["best_set_size_tau"]) == 4  # a row per best
    assert (tmp_path / "sweep.png").stat().st_size > 0
