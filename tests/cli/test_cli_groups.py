"""tempcal fit --folds / --group-by, report and ood --group-by on the command line: the JSON, the console, the
configuration file, lm-evaluation-harness task groups, write-back, and bad input (exit 2, one line, nothing
written)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import assert_one_error_line, miscalibrated, sha256
from lm_eval_logs import random_mc_records, write_log
from reference import ref_auroc, ref_msp
from safetensors import safe_open
from safetensors.torch import save_file
from subsets_reference import figures_per_row, penalised_temperature

from tempcal.subsets.options import DEFAULT_GROUP_PRIOR


@pytest.fixture
def grouped(tmp_path):
    z, y = miscalibrated(400, 5, 2.0, seed=3)
    domain = torch.arange(400, dtype=torch.int64) % 3 * 100  # groups 0, 100, 200
    z = z * (1 + domain[:, None] / 200)
    path = tmp_path / "grouped.safetensors"
    save_file({"logits": z, "labels": y, "domain": domain}, str(path))
    return path, z, y, domain


def test_fit_folds_and_groups_json_and_write_back(grouped, run_json, cli):
    path, _z, _y, _domain = grouped
    out = run_json(["fit", str(path), "--folds", "5", "--group-by", "domain"])
    assert out["folds"]["k"] == 5 and len(out["folds"]["temperatures"]) == 5 and sum(out["folds"]["sizes"]) == 400
    assert [g["group"] for g in out["groups"]] == ["0", "100", "200"]
    assert out["n_fit"] == out["n_eval"] == 400 and out["group_prior"] == DEFAULT_GROUP_PRIOR
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    assert float(metadata["tempcal.temperature"]) == out["temperature"]
    assert metadata["tempcal.group_key"] == "domain"
    assert json.loads(metadata["tempcal.group_temperatures"]) == {g["group"]: g["temperature"] for g in out["groups"]}
    code, stdout, _ = cli(["fit", str(path), "--folds", "5", "--group-by", "domain", "--no-write"])
    assert code == 0
    assert "out of fold" in stdout and "3 groups by domain" in stdout
    assert max(len(line) for line in stdout.splitlines() if str(path) not in line) <= 80  # paths are not wrapped


def test_report_groups_console_lists_the_largest_ece_first_within_80_columns(tmp_path, cli):
    z, y = miscalibrated(1200, 4, 2.0, seed=4)
    groups = torch.arange(1200) % 30
    z = z * (0.5 + groups[:, None] / 10)
    path = tmp_path / "many.safetensors"
    save_file({"logits": z, "labels": y, "task_id": groups}, str(path))
    code, out, _ = cli(["report", str(path), "--group-by", "task_id", "--tau", "1", "--json", str(tmp_path / "r.json")])
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines if str(tmp_path) not in line) <= 80  # paths are not wrapped
    assert "... and 10 more groups" in out
    data = json.loads((tmp_path / "r.json").read_text())
    ordered = sorted(data["results"][0]["groups"], key=lambda g: -g["ece"])
    first = next(i for i, line in enumerate(lines) if line.startswith("30 groups"))
    shown = [line.split()[0] for line in lines[first + 3:first + 23]]
    assert shown == [g["group"] for g in ordered[:20]]
    rows = (groups == int(ordered[0]["group"])).numpy()
    assert ordered[0]["ece"] == pytest.approx(figures_per_row(z[rows], y[rows], 1.0)["ece"], abs=1e-9)


def test_report_estimators_at_stored_group_temperatures_show_the_left_out_figure_as_a_dash(grouped, cli, run_json):
    path, *_ = grouped
    assert cli(["fit", str(path), "--group-by", "domain"])[0] == 0
    argv = ["report", str(path), "--group-by", "domain", "--estimators", "all", "--tau", "fitted"]
    data = run_json(argv)
    global_row, group_row = data["results"][0], data["results"][1]
    assert "ece_classwise" in global_row and "ece_classwise" not in group_row
    assert any("ece_classwise is left out" in w for w in data["warnings"])
    code, out, err = cli(argv)
    assert code == 0, err
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if "ece_classwise" in line.split())
    row = next(line for line in lines[at:] if line.split()[:1] == ["T_g"])
    cells = dict(zip(lines[at].split(), row.split(), strict=True))
    assert cells["ece_classwise"] == "-"
    assert float(cells["ece_equal_mass"]) == pytest.approx(group_row["ece_equal_mass"], abs=5e-5)


def test_config_file_folds_and_group_by(grouped, run_json, tmp_path, monkeypatch):
    path, *_ = grouped
    (tmp_path / "tempcal.toml").write_text(f'source = "{path.name}"\n[fit]\nfolds = 4\ngroup-by = "domain"\n'
                                           'group-prior = 5\nno-write = true\n')
    monkeypatch.chdir(tmp_path)
    out = run_json(["fit"])
    assert out["folds"]["k"] == 4 and out["group_key"] == "domain" and out["group_prior"] == 5
    # the command line's split wins over the file's folds
    split = run_json(["fit", "--val-fraction", "0.5"])
    assert "folds" not in split and split["val_fraction"] == 0.5


@pytest.mark.parametrize("args, detail", [
    (["--folds", "3", "--val-fraction", "0.5"], "--val-fraction"),
    (["--folds", "3", "--eval", "{path}"], "--eval"),
    (["--folds", "1"], "--folds"),
    (["--folds", "401"], "--folds 401"),
    (["--group-by", "missing"], "missing"),
    (["--group-by", "floaty"], "floaty"),
    (["--group-by", "short"], "short"),
    (["--group-prior", "2"], "--group-by"),
    (["--group-by", "domain", "--group-prior", "-1"], "--group-prior"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(grouped, cli, tmp_path, args, detail):
    path, z, y, domain = grouped
    save_file({"logits": z, "labels": y, "domain": domain, "floaty": domain.float(),
               "short": domain[:-3].clone()}, str(path))
    before = sha256(path)
    json_path = tmp_path / "out.json"
    code, _out, err = cli(["fit", str(path), *[a.format(path=path) for a in args], "--json", str(json_path)])
    assert code == 2, err
    assert_one_error_line(err, detail)
    assert sha256(path) == before and not json_path.exists()


def test_lm_eval_task_groups(tmp_path, run_json):
    paths, rows = [], {}
    for task, seed, n in (("arc_easy", 1, 60), ("hellaswag", 2, 45), ("piqa", 3, 30)):
        records, lls, labels = random_mc_records(n, seed=seed, temperature=1.5 + seed)
        paths.append(write_log(tmp_path / f"samples_{task}_2024-09-05T12-34-56.789012.jsonl", records))
        rows[task] = (lls, labels)
    out = run_json(["fit", *map(str, paths), "--group-by", "task", "--val-fraction", "1"])
    assert [g["group"] for g in out["groups"]] == ["arc_easy", "hellaswag", "piqa"]
    for entry in out["groups"]:
        lls, labels = rows[entry["group"]]
        width = max(len(r) for r in lls)
        z = torch.tensor([r + [-np.inf] * (width - len(r)) for r in lls], dtype=torch.float64)
        y = torch.tensor(labels)
        expected = penalised_temperature(z, y, DEFAULT_GROUP_PRIOR, out["temperature"])
        assert entry["temperature"] == pytest.approx(expected, rel=1e-6)
    sidecar = json.loads((tmp_path / (paths[0].name + ".tempcal.json")).read_text())
    assert sidecar["metadata"]["tempcal.group_key"] == "task"
    stored = json.loads(sidecar["metadata"]["tempcal.group_temperatures"])
    assert stored == {g["group"]: g["temperature"] for g in out["groups"]}
    report = run_json(["report", *map(str, paths), "--group-by", "task"])
    at_global, own = report["results"]  # the stored global T's figures, then each group at its own T
    assert not at_global["per_group"] and at_global["basis"]["at"] == "global T"
    assert {g["tau"] for g in at_global["groups"]} == {out["temperature"]}
    assert own["per_group"] is True and own["basis"]["at"] == "per-group T"
    assert {g["group"]: g["tau"] for g in own["groups"]} == stored


def test_group_by_task_needs_lm_eval_logs(grouped, cli):
    path, *_ = grouped
    code, _, err = cli(["report", str(path), "--group-by", "task"])
    assert code == 2
    assert_one_error_line(err, "task")


def test_ood_groups(grouped, run_json, tmp_path):
    path, z, _y, domain = grouped
    ood = tmp_path / "ood.safetensors"
    save_file({"logits": torch.randn(150, 5) * 2}, str(ood))
    run_json(["fit", str(path), "--group-by", "domain", "--val-fraction", "1"])
    out = run_json(["ood", str(path), "--ood", str(ood), "--group-by", "domain", "--tau", "1", "--tau", "fitted"])
    assert out["group_key"] == "domain" and [g["group"] for g in out["groups"]] == ["0", "100", "200"]
    entry = out["groups"][1]
    assert entry["n_id"] == int((domain == 100).sum())
    per_group = [r for r in entry["results"] if r["per_group"]]
    assert len(per_group) == 1 and per_group[0]["tau"] != out["stored_temperature"]
    rows = (domain == 100).numpy()
    tau = per_group[0]["tau"]
    with safe_open(str(ood), "pt") as f:
        ood_logits = f.get_tensor("logits").numpy()
    expected = ref_auroc(ref_msp(z[rows].numpy(), tau), ref_msp(ood_logits, tau))
    assert per_group[0]["auroc"] == pytest.approx(expected, abs=1e-12)


def test_report_plot_draws_each_groups_ece_before_and_after(grouped, cli, tmp_path):
    pytest.importorskip("matplotlib")
    path, *_ = grouped
    assert cli(["fit", str(path), "--group-by", "domain", "--val-fraction", "1", "-q"])[0] == 0
    plot = tmp_path / "groups.png"
    code, out, _ = cli(["report", str(path), "--group-by", "domain", "--tau", "1", "--tau", "fitted", "--plot",
                        str(plot), "--json", str(tmp_path / "r.json")])
    assert code == 0 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and str(plot) in out
    from tempcal.output.plots import new_figure
    from tempcal.subsets.plots import group_ece_axes, report_group_figure, save_figure
    from tempcal.workflows.report import report_file

    result = report_file(str(path), taus=[1.0, "fitted"], group_by="domain")
    figure_path = tmp_path / "again.svg"
    save_figure(report_group_figure(result), figure_path)

    names = [g.group for g in result.group_rows[0].groups]
    series = [(str(k), [g.metrics.ece for g in row.groups]) for k, row in enumerate(result.group_rows)]
    ax = new_figure().subplots()
    group_ece_axes(ax, names, series, "t")
    widths = sorted(round(p.get_width(), 12) for p in ax.patches)
    data = json.loads((tmp_path / "r.json").read_text())
    expected = sorted(round(g["ece"], 12) for row in data["results"] for g in row["groups"])
    assert widths == expected
    fitted = next(row for row in data["results"] if row["per_group"])
    assert {g["tau"] for g in fitted["groups"]} != {fitted["tau"]}  # the 'after' bars are at each group's T


def test_html_report_lists_the_groups(grouped, cli, tmp_path):
    pytest.importorskip("matplotlib")
    path, *_ = grouped
    page = tmp_path / "fit.html"
    code, _, err = cli(["fit", str(path), "--folds", "3", "--group-by", "domain", "--no-write", "--html", str(page)])
    assert code == 0, err
    text = page.read_text()
    assert "Groups (3)" in text and "ECE per group" in text
