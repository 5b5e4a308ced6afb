"""``report`` after ``fit``: a note when the figures include the rows T was fitted on, and ``--eval-rows``.

The held-out rows are checked independently: scipy's float64 optimum on the rows the split gives for fitting is
the stored T, and the report's figures over ``--eval-rows`` are numpy's over the other rows.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import miscalibrated, snapshot
from reference import ece_loop, nll_at, optimal_temperature
from safetensors.torch import load_file, save_file

from tempcal.cli.main import main
from tempcal.core.splitting import stratified_split


@pytest.fixture
def fitted(tmp_path, capsys):
    """A file fitted with the default split (``--seed 3``): (path, logits, labels)."""
    logits, labels = miscalibrated(900, 6, 2.2, seed=5)
    path = tmp_path / "val.safetensors"
    save_file({"logits": logits, "labels": labels, "site": torch.arange(900) % 4}, str(path))
    assert main(["fit", str(path), "--seed", "3", "-q"]) == 0
    capsys.readouterr()
    return path, logits, labels


def _report(capsys, *argv) -> tuple[int, dict | None, str]:
    code = main(["report", *argv, "--json", "-"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def test_eval_rows_are_the_rows_the_stored_t_was_not_fitted_on(fitted, capsys):
    path, logits, labels = fitted
    z, y = logits.double().numpy(), labels.numpy()
    fit_rows, held_out = stratified_split(y, 0.5, 3)
    code, out, _ = _report(capsys, str(path), "--eval-rows", "--tau", "fitted", "--tau", "1")
    assert code == 0 and out is not None
    stored = out["stored_temperature"]
    assert stored == pytest.approx(optimal_temperature(z[fit_rows], y[fit_rows]), rel=1e-6)
    assert out["n"] == len(held_out) == 900 - len(fit_rows) and out["eval_rows"] is True
    for row in out["results"]:
        assert row["nll"] == pytest.approx(nll_at(z[held_out], y[held_out], row["tau"]), rel=1e-9)
        ece, _ = ece_loop(logits[held_out], labels[held_out], row["tau"])
        assert row["ece"] == pytest.approx(ece, abs=1e-9)
    assert not any("fitted on" in w for w in out["warnings"])


def test_a_report_over_every_row_says_it_includes_the_fitting_rows(fitted, capsys):
    path, _, _ = fitted
    code, out, err = _report(capsys, str(path))
    assert code == 0 and out is not None and out["n"] == 900 and out["eval_rows"] is False
    [note] = [w for w in out["warnings"] if "fitted on" in w]
    assert "450 of its 900 rows" in note and "--seed 3" in note and "--eval-rows" in note
    assert "--eval-rows" in err and "--seed 3" in err
    code, out, _ = _report(capsys, str(path), "--tau", "1.5")  # the stored T is not shown: nothing to say
    assert code == 0 and out is not None and not any("fitted on" in w for w in out["warnings"])


@pytest.mark.parametrize("fit_argv", [["--val-fraction", "1"], ["--folds", "3"]])
def test_eval_rows_refused_when_no_rows_were_held_out(tmp_path, capsys, fit_argv):
    logits, labels = miscalibrated(300, 4, 2.0, seed=1)
    path = tmp_path / "all.safetensors"
    save_file({"logits": logits, "labels": labels}, str(path))
    assert main(["fit", str(path), *fit_argv, "-q"]) == 0
    capsys.readouterr()
    code, out, _ = _report(capsys, str(path))
    assert code == 0 and out is not None
    assert any("all 300 of its rows" in w and "in-sample" in w for w in out["warnings"])
    code, _, err = _report(capsys, str(path), "--eval-rows")
    assert code == 2 and "none are held out" in err and "Traceback" not in err


def test_eval_rows_after_a_fit_on_another_file(tmp_path, capsys):
    logits, labels = miscalibrated(400, 4, 2.0, seed=2)
    path, other = tmp_path / "fit.safetensors", tmp_path / "other.safetensors"
    save_file({"logits": logits[:200].contiguous(), "labels": labels[:200].contiguous()}, str(path))
    save_file({"logits": logits[200:].contiguous(), "labels": labels[200:].contiguous()}, str(other))
    assert main(["fit", str(path), "--eval", str(other), "-q"]) == 0
    capsys.readouterr()
    code, _, err = _report(capsys, str(path), "--eval-rows")
    assert code == 2 and "all 200 of its rows" in err


def test_eval_rows_without_a_stored_split(tmp_path, capsys):
    logits, labels = miscalibrated(200, 4, 2.0, seed=3)
    path = tmp_path / "bare.safetensors"
    save_file({"logits": logits, "labels": labels}, str(path), metadata={"tempcal.temperature": "1.7"})
    code, _, err = _report(capsys, str(path), "--eval-rows")
    assert code == 2 and "has no stored split" in err


def test_eval_rows_refused_when_the_file_changed(fitted, capsys):
    path, _, _ = fitted
    header = dict(json.loads(path.read_bytes()[8:8 + int.from_bytes(path.read_bytes()[:8], "little")])["__metadata__"])
    tensors = load_file(str(path))
    fewer = {k: v[:800].contiguous() for k, v in tensors.items()}
    save_file(fewer, str(path), metadata=header)  # the same stored T and split, 100 rows fewer
    before = snapshot(path.parent)
    code, _, err = _report(capsys, str(path), "--eval-rows")
    assert code == 2 and "has 800 rows that count" in err and "split 900" in err
    relabelled = {**tensors, "labels": tensors["labels"].flip(0).contiguous()}
    save_file(relabelled, str(path), metadata=header)  # as many rows, other labels: another split
    code, _, err = _report(capsys, str(path), "--eval-rows")
    assert code == 2 and "labels are not those" in err
    assert set(snapshot(path.parent)) == set(before)  # nothing written beside the file


@pytest.mark.parametrize("text", ['{"fit": "split", "rows": 900}', "[1, 2]", '{"fit": "split", "val_fraction": 2, '
                                  '"seed": 0, "rows": 900, "n_fit": 450}', "{" * 5000])
def test_a_broken_stored_split(fitted, capsys, text):
    path, _, _ = fitted
    tensors = load_file(str(path))
    save_file(tensors, str(path), metadata={"tempcal.temperature": "2.0", "tempcal.split": text})
    code, _, err = _report(capsys, str(path), "--eval-rows")
    assert code == 2 and "tempcal.split" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    code, out, _ = _report(capsys, str(path))  # without --eval-rows the report goes on, saying so
    assert code == 0 and out is not None and any("tempcal.split" in w for w in out["warnings"])


def test_eval_rows_with_groups(tmp_path, capsys):
    logits, labels = miscalibrated(800, 5, 2.0, seed=9)
    site = torch.arange(800) % 3
    logits = logits * (1.0 + 0.5 * site[:, None].float())  # each site miscalibrated its own way
    path = tmp_path / "sites.safetensors"
    save_file({"logits": logits, "labels": labels, "site": site}, str(path))
    assert main(["fit", str(path), "--group-by", "site", "--group-prior", "0", "-q"]) == 0
    capsys.readouterr()
    code, out, _ = _report(capsys, str(path), "--eval-rows", "--group-by", "site")
    assert code == 0 and out is not None
    z, y, s = logits.double().numpy(), labels.numpy(), site.numpy()
    fit_rows, held_out = stratified_split(y, 0.5, 0)
    at_global, row = out["results"]
    assert not at_global["per_group"] and at_global["basis"]["rows"] == row["basis"]["rows"] == "held out"
    assert row["per_group"] is True and sum(g["n"] for g in row["groups"]) == len(held_out) == out["n"]
    for g in row["groups"]:
        mine_fit = fit_rows[s[fit_rows] == int(g["group"])]
        mine = held_out[s[held_out] == int(g["group"])]
        assert g["tau"] == pytest.approx(optimal_temperature(z[mine_fit], y[mine_fit]), rel=1e-5)
        assert g["n"] == len(mine) and g["nll"] == pytest.approx(nll_at(z[mine], y[mine], g["tau"]), rel=1e-9)


def test_eval_rows_for_a_sidecar_file(tmp_path, capsys):
    logits, labels = miscalibrated(500, 4, 2.5, seed=4)
    path = tmp_path / "val.npz"
    np.savez(path, logits=logits.numpy(), labels=labels.numpy())
    assert main(["fit", str(path), "-q"]) == 0
    capsys.readouterr()
    code, out, _ = _report(capsys, str(path), "--eval-rows")
    z, y = logits.double().numpy(), labels.numpy()
    _, held_out = stratified_split(y, 0.5, 0)
    assert code == 0 and out is not None and out["n"] == len(held_out)
    assert out["results"][0]["nll"] == pytest.approx(nll_at(z[held_out], y[held_out], out["results"][0]["tau"]),
                                                     rel=1e-9)


def test_eval_rows_in_a_configuration_file(fitted, capsys, monkeypatch):
    path, _, labels = fitted
    (path.parent / "tempcal.toml").write_text("[report]\neval-rows = true\n")
    monkeypatch.chdir(path.parent)
    code, out, _ = _report(capsys, str(path))
    assert code == 0 and out is not None and out["n"] == len(stratified_split(labels.numpy(), 0.5, 3)[1])
