"""Models through the command line: model -> logits -> fit -> calibrated model -> report; ood on inputs."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import EXAMPLES
from reference import optimal_temperature
from safetensors import safe_open
from safetensors.torch import load_file

import tempcal
from tempcal.cli.main import main

MODEL, INPUTS, LOGITS = EXAMPLES / "digits_model.ts", EXAMPLES / "digits_inputs.safetensors", \
    EXAMPLES / "digits_logits.safetensors"


def test_fit_save_model_then_report_shows_the_stored_t(tmp_path, capsys):
    calibrated, logits_out = tmp_path / "calibrated.ts", tmp_path / "logits.safetensors"
    assert main(["fit", str(MODEL), "--inputs", str(INPUTS), "--save-model", str(calibrated), "--save-logits",
                 str(logits_out), "--json", "-", "--val-fraction", "1.0"]) == 0
    fit = json.loads(capsys.readouterr().out)
    shipped = load_file(str(LOGITS))
    expected = optimal_temperature(shipped["logits"], shipped["labels"])
    assert abs(fit["temperature"] - expected) / expected < 1e-6
    with safe_open(str(logits_out), "pt") as f:
        assert torch.allclose(f.get_tensor("logits"), shipped["logits"], atol=1e-5)
    original, scaled = torch.jit.load(str(MODEL)), torch.jit.load(str(calibrated))
    x = load_file(str(INPUTS))["inputs"][:50]
    assert torch.allclose(scaled(x).double(), original(x).double() / fit["temperature"], atol=1e-6)
    assert main(["report", str(calibrated), "--inputs", str(INPUTS), "--json", "-"]) == 0
    row = json.loads(capsys.readouterr().out)["results"][0]
    assert row["tau"] == pytest.approx(fit["temperature"], rel=1e-12) and row["stored"] is True
    direct = tempcal.calibration_metrics(shipped["logits"], shipped["labels"], fit["temperature"], device="cpu")
    assert row["nll"] == pytest.approx(direct.nll, rel=1e-5) and row["ece"] == pytest.approx(direct.ece, abs=1e-5)


def test_ood_on_model_inputs_and_odin(tmp_path, capsys):
    g = torch.Generator().manual_seed(0)
    noise = tmp_path / "noise.safetensors"
    from safetensors.torch import save_file

    save_file({"inputs": torch.randn(300, 64, generator=g) * 2}, str(noise))
    assert main(["ood", str(MODEL), "--inputs", str(INPUTS), "--ood-inputs", str(noise), "--tau", "1",
                 "--json", "-"]) == 0
    plain = json.loads(capsys.readouterr().out)["results"][0]
    assert main(["ood", str(MODEL), "--inputs", str(INPUTS), "--ood-inputs", str(noise), "--tau", "1",
                 "--odin-eps", "0.05", "--json", "-"]) == 0
    odin = json.loads(capsys.readouterr().out)["results"][0]
    assert 0.5 < plain["auroc"] <= 1 and 0.5 < odin["auroc"] <= 1
    assert not math.isclose(plain["auroc"], odin["auroc"], rel_tol=1e-9)


@pytest.mark.parametrize("argv", [
    ["fit", str(LOGITS), "--inputs", str(INPUTS), "--no-write"],
    ["fit", str(MODEL), "--no-write"],
    ["fit", str(MODEL), "--inputs", str(INPUTS), "--output", "x.safetensors"],
    ["ood", str(LOGITS), "--ood", str(LOGITS), "--odin-eps", "0.1"],
    ["ood", str(MODEL), "--inputs", str(INPUTS)],
])
def test_model_usage_errors(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    assert not list(tmp_path.iterdir())
