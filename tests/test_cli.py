"""The command line end to end: fast help, the shipped example, splits and the JSON contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from reference import ece_loop, optimal_temperature
from safetensors import safe_open

import tempcal
from tempcal.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "digits_logits.safetensors"


@pytest.mark.parametrize("argv", [["--help"], ["fit", "--help"], ["--version"]])
def test_help_does_not_import_torch(argv):
    code = (f"import sys\nfrom tempcal.cli.main import main\ncode = main({argv!r})\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "tempcal" in done.stdout


def test_python_dash_m_runs():
    done = subprocess.run([sys.executable, "-m", "tempcal", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("tempcal ")


def test_the_command_flushes_everything_before_its_fast_exit(tmp_path):
    """``tempcal`` ends with os._exit after flushing: JSON, files, errors and exit statuses all arrive."""
    copy = tmp_path / "digits.safetensors"
    copy.write_bytes(EXAMPLE.read_bytes())
    command = [sys.executable, "-m", "tempcal", "fit", str(copy), "--max-ece", "0", "--json", "-",
               "--markdown", str(tmp_path / "card.md")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr  # the gate: nothing reaches an ECE of 0
    report = json.loads(done.stdout)
    assert (tmp_path / "card.md").read_text().strip()
    assert tempcal.read_header(copy).stored_temperature() == report["temperature"]
    bad = subprocess.run([sys.executable, "-m", "tempcal", "fit", str(tmp_path / "missing.safetensors")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("error:")


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
    assert result["converged"] is True and result["passes"] >= 2
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


def test_probability_looking_logits_warn(tmp_path, capsys):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(300, 5, generator=g) * 2, 1)
    y = torch.multinomial(p, 1, generator=g)[:, 0]
    save_file({"logits": p, "labels": y}, str(tmp_path / "p.safetensors"))
    assert main(["fit", str(tmp_path / "p.safetensors"), "--no-write", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "looks like a probability vector" in err and "--probs" in err
    assert main(["fit", str(tmp_path / "p.safetensors"), "--no-write", "--quiet", "--probs"]) == 0
    assert "looks like" not in capsys.readouterr().err


def test_terminal_output_names_the_temperature_and_sizes(capsys):
    assert main(["fit", str(EXAMPLE), "--no-write"]) == 0
    out = capsys.readouterr().out
    assert "T = " in out and "fitted on" in out and "evaluated on" in out
    assert "reliability" in out and "ECE" in out


def test_a_long_path_keeps_the_header_on_one_line(tmp_path):
    """A checkout or data folder deep in the file system: the header is not broken at the terminal's width."""
    folder = tmp_path.joinpath(*["a-rather-long-folder-name"] * 6)
    folder.mkdir(parents=True)
    copy = folder / "digits.safetensors"
    copy.write_bytes(EXAMPLE.read_bytes())
    for command in (["fit", str(copy), "--no-write"], ["report", str(copy)]):
        done = subprocess.run([sys.executable, "-m", "tempcal", *command], capture_output=True, text=True,
                              env={**os.environ, "COLUMNS": "80"}, timeout=300)
        assert done.returncode == 0, done.stderr
        header = done.stdout.splitlines()[0]
        assert header.startswith(f"{copy}: ") and len(header) > 80
        assert ("fitted on 674 samples, evaluated on 674" in header) == (command[0] == "fit")


def test_objective_ece_lowers_ece_on_the_fitting_samples(capsys):
    assert main(["fit", str(EXAMPLE), "--val-fraction", "1.0", "--no-write", "--json", "-", "--objective", "ece"]) == 0
    by_ece = json.loads(capsys.readouterr().out)
    assert main(["fit", str(EXAMPLE), "--val-fraction", "1.0", "--no-write", "--json", "-"]) == 0
    by_nll = json.loads(capsys.readouterr().out)
    assert by_ece["objective"] == "ece"
    assert by_ece["after"]["ece"] <= by_nll["after"]["ece"] + 1e-12


class TestSplit:
    def test_sizes_and_stratification(self):
        labels = np.repeat(np.arange(5), [100, 50, 7, 1, 2])
        fit, held = tempcal.stratified_split(labels, 0.3, seed=1)
        assert len(fit) == round(0.3 * len(labels))
        assert len(np.intersect1d(fit, held)) == 0 and len(fit) + len(held) == len(labels)
        for c, n in zip(range(5), [100, 50, 7, 1, 2], strict=True):
            assert abs((labels[fit] == c).sum() - 0.3 * n) < 1

    def test_seeded_and_order_free(self):
        labels = np.random.default_rng(0).integers(0, 10, 1000)
        a = tempcal.stratified_split(labels, 0.5, seed=7)
        b = tempcal.stratified_split(labels, 0.5, seed=7)
        c = tempcal.stratified_split(labels, 0.5, seed=8)
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
        assert not np.array_equal(a[0], c[0])

    @pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5, float("nan")])
    def test_bad_fraction(self, fraction):
        with pytest.raises(tempcal.TempcalError):
            tempcal.stratified_split(np.zeros(10), fraction)


def test_readme_python_snippet_runs(tmp_path):
    readme = (ROOT / "README.md").read_text()
    snippet = readme.split("## Python API", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / EXAMPLE.name).write_bytes(EXAMPLE.read_bytes())
    done = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "calibrated.safetensors").exists()
    assert (tmp_path / "examples" / EXAMPLE.name).read_bytes() == EXAMPLE.read_bytes()


def test_plain_output_without_a_terminal_or_with_no_color(tmp_path):
    env = {**__import__("os").environ, "NO_COLOR": "1", "FORCE_COLOR": ""}
    env.pop("FORCE_COLOR")
    done = subprocess.run([sys.executable, "-m", "tempcal", "report", str(EXAMPLE)], capture_output=True, text=True,
                          env=env)
    assert done.returncode == 0 and "\x1b[" not in done.stdout and "NLL" in done.stdout
