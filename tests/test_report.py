"""`tempcal report`, plots, Markdown and the ECE objective, checked against independent computations."""

from __future__ import annotations

import io
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch.nn.functional as F
from reference import brier, ece_loop, entropy, miscalibrated, predictions, probabilities
from safetensors.torch import save_file

import tempcal
from tempcal.cli.main import main
from tempcal.output.plots import log_spaced

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "digits_logits.safetensors"


@pytest.fixture
def data_file(tmp_path):
    logits, labels = miscalibrated(1500, 8, 2.4, seed=21)
    path = tmp_path / "logits.safetensors"
    save_file({"logits": logits, "labels": labels}, str(path))
    return path, logits, labels


def run_json(capsys, argv):
    assert main([*argv, "--json", "-"]) == 0
    return json.loads(capsys.readouterr().out)


def test_report_figures_match_references(data_file, capsys):
    path, logits, labels = data_file
    out = run_json(capsys, ["report", str(path), "--tau", "0.7", "--tau", "2.4", "--bins", "10"])
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


def test_default_tau_is_stored_then_one(data_file, capsys, tmp_path):
    path, _, _ = data_file
    assert run_json(capsys, ["report", str(path)])["results"][0]["tau"] == 1.0
    assert main(["fit", str(path), "--quiet"]) == 0
    capsys.readouterr()
    stored = tempcal.read_header(path).stored_temperature()
    out = run_json(capsys, ["report", str(path)])
    assert out["results"][0]["tau"] == stored and out["results"][0]["stored"] is True
    out = run_json(capsys, ["report", str(path), "--tau", "fitted", "--tau", "1"])
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


def test_sweep_minimum_agrees_with_fit(data_file, capsys):
    path, _, _ = data_file
    fitted = run_json(capsys, ["fit", str(path), "--val-fraction", "1.0", "--no-write"])["temperature"]
    out = run_json(capsys, ["report", str(path), "--sweep", "0.5:8:41"])
    spacing = math.log(8 / 0.5) / 40
    best = out["sweep"]["best_nll_tau"]
    assert abs(math.log(best) - math.log(fitted)) <= spacing
    nlls = {r["tau"]: r["nll"] for r in out["results"]}
    assert nlls[best] == min(nlls[t] for t in out["sweep"]["taus"])
    taus = out["sweep"]["taus"]
    assert len(taus) == 41 and taus[0] == pytest.approx(0.5) and taus[-1] == pytest.approx(8)


def test_sweep_table_fits_80_columns(data_file):
    from rich.console import Console

    from tempcal.output.console import print_report
    from tempcal.workflows.report import report_file

    path, _, _ = data_file
    result = report_file(str(path), sweep=log_spaced(0.123456, 98.7654, 9), device="cpu")
    buffer = io.StringIO()
    print_report(result, Console(file=buffer, width=80, color_system=None))
    header, *lines = buffer.getvalue().splitlines()
    # The header names the file on one line however long its path; the tables fit 80 columns.
    assert header == f"{path}: 1500 samples, 8 classes, 15 bins"
    assert max(len(line) for line in lines) <= 80
    assert "…" not in buffer.getvalue()
    header = next(line for line in lines if "entropy" in line)
    assert all(name in header for name in ("tau", "NLL", "ECE", "MCE", "Brier", "acc", "conf", "entropy"))
    assert sum("min NLL" in line for line in lines) == 1
    assert len([line for line in lines if line.strip() and line.strip()[0].isdigit()]) == 9


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


def test_markdown_for_a_model_card(data_file, tmp_path, capsys):
    path, _, _ = data_file
    card, plot = tmp_path / "card" / "CALIBRATION.md", tmp_path / "figures" / "rel.png"
    card.parent.mkdir()
    plot.parent.mkdir()
    out = run_json(capsys, ["fit", str(path), "--no-write", "--markdown", str(card), "--plot", str(plot),
                            "--seed", "3", "--val-fraction", "0.4"])
    text = card.read_text()
    assert f"T = {out['temperature']:.6g}" in text
    assert "seed 3" in text and f"{out['n_fit']} samples" in text and f"other {out['n_eval']}" in text
    assert "](../figures/rel.png)" in text
    assert f"| ECE | {out['before']['ece']:.4f} | {out['after']['ece']:.4f} |" in text
    report_card = tmp_path / "report.md"
    assert main(["report", str(path), "--tau", "1", "--tau", "2", "--markdown", str(report_card), "--quiet"]) == 0
    assert report_card.read_text().count("\n| ") == 3  # header + two temperatures


def test_ece_objective_is_certified_against_a_dense_grid():
    from tempcal.core.ece_fit import minimise_ece

    logits, labels = miscalibrated(2000, 6, 2.0, seed=5)
    scan = tempcal.Scan(tempcal.as_logits_data(logits, labels), device="cpu")
    temperature, ece, certified = minimise_ece(scan, 2.0, bins=15, tol=1e-4)
    assert certified
    assert ece == pytest.approx(ece_loop(logits, labels, temperature)[0], abs=1e-9)
    correct = predictions(logits) == labels.numpy()
    grid = np.exp(np.linspace(math.log(2.0 / 100), math.log(2.0 * 100), 4001))
    dense = []
    for t in grid:
        confidence = probabilities(logits, t).max(1)
        index = np.clip(np.ceil(confidence * 15).astype(int) - 1, 0, 14)
        dense.append(sum(abs(correct[index == b].sum() - confidence[index == b].sum()) for b in range(15)) / 2000)
    assert ece <= min(dense) + 1e-4


def test_fit_objective_ece_uses_the_search(data_file, capsys):
    path, logits, labels = data_file
    out = run_json(capsys, ["fit", str(path), "--objective", "ece", "--val-fraction", "1.0", "--no-write"])
    assert out["objective"] == "ece" and out["converged"] is True
    assert out["after"]["ece"] == pytest.approx(ece_loop(logits, labels, out["temperature"])[0], abs=1e-9)
    nll_fit = run_json(capsys, ["fit", str(path), "--val-fraction", "1.0", "--no-write"])
    assert out["after"]["ece"] <= nll_fit["after"]["ece"]


def test_report_on_the_example_runs(tmp_path, capsys):
    copy = tmp_path / EXAMPLE.name
    shutil.copy(EXAMPLE, copy)
    out = run_json(capsys, ["report", str(copy), "--tau", "1"])
    assert out["n"] == sum(b["count"] for b in out["results"][0]["bins"])


def test_estimators_and_bootstrap_in_json(data_file, capsys):
    from reference import probabilities

    path, logits, labels = data_file
    out = run_json(capsys, ["report", str(path), "--tau", "1.5", "--estimators", "all", "--bootstrap", "200",
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
    again = run_json(capsys, ["report", str(path), "--tau", "1.5", "--bootstrap", "200", "--seed", "4"])
    assert again["results"][0]["nll_ci"] == row["nll_ci"]
    assert main(["report", str(path), "--estimators", "nope"]) == 2
