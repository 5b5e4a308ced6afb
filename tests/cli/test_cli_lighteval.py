"""lighteval details files through the commands: fit, report, ood, --folds, --group-by task, --conformal-alpha and
--html on the files lighteval 0.13 wrote, every figure against float64 references on the reference rows and against
the same command on a safetensors file of the same logits; --lm-eval-norm; bad files (exit 2, one line, nothing
written); the missing pyarrow extra."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from conftest import EXAMPLE, assert_one_error_line, snapshot, write_logits
from lighteval_details import complete, copied, matrix, mc_rows, reference_rows, write_details
from reference import ece_loop, nll_at, optimal_temperature, ref_msp, sk_figures

from tempcal.io.paths import sidecar_path
from tempcal.io.sidecar import read_sidecar

FIGURES = ("nll", "ece", "mce", "brier", "accuracy", "smece", "aurc")


def _safetensors(tmp_path, task: str, norm: str = "none"):
    z, y = matrix(complete(reference_rows(task)), norm)
    folder = tmp_path / "st"
    folder.mkdir(exist_ok=True)
    return write_logits("safetensors", folder, torch.from_numpy(z), torch.from_numpy(y)), z, y


def _same_figures(a: dict, b: dict) -> None:
    for key in FIGURES:
        assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-12), key


@pytest.mark.parametrize("norm", ["none", "bytes"])
def test_fit_matches_scipy_numpy_and_a_safetensors_file(tmp_path, run_json, norm):
    path = copied("tempcal_mc", tmp_path)
    st, z, y = _safetensors(tmp_path, "tempcal_mc", norm)
    fitted = run_json(["fit", str(path), "--val-fraction", "1.0", "--lm-eval-norm", norm])
    assert fitted["temperature"] == pytest.approx(optimal_temperature(torch.from_numpy(z), torch.from_numpy(y)),
                                                  rel=1e-6)
    assert fitted["n_fit"] == len(y) == 60 and fitted["num_classes"] == 4
    assert fitted["after"]["nll"] == pytest.approx(nll_at(z, y, fitted["temperature"]), rel=1e-9)
    assert fitted["after"]["ece"] == pytest.approx(ece_loop(z, y, fitted["temperature"])[0], abs=1e-9)
    assert fitted["before"]["accuracy"] == pytest.approx(np.mean(z.argmax(axis=1) == y))
    assert fitted["source_kind"] == "lighteval"
    assert fitted["rows_incomplete"] == {"several_targets": 0, "logprobs_count": 0}
    assert fitted["written"] == str(sidecar_path(path))
    stored = read_sidecar(path)[0]
    assert stored["tempcal.temperature"] == repr(fitted["temperature"]) and stored["tempcal.lm_eval_norm"] == norm
    same = run_json(["fit", str(st), "--val-fraction", "1.0", "--no-write"])
    assert same["temperature"] == pytest.approx(fitted["temperature"], rel=1e-9)
    for block in ("before", "after"):
        _same_figures(fitted[block], same[block])
    assert "source_kind" not in same


def test_incomplete_rows_are_counted_and_warned(tmp_path, cli):
    path = copied("tempcal_listed", tmp_path)
    code, out, err = cli(["fit", str(path), "--val-fraction", "1.0", "--no-write", "--json", "-"])
    assert code == 0
    fitted = json.loads(out)
    rows = reference_rows("tempcal_listed")
    assert fitted["rows_incomplete"] == {"several_targets": 1, "logprobs_count": 0}
    assert fitted["n_fit"] == len(rows) - 1
    assert f"warning: {path}: 1 of {len(rows)} rows left out as incomplete (1 with several gold indices" in err
    z, y = matrix(complete(rows))
    assert fitted["temperature"] == pytest.approx(optimal_temperature(torch.from_numpy(z), torch.from_numpy(y)),
                                                  rel=1e-6)


def test_report_conformal_and_html_on_the_stored_t(tmp_path, run_json):
    path = copied("tempcal_mc", tmp_path)
    st, z, y = _safetensors(tmp_path, "tempcal_mc")
    fitted = run_json(["fit", str(path), "--val-fraction", "1.0"])
    run_json(["fit", str(st), "--val-fraction", "1.0"])
    html = tmp_path / "report.html"
    report = run_json(["report", str(path), "--conformal-alpha", "0.2", "--html", str(html)])
    (row,) = report["results"]
    assert row["tau"] == fitted["temperature"] and row["stored"]
    assert row["ece"] == pytest.approx(ece_loop(z, y, row["tau"])[0], abs=1e-9)
    assert report["source_kind"] == "lighteval" and report["rows_incomplete"]["several_targets"] == 0
    assert html.read_text().startswith("<!DOCTYPE html>")
    same = run_json(["report", str(st), "--conformal-alpha", "0.2"])
    _same_figures(row, same["results"][0])
    assert row["conformal"] == same["results"][0]["conformal"]


def test_folds_match_a_safetensors_file(tmp_path, run_json):
    path = copied("tempcal_mc", tmp_path)
    st, *_ = _safetensors(tmp_path, "tempcal_mc")
    fitted = run_json(["fit", str(path), "--folds", "3", "--no-write"])
    same = run_json(["fit", str(st), "--folds", "3", "--no-write"])
    assert fitted["folds"]["k"] == 3 and fitted["source_kind"] == "lighteval"
    assert fitted["temperature"] == pytest.approx(same["temperature"], rel=1e-9)
    _same_figures(fitted["after"], same["after"])


def test_group_by_task_over_two_files(tmp_path, run_json):
    copied("tempcal_listed", tmp_path)
    copied("tempcal_mc", tmp_path)
    fitted = run_json(["fit", str(tmp_path / "details_*.parquet"), "--val-fraction", "1.0", "--group-by", "task",
                       "--no-write"])
    assert fitted["group_key"] == "task"
    groups = {g["group"]: g for g in fitted["groups"]}
    assert set(groups) == {"tempcal_listed_0", "tempcal_mc_0"}
    assert groups["tempcal_mc_0"]["n_fit"] == 60 and groups["tempcal_listed_0"]["n_fit"] == 23
    assert fitted["rows_incomplete"] == {"several_targets": 1, "logprobs_count": 0}
    z, y = matrix(complete(reference_rows("tempcal_listed")) + complete(reference_rows("tempcal_mc")))
    assert fitted["temperature"] == pytest.approx(optimal_temperature(torch.from_numpy(z), torch.from_numpy(y)),
                                                  rel=1e-6)


def test_ood_between_the_two_tasks(tmp_path, run_json):
    path, other = copied("tempcal_mc", tmp_path), copied("tempcal_listed", tmp_path)
    result = run_json(["ood", str(path), "--ood", str(other), "--tau", "1"])
    z_in, _ = matrix(complete(reference_rows("tempcal_mc")))
    z_out, _ = matrix(complete(reference_rows("tempcal_listed")))
    msp = [r for r in result["results"] if r["score"] == "msp"]
    expected = sk_figures(ref_msp(z_in, 1.0), ref_msp(z_out, 1.0))
    assert msp and msp[0]["auroc"] == pytest.approx(expected["auroc"], abs=1e-9)
    assert result["source_kind"] == "lighteval"


def test_lm_eval_norm_applies_to_details_but_not_to_logits_files(cli):
    code, _, err = cli(["report", str(EXAMPLE), "--lm-eval-norm", "chars"])
    assert code == 2
    assert_one_error_line(err, "--lm-eval-norm chars applies to lm-evaluation-harness sample logs", "lighteval "
                          "details (details_*.parquet)", str(EXAMPLE))


@pytest.mark.parametrize(("rows", "drop", "detail"), [
    (mc_rows(5), ("model_response",), "details_t.parquet: no column 'model_response.logprobs'"),
    ([*mc_rows(2), {"gold_index": 7, "choices": [" a", " b"], "logprobs": [-1.0, -2.0]}], (),
     "details_t.parquet: row 3: doc.gold_index 7 names no choice of the 2 in doc.choices"),
])
@pytest.mark.parametrize("command", [["fit"], ["report", "--markdown", "card.md"]])
def test_bad_files_are_exit_2_on_one_line_and_write_nothing(tmp_path, cli, monkeypatch, rows, drop, detail, command):
    write_details(tmp_path / "details_t.parquet", rows, drop=drop)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    code, out, err = cli([command[0], "details_t.parquet", *command[1:], "--json", "result.json"])
    assert code == 2 and out == ""
    assert_one_error_line(err, detail)
    assert snapshot(tmp_path) == before


def test_missing_pyarrow_is_exit_2_naming_the_extra(tmp_path, cli, monkeypatch):
    path = copied("tempcal_mc", tmp_path)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    before = snapshot(tmp_path)
    code, out, err = cli(["fit", str(path)])
    assert code == 2 and out == ""
    assert_one_error_line(err, f"{path}: reading a lighteval details file needs pyarrow, which is not installed: "
                               "pip install 'tempcal[logs]'")
    assert snapshot(tmp_path) == before


def test_inspect_describes_the_file(tmp_path, run_json, cli):
    path = copied("tempcal_listed", tmp_path)
    data = run_json(["inspect", str(path)])
    assert data["kind"] == "lighteval" and data["kind_name"] == "lighteval details" and data["rows"] == 23
    (detail,) = data["details"]
    assert detail["task"] == "tempcal_listed_0" and detail["rows"] == 24 and detail["records"] == 23
    assert detail["rows_incomplete"] == {"several_targets": 1, "logprobs_count": 0}
    assert detail["choice_counts"] == {"4": 23} and detail["gold_index"] == {"list": 24}
    code, out, _ = cli(["inspect", str(path)])
    assert code == 0 and "task tempcal_listed_0, 23 records (23 x 4 choices)" in out
    assert "1 more left out as incomplete: 1 several targets" in out
