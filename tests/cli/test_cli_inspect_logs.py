"""inspect_ai logs through the commands: fit (T against scipy's bounded optimiser in float64 on the reference
log-probabilities, figures against plain numpy loops, the same JSON figures as a safetensors file of the same logits),
the sidecar, report, inspect, --folds, --group-by, --conformal-alpha, --html, and bad logs (exit 2, one line, nothing
written)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import assert_one_error_line, snapshot
from inspect_logs import FIXTURES, expected_rows, rewritten
from reference import ece_loop, nll_at, optimal_temperature, predictions, ref_msp, sk_figures
from safetensors.torch import save_file

from tempcal.io.paths import sidecar_path
from tempcal.io.sidecar import read_sidecar

FIGURES = ("nll", "ece", "brier", "accuracy", "mce")


@pytest.fixture
def logs(tmp_path):
    """A copy of the fixture logs (a fit writes sidecars beside them)."""
    out = tmp_path / "logs"
    shutil.copytree(FIXTURES, out, ignore=shutil.ignore_patterns("reference", "*.py", "__pycache__"))
    return out


def as_safetensors(name: str, path) -> tuple[np.ndarray, np.ndarray]:
    z, y, _ = expected_rows(name)
    save_file({"logits": torch.from_numpy(z), "labels": torch.from_numpy(y)}, str(path))
    return z, y


@pytest.mark.parametrize("name", ["mc_word.eval", "mc_bpe.eval", "mc_cot_bpe.eval"])
def test_fit_matches_the_float64_reference_and_the_same_logits_as_safetensors(name, logs, tmp_path, run_json):
    path = logs / name
    z, y = as_safetensors(name, tmp_path / "same.safetensors")
    fitted = run_json(["fit", str(path), "--val-fraction", "1.0"])
    assert fitted["source_kind"] == "inspect"
    assert fitted["rows_incomplete"] == expected_rows(name)[2]
    assert fitted["n_fit"] == len(y) and fitted["num_classes"] == z.shape[1]
    assert fitted["temperature"] == pytest.approx(optimal_temperature(z, y), rel=1e-6)
    t = fitted["temperature"]
    assert fitted["after"]["nll"] == pytest.approx(nll_at(z, y, t), rel=1e-9)
    assert fitted["after"]["ece"] == pytest.approx(ece_loop(z, y, t)[0], abs=1e-9)
    assert fitted["after"]["accuracy"] == pytest.approx(float(np.mean(predictions(z) == y)), abs=1e-12)
    assert fitted["before"]["ece"] == pytest.approx(ece_loop(z, y, 1.0)[0], abs=1e-9)
    same = run_json(["fit", str(tmp_path / "same.safetensors"), "--val-fraction", "1.0", "--no-write"])
    assert same["temperature"] == pytest.approx(t, rel=1e-9)
    for key in FIGURES:
        assert fitted["after"][key] == pytest.approx(same["after"][key], abs=1e-12)
        assert fitted["before"][key] == pytest.approx(same["before"][key], abs=1e-12)
    assert "source_kind" not in same
    stored = read_sidecar(path)[0]
    assert stored["tempcal.temperature"] == repr(t)
    report = run_json(["report", str(path)])
    (row,) = report["results"]
    assert row["tau"] == t and row["stored"] and report["source_kind"] == "inspect"
    assert row["ece"] == pytest.approx(ece_loop(z, y, t)[0], abs=1e-9)


def test_incomplete_rows_are_warned_on_one_line(logs, cli):
    code, out, err = cli(["fit", str(logs / "mc_bpe.eval"), "--no-write", "--json", "-"])
    assert code == 0
    left = expected_rows("mc_bpe.eval")[2]
    total = sum(left.values())
    lines = [line for line in err.splitlines() if "left out of every figure" in line]
    assert len(lines) == 1 and f"{total} of 24 samples" in lines[0]
    assert json.loads(out)["rows_incomplete"] == left


def test_folds_conformal_and_html_on_a_log(logs, tmp_path, run_json):
    path = logs / "mc_word.eval"
    _z, _y = as_safetensors("mc_word.eval", tmp_path / "same.safetensors")
    args = ["--folds", "3", "--seed", "2", "--conformal-alpha", "0.2", "--no-write"]
    one = run_json(["fit", str(path), *args, "--html", str(tmp_path / "page.html")])
    two = run_json(["fit", str(tmp_path / "same.safetensors"), *args])
    assert one["folds"]["sizes"] == two["folds"]["sizes"]
    assert one["folds"]["temperatures"] == pytest.approx(two["folds"]["temperatures"], rel=1e-9)
    assert one["after"]["conformal"] == two["after"]["conformal"]
    assert "<html" in (tmp_path / "page.html").read_text().lower()
    assert not sidecar_path(path).exists()


def test_group_by_model_and_task(logs, tmp_path, run_json, cli):
    folder = logs / "multi"
    before = snapshot(logs)
    code, _, err = cli(["fit", str(folder), "--val-fraction", "1.0"])
    assert code == 2
    assert_one_error_line(err, "logs of 2 models", "--group-by model")
    assert snapshot(logs) == before
    by_model = run_json(["fit", str(folder), "--group-by", "model", "--group-prior", "0", "--val-fraction", "1.0"])
    stored = run_json(["report", str(folder), "--group-by", "model"])["results"][-1]
    assert stored["per_group"] and [(g["group"], g["tau"]) for g in stored["groups"]] == [
        (g["group"], g["temperature"]) for g in by_model["groups"]]
    assert [g["group"] for g in by_model["groups"]] == ["hf/word1", "hf/word3"]
    for group in by_model["groups"]:
        glob = "*_word1.eval" if group["group"] == "hf/word1" else "*_word3.eval"
        zs = [expected_rows(f"multi/{n}")[:2] for n in (f"alpha{glob[1:]}", f"beta{glob[1:]}")]
        z, y = np.concatenate([a for a, _ in zs]), np.concatenate([b for _, b in zs])
        assert group["n_fit"] == len(y)
        assert group["temperature"] == pytest.approx(optimal_temperature(z, y), rel=1e-5)
    by_task = run_json(["fit", str(folder / "*_word1.eval"), "--group-by", "task", "--val-fraction", "1.0"])
    assert [g["group"] for g in by_task["groups"]] == ["alpha", "beta"]
    report = run_json(["report", str(folder / "*_word1.eval"), "--group-by", "task"])
    assert report["source_kind"] == "inspect" and report["group_key"] == "task"


def test_inspect_describes_the_logs(logs, run_json):
    described = run_json(["inspect", str(logs / "mc_bpe.eval")])
    assert described["kind"] == "inspect" and described["source_kind"] == "inspect"
    (detail,) = described["details"]
    left = expected_rows("mc_bpe.eval")[2]
    assert detail["rows_incomplete"] == left and detail["rows"] == described["rows"] == 24 - sum(left.values())
    assert (detail["task"], detail["model"], detail["epochs"], detail["samples"]) == ("mc", "hf/bpe", [1, 2], 24)


def _bad_target(sample):
    return {**sample, "target": "E"} if sample["id"] == "q02" else sample


@pytest.mark.parametrize(("make", "details"), [
    (lambda d: d / "mc_nolp_word.eval", ["mc_nolp_word.eval", "--logprobs --top-logprobs 20"]),
    (lambda d: d / "mc_shuffled_word.eval", ["mc_shuffled_word.eval", "shuffled the choices"]),
    (lambda d: rewritten(d / "mc_word.eval", d / "target.eval", _bad_target),
     ["target.eval: sample id 'q02' epoch 1: its target 'E' names no choice"]),
    (lambda d: (d / "cut.eval").write_bytes((d / "mc_word.eval").read_bytes()[:5000]) and d / "cut.eval",
     ["cut.eval: not a readable .eval log"]),
    (lambda d: (d / "cut.json").write_bytes((d / "mc_json_bpe.json").read_bytes()[:-2000]) and d / "cut.json",
     ["cut.json"]),
    (lambda d: (d / "other.json").write_text('{"results": {"acc": 0.5}}') and d / "other.json",
     ["other.json: a .json SOURCE is read as an inspect_ai log", "no keys 'version', 'status', 'eval'"]),
    (lambda d: (d / "noeval.json").write_text('{"version": 2, "status": "success", "samples": []}')
     and d / "noeval.json",
     ["noeval.json: a .json SOURCE is read as an inspect_ai log", "no key 'eval'"]),
    (lambda d: (d / "list.json").write_text("[1, 2]") and d / "list.json",
     ["list.json: a .json SOURCE is read as an inspect_ai log, a JSON object; this one is not an object"]),
])
def test_bad_logs_are_exit_2_on_one_line_and_write_nothing(logs, cli, make, details):
    path = make(logs)
    before = snapshot(logs)
    code, out, err = cli(["fit", str(path)])
    assert code == 2 and out == ""
    assert_one_error_line(err, *details)
    assert snapshot(logs) == before


def test_ood_between_two_logs_matches_scikit_learn(logs, run_json):
    z, _, _ = expected_rows("mc_word.eval")
    other, _, _ = expected_rows("mc_cot_bpe.eval")
    other = np.concatenate([other, np.full((len(other), z.shape[1] - other.shape[1]), -np.inf)], axis=1)
    result = run_json(["ood", str(logs / "mc_word.eval"), "--ood", str(logs / "mc_cot_bpe.eval"), "--tau", "1.7"])
    assert result["source_kind"] == "inspect" and result["rows_incomplete"] == expected_rows("mc_word.eval")[2]
    (row,) = result["results"]
    expected = sk_figures(ref_msp(z, 1.7), ref_msp(other, 1.7))
    assert row["auroc"] == pytest.approx(expected["auroc"], abs=1e-9)


def test_a_folder_keeps_t_in_each_logs_sidecar(logs, tmp_path, run_json):
    folder = tmp_path / "one_model"
    folder.mkdir()
    for name in ("alpha_word1.eval", "beta_word1.eval"):
        shutil.copy(logs / "multi" / name, folder / name)
    fitted = run_json(["fit", str(folder), "--val-fraction", "1.0"])
    zs = [expected_rows(f"multi/{n}")[:2] for n in ("alpha_word1.eval", "beta_word1.eval")]
    z, y = np.concatenate([a for a, _ in zs]), np.concatenate([b for _, b in zs])
    assert fitted["temperature"] == pytest.approx(optimal_temperature(z, y), rel=1e-6)
    for name in ("alpha_word1.eval", "beta_word1.eval"):
        assert read_sidecar(folder / name)[0]["tempcal.temperature"] == repr(fitted["temperature"])
    assert run_json(["report", str(folder)])["results"][0]["tau"] == fitted["temperature"]
    described = run_json(["inspect", str(folder)])
    assert described["stored"]["temperature"] == fitted["temperature"]
    assert described["sidecar"]["path"] == str(sidecar_path(folder / "alpha_word1.eval"))
