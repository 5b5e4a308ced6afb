"""tempcal fit end to end: the example against scipy, --eval, the split, warnings, objectives, card, shards."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import EXAMPLE, write_shards
from reference import ece_loop, optimal_temperature
from safetensors import safe_open

import tempcal
from tempcal.cli.main import main


def test_example_end_to_end(tmp_path, capsys):
    before = EXAMPLE.read_bytes()
    out = tmp_path / "calibrated.safetensors"
    assert main(["fit", str(EXAMPLE), "--output", str(out), "--json", "-"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert EXAMPLE.read_bytes() == before
    with safe_open(str(out), "pt") as f:
        assert float(f.metadata()["tempcal.temperature"]) == result["temperature"]
        logits, labels = f.get_tensor("logits"), f.get_tensor("labels")
    # Fitted on the seeded stratified half: check T against scipy on exactly that half.
    fit_index, eval_index = tempcal.stratified_split(labels.numpy(), 0.5, 0)
    expected = optimal_temperature(logits[fit_index], labels[fit_index])
    assert abs(result["temperature"] - expected) / expected < 1e-6
    assert result["n_fit"] == len(fit_index) and result["n_eval"] == len(eval_index)
    assert result["n_fit"] + result["n_eval"] == len(labels)
    ece_before, _ = ece_loop(logits[eval_index], labels[eval_index], 1.0)
    ece_after, mce_after = ece_loop(logits[eval_index], labels[eval_index], result["temperature"])
    assert result["before"]["ece"] == pytest.approx(ece_before, abs=1e-9)
    assert result["after"]["ece"] == pytest.approx(ece_after, abs=1e-9)
    assert result["after"]["mce"] == pytest.approx(mce_after, abs=1e-9)
    assert result["converged"] is True and 1 <= result["passes"] <= 3
    assert result["after"]["nll"] < result["before"]["nll"]


def test_eval_file_fits_on_all_of_source(tmp_path, capsys):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(3)
    z = torch.randn(900, 4, generator=g) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
    z = z * 3
    save_file({"logits": z[:600].contiguous(), "labels": y[:600].contiguous()}, str(tmp_path / "fit.safetensors"))
    save_file({"logits": z[600:].contiguous(), "labels": y[600:].contiguous()}, str(tmp_path / "eval.safetensors"))
    code = main(["fit", str(tmp_path / "fit.safetensors"), "--eval", str(tmp_path / "eval.safetensors"),
                 "--no-write", "--json", "-"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n_fit"] == 600 and result["n_eval"] == 300
    expected = optimal_temperature(z[:600], y[:600])
    assert abs(result["temperature"] - expected) / expected < 1e-6


def test_val_fraction_one_fits_and_reports_on_everything(tmp_path, capsys):
    assert main(["fit", str(EXAMPLE), "--val-fraction", "1.0", "--no-write", "--json", "-"]) == 0
    result = json.loads(capsys.readouterr().out)
    with safe_open(str(EXAMPLE), "pt") as f:
        labels = f.get_tensor("labels")
    assert result["n_fit"] == result["n_eval"] == len(labels)


def test_probability_looking_logits_are_refused_unless_told(tmp_path, capsys):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(300, 5, generator=g) * 2, 1)
    y = torch.multinomial(p, 1, generator=g)[:, 0]
    path = tmp_path / "p.safetensors"
    save_file({"logits": p, "labels": y}, str(path))
    data = path.read_bytes()
    assert main(["fit", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "looks like a probability vector" in err and "pass --probs, or --no-probs" in err
    assert path.read_bytes() == data  # refused before anything was written
    for flag in ("--probs", "--no-probs"):
        assert main(["fit", str(path), "--no-write", "--quiet", flag]) == 0
        assert "looks like" not in capsys.readouterr().err


def test_terminal_output_names_the_temperature_and_sizes(capsys):
    assert main(["fit", str(EXAMPLE), "--no-write"]) == 0
    out = capsys.readouterr().out
    assert "T = " in out and "T fitted on 674 rows" in out and "on the 674 held-out rows" in out
    assert "reliability" in out and "ECE" in out


@pytest.mark.slow  # test_fit_objective_ece_uses_the_search checks the same, and against a reference, in half the time
def test_objective_ece_lowers_ece_on_the_fitting_samples(capsys):
    assert main(["fit", str(EXAMPLE), "--val-fraction", "1.0", "--no-write", "--json", "-", "--objective", "ece"]) == 0
    by_ece = json.loads(capsys.readouterr().out)
    assert main(["fit", str(EXAMPLE), "--val-fraction", "1.0", "--no-write", "--json", "-"]) == 0
    by_nll = json.loads(capsys.readouterr().out)
    assert by_ece["objective"] == "ece"
    assert by_ece["after"]["ece"] <= by_nll["after"]["ece"] + 1e-12


def test_fit_objective_ece_uses_the_search(data_file, run_json):
    path, logits, labels = data_file
    out = run_json(["fit", str(path), "--objective", "ece", "--val-fraction", "1.0", "--no-write"])
    assert out["objective"] == "ece" and out["converged"] is True
    assert out["after"]["ece"] == pytest.approx(ece_loop(logits, labels, out["temperature"])[0], abs=1e-9)
    nll_fit = run_json(["fit", str(path), "--val-fraction", "1.0", "--no-write"])
    assert out["after"]["ece"] <= nll_fit["after"]["ece"]


def test_markdown_for_a_model_card(data_file, tmp_path, run_json):
    path, _, _ = data_file
    card, plot = tmp_path / "card" / "CALIBRATION.md", tmp_path / "figures" / "rel.png"
    card.parent.mkdir()
    plot.parent.mkdir()
    out = run_json(["fit", str(path), "--no-write", "--markdown", str(card), "--plot", str(plot),
                            "--seed", "3", "--val-fraction", "0.4"])
    text = card.read_text()
    assert f"T = {out['temperature']:.6g}" in text
    assert "seed 3" in text and f"{out['n_fit']} samples" in text
    assert f"evaluated on the {out['n_eval']} held-out rows" in text
    assert "](../figures/rel.png)" in text
    assert f"| ECE | {out['before']['ece']:.4f} | {out['after']['ece']:.4f} |" in text
    report_card = tmp_path / "report.md"
    assert main(["report", str(path), "--tau", "1", "--tau", "2", "--markdown", str(report_card), "--quiet"]) == 0
    assert report_card.read_text().count("\n| ") == 3  # header + two temperatures


def test_cli_on_a_glob_of_shards_writes_each_shard(tmp_path, capsys, reads):
    paths, logits, labels = write_shards(tmp_path, [400, 300, 500])
    assert main(["fit", str(tmp_path / "part-*.safetensors"), "--val-fraction", "1.0", "--json", "-",
                 "--chunk-rows", "64"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_fit"] == len(labels)
    assert abs(out["temperature"] - optimal_temperature(logits, labels)) / out["temperature"] < 1e-6
    assert out["after"]["ece"] == pytest.approx(ece_loop(logits, labels, out["temperature"])[0], abs=1e-9)
    for path in paths:
        with safe_open(str(path), "pt") as f:
            assert float(f.metadata()["tempcal.temperature"]) == out["temperature"]
