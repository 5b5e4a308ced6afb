"""tempcal report: figures against numpy references, --tau and --sweep, plots, estimators and the bootstrap in JSON."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import EXAMPLE
from reference import brier, ece_loop, entropy, predictions, probabilities
from safetensors.torch import save_file

import tempcal
from tempcal.cli.main import main


def test_report_figures_match_references(data_file, run_json):
    path, logits, labels = data_file
    out = run_json(["report", str(path), "--tau", "0.7", "--tau", "2.4", "--bins", "10"])
    assert [r["tau"] for r in out["results"]] == [0.7, 2.4]
    for row in out["results"]:
        tau = row["tau"]
        ece, mce = ece_loop(logits, labels, tau, bins=10)
        assert row["ece"] == pytest.approx(ece, abs=1e-9) and row["mce"] == pytest.approx(mce, abs=1e-9)
        assert row["nll"] == pytest.approx(float(F.cross_entropy(logits.double() / tau, labels)), rel=1e-9)
        assert row["brier"] == pytest.approx(brier(logits, labels, tau), rel=1e-9)
        assert row["entropy"] == pytest.approx(entropy(logits, tau), rel=1e-9)
        assert row["accuracy"] == pytest.approx(float((predictions(logits) == labels.numpy()).mean()))
        assert len(row["bins"]) == 10
        confidence = probabilities(logits, tau).max(1)
        for i, b in enumerate(row["bins"]):
            assert b["lower"] == pytest.approx(i / 10) and b["upper"] == pytest.approx((i + 1) / 10)
            members = (confidence > i / 10) & (confidence <= (i + 1) / 10)
            assert b["count"] == int(members.sum())
            if b["count"] == 0:
                assert b["confidence"] is None and b["accuracy"] is None
            else:
                assert b["confidence"] == pytest.approx(confidence[members].mean(), rel=1e-9)


def test_default_tau_is_stored_then_one(data_file, capsys, tmp_path, run_json):
    path, _, _ = data_file
    assert run_json(["report", str(path)])["results"][0]["tau"] == 1.0
    assert main(["fit", str(path), "--quiet"]) == 0
    capsys.readouterr()
    stored = tempcal.read_header(path).stored_temperature()
    out = run_json(["report", str(path)])
    assert out["results"][0]["tau"] == stored and out["results"][0]["stored"] is True
    out = run_json(["report", str(path), "--tau", "fitted", "--tau", "1"])
    assert [r["tau"] for r in out["results"]] == sorted([stored, 1.0])


@pytest.mark.parametrize("argv", [["--tau", "fitted"], ["--tau", "0"], ["--tau", "-1"], ["--tau", "abc"],
                                  ["--tau", "inf"], ["--sweep", "1:2"], ["--sweep", "2:1:5"], ["--sweep", "0:1:5"],
                                  ["--sweep", "1:2:1"], ["--plot", "x.gif"]])
def test_bad_report_options(data_file, capsys, argv):
    path, _, _ = data_file
    assert main(["report", str(path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")


def test_tau_errors_say_what_and_where(data_file, capsys, tmp_path):
    path, _, _ = data_file
    assert main(["report", str(path), "--tau", " Fitted "]) == 2
    assert f"--tau fitted: {path} has no stored temperature" in capsys.readouterr().err
    missing = tmp_path / "missing.safetensors"
    assert main(["report", str(missing), "--tau", "-1"]) == 2  # the number is refused before any file is read
    assert "--tau -1: expected a number > 0 or 'fitted'" in capsys.readouterr().err
    assert main(["ood", str(missing), "--ood", str(missing), "--tau", "nan"]) == 2
    assert "--tau nan: expected a number > 0 or 'fitted'" in capsys.readouterr().err


def test_sweep_minimum_agrees_with_fit(data_file, run_json):
    path, _, _ = data_file
    fitted = run_json(["fit", str(path), "--val-fraction", "1.0", "--no-write"])["temperature"]
    out = run_json(["report", str(path), "--sweep", "0.5:8:41"])
    spacing = math.log(8 / 0.5) / 40
    best = out["sweep"]["best_nll_tau"]
    assert abs(math.log(best) - math.log(fitted)) <= spacing
    nlls = {r["tau"]: r["nll"] for r in out["results"]}
    assert nlls[best] == min(nlls[t] for t in out["sweep"]["taus"])
    taus = out["sweep"]["taus"]
    assert len(taus) == 41 and taus[0] == pytest.approx(0.5) and taus[-1] == pytest.approx(8)


@pytest.mark.parametrize("suffix,magic", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_plots_are_written_in_the_asked_format(data_file, tmp_path, suffix, magic):
    path, _, _ = data_file
    fit_plot, sweep_plot = tmp_path / f"fit{suffix}", tmp_path / f"sweep{suffix}"
    assert main(["fit", str(path), "--no-write", "--quiet", "--plot", str(fit_plot)]) == 0
    assert main(["report", str(path), "--sweep", "0.5:5:6", "--quiet", "--plot", str(sweep_plot)]) == 0
    for plot in (fit_plot, sweep_plot):
        data = plot.read_bytes()
        assert data.startswith(magic) and len(data) > 5000
    if suffix == ".png":
        width = int.from_bytes(fit_plot.read_bytes()[16:20], "big")
        height = int.from_bytes(fit_plot.read_bytes()[20:24], "big")
        assert width > height > 300  # two panels side by side
    assert not list(tmp_path.glob(".*tmp*"))


def test_report_on_the_example_runs(tmp_path, run_json):
    copy = tmp_path / EXAMPLE.name
    shutil.copy(EXAMPLE, copy)
    out = run_json(["report", str(copy), "--tau", "1"])
    assert out["n"] == sum(b["count"] for b in out["results"][0]["bins"])


def test_estimators_and_bootstrap_in_json(data_file, run_json):
    from reference import probabilities

    path, logits, labels = data_file
    out = run_json(["report", str(path), "--tau", "1.5", "--estimators", "all", "--bootstrap", "200",
                            "--seed", "4"])
    row = out["results"][0]
    confidence = probabilities(logits, 1.5).max(1)
    correct = predictions(logits) == labels.numpy()
    # RMS over the contract's bins, by a plain loop.
    index = np.clip(np.ceil(confidence * 15).astype(int) - 1, 0, 14)
    rms = math.sqrt(sum((index == b).sum() / len(labels) * (correct[index == b].mean() - confidence[index == b].mean())
                        ** 2 for b in range(15) if (index == b).any()))
    assert row["rms_ce"] == pytest.approx(rms, rel=1e-9)
    for name in ("ece_equal_mass", "ece_classwise", "l2_ce_debiased"):
        assert 0 <= row[name] <= 1
    low, high = row["ece_ci"]
    assert low <= row["ece"] <= high or high - low < 0.05
    low, high = row["nll_ci"]
    assert low <= row["nll"] <= high
    again = run_json(["report", str(path), "--tau", "1.5", "--bootstrap", "200", "--seed", "4"])
    assert again["results"][0]["nll_ci"] == row["nll_ci"]
    assert main(["report", str(path), "--estimators", "nope"]) == 2


def test_token_level_logits_skip_the_ignore_index(tmp_path, capsys, reads):
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 40, 30, generator=g, dtype=torch.float64) * 3
    labels = torch.multinomial(torch.softmax(logits.reshape(-1, 30) / 3, 1), 1, generator=g)[:, 0].reshape(6, 40)
    labels[:, 30:] = -100  # padding
    labels[2, :5] = -100
    path = tmp_path / "tokens.safetensors"
    save_file({"logits": logits, "labels": labels}, str(path))
    assert main(["report", str(path), "--tau", "2", "--json", "-"]) == 0
    row = json.loads(capsys.readouterr().out)["results"][0]
    expected = F.cross_entropy(logits.reshape(-1, 30) / 2, labels.reshape(-1), ignore_index=-100)
    assert row["nll"] == pytest.approx(float(expected), rel=1e-9)
    keep = labels.reshape(-1) != -100
    assert sum(b["count"] for b in row["bins"]) == int(keep.sum())
    assert row["ece"] == pytest.approx(ece_loop(logits.reshape(-1, 30)[keep], labels.reshape(-1)[keep], 2)[0],
                                       abs=1e-9)
    api = tempcal.calibration_metrics(logits, labels, 2.0, device="cpu")
    assert api.nll == pytest.approx(float(expected), rel=1e-9)


def test_min_nll_tau_is_over_every_row_the_stored_t_included(tmp_path, run_json):
    from conftest import EXAMPLE

    calibrated = tmp_path / "c.safetensors"
    run_json(["fit", str(EXAMPLE), "--output", str(calibrated)])
    out = run_json(["report", str(calibrated), "--sweep", "0.5:10:5"])
    nlls = {r["tau"]: r["nll"] for r in out["results"]}
    assert out["min_nll_tau"] == min(nlls, key=nlls.get)
    assert out["min_nll_tau"] == out["stored_temperature"]  # the fitted T beats the sweep's grid points
    assert out["sweep"]["best_nll_tau"] in out["sweep"]["taus"]
