"""Messages that point where the user should go, each met as a user meets it: ``ood`` on an in-distribution set without
labels, a fit under another ``--lm-eval-norm`` than the stored T's, ``--tau fitted`` on an ``.npz``, hidden states given
without ``--head``, and the release folder's commands without warnings."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import EXAMPLES, assert_one_error_line, hidden_and_head, id_ood_logits, miscalibrated, write_logits
from lm_eval_logs import random_mc_records, write_log
from reference import ref_msp, sk_figures
from safetensors.torch import save_file


def test_ood_scores_an_unlabelled_in_distribution_set(tmp_path, run_json):
    """Deployment traffic has no labels, and no OOD score uses them: the figures equal those of the labelled file."""
    z_id, y, z_ood = id_ood_logits()
    save_file({"logits": z_id, "labels": y}, str(tmp_path / "labelled.safetensors"))
    save_file({"logits": z_id}, str(tmp_path / "traffic.safetensors"))
    save_file({"logits": z_ood}, str(tmp_path / "ood.safetensors"))
    unlabelled = run_json(["ood", str(tmp_path / "traffic.safetensors"), "--ood", str(tmp_path / "ood.safetensors"),
                           "--tau", "1", "--tau", "2", "--score", "all"])
    labelled = run_json(["ood", str(tmp_path / "labelled.safetensors"), "--ood", str(tmp_path / "ood.safetensors"),
                         "--tau", "1", "--tau", "2", "--score", "all"])
    for a, b in zip(unlabelled["results"], labelled["results"], strict=True):
        assert {k: a[k] for k in ("tau", "score", "auroc", "fpr95")} == {k: b[k] for k in ("tau", "score", "auroc",
                                                                                            "fpr95")}
    msp = next(r for r in unlabelled["results"] if r["score"] == "msp" and r["tau"] == 2)
    assert msp["auroc"] == pytest.approx(sk_figures(ref_msp(z_id.numpy(), 2), ref_msp(z_ood.numpy(), 2))["auroc"],
                                         abs=1e-9)


@pytest.mark.parametrize("kind", ["npz", "pt"])
def test_ood_takes_unlabelled_files_of_other_formats(tmp_path, run_json, kind):
    z_id, _, z_ood = id_ood_logits(seed=3)
    folder = tmp_path / "id"
    folder.mkdir()
    id_path = write_logits(kind, folder, z_id.numpy(), np.zeros(len(z_id), np.int64), labels_key="unused")
    save_file({"logits": z_ood}, str(tmp_path / "ood.safetensors"))
    out = run_json(["ood", str(id_path), "--ood", str(tmp_path / "ood.safetensors"), "--tau", "1"])
    assert out["results"][0]["auroc"] == pytest.approx(
        sk_figures(ref_msp(z_id.numpy(), 1), ref_msp(z_ood.numpy(), 1))["auroc"], abs=1e-9)


def test_a_fit_under_another_normalisation_says_nothing_of_the_old_t(tmp_path, cli):
    records, _, _ = random_mc_records(80, seed=6)
    path = write_log(tmp_path / "samples_piqa_2024-09-05T12-34-56.jsonl", records)
    code, _, err = cli(["fit", str(path), "-q"])
    assert code == 0, err
    code, _, err = cli(["fit", str(path), "--lm-eval-norm", "chars", "--no-write"])
    assert code == 0 and "warning" not in err, err  # the fit replaces that T: nothing to warn about
    code, _, err = cli(["report", str(path), "--lm-eval-norm", "chars"])
    assert code == 0 and "fitted with --lm-eval-norm none, so it is ignored here" in err  # ... where it is used


@pytest.mark.parametrize("kind", ["npz", "pt", "npy"])
def test_tau_fitted_without_a_stored_t_names_the_sidecar(tmp_path, cli, kind):
    logits, labels = miscalibrated(100, 3, 2.0)
    path = write_logits(kind, tmp_path, logits.numpy(), labels.numpy())
    code, _, err = cli(["report", str(path), "--tau", "fitted"])
    assert code == 2
    line = assert_one_error_line(err, "has no stored temperature", f"the sidecar {path}.tempcal.json; there is none")
    assert "metadata 'tempcal.temperature'" not in line


def test_tau_fitted_after_the_file_changed_says_its_sidecar_is_stale(tmp_path, cli):
    logits, labels = miscalibrated(100, 3, 2.0)
    path = write_logits("npz", tmp_path, logits.numpy(), labels.numpy())
    assert cli(["fit", str(path), "-q"])[0] == 0
    np.savez(path, logits=logits.numpy() * 2, labels=labels.numpy())
    code, _, err = cli(["report", str(path), "--tau", "fitted"])
    assert code == 2
    assert "written for a different version of the file, so its T is ignored: run tempcal fit again" in err


def test_tau_fitted_on_safetensors_still_names_the_metadata(tmp_path, cli):
    logits, labels = miscalibrated(100, 3, 2.0)
    path = write_logits("safetensors", tmp_path, logits, labels)
    code, _, err = cli(["ood", str(path), "--ood", str(path), "--tau", "fitted"])
    assert code == 2
    assert_one_error_line(err, "has no stored temperature (metadata 'tempcal.temperature'; run tempcal fit first)")


@pytest.mark.parametrize("command", [["fit"], ["report"], ["ood", "--ood", "OOD"]])
def test_hidden_states_without_head_point_at_head(tmp_path, cli, command):
    h, _, _, y = hidden_and_head(40, 6, 10)
    path = tmp_path / "hidden.safetensors"
    save_file({"hidden": h, "labels": y}, str(path))
    argv = [a if a != "OOD" else str(path) for a in command]
    code, _, err = cli([argv[0], str(path), *argv[1:]])
    assert code == 2
    line = assert_one_error_line(err, "holds hidden states 'hidden' [40, 6] and no logits 'logits'", "--head HEAD")
    assert line.index("--head") < line.index("--logits-key")


def test_the_release_folder_runs_without_warnings(tmp_path, cli, monkeypatch):
    """The shipped release example (its script copies shipped logits): fit, report and ood warn about nothing, and
    nothing on its path loads a TorchScript model (whose loading torch deprecates)."""
    release = EXAMPLES / "release"
    assert "torch" not in (release / "make_release_data.py").read_text()
    shutil.copy(release / "tempcal.toml", tmp_path / "tempcal.toml")
    shutil.copy(EXAMPLES / "digits_logits.safetensors", tmp_path / "val.safetensors")
    shutil.copy(EXAMPLES / "digits_noise_logits.safetensors", tmp_path / "noise.safetensors")
    monkeypatch.chdir(tmp_path)
    for command in (["fit"], ["report"], ["ood", "--tau", "2"]):
        code, _, err = cli([*command, "-q"])
        assert code == 0, err
        assert [line for line in err.splitlines() if not line.startswith("config: ")] == [], err


@pytest.mark.parametrize("missing", ["matplotlib", "jinja2"])
def test_html_without_its_extra_names_the_html_extra(tmp_path, cli, monkeypatch, missing):
    """The README installs the page's dependencies as tempcal[html]; the hint must name that extra, for either one."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else find_spec(name, *a))
    path = tmp_path / "digits.safetensors"
    shutil.copyfile(EXAMPLES / "digits_logits.safetensors", path)
    code, _, err = cli(["fit", str(path), "--html", str(tmp_path / "page.html")])
    assert code == 2
    assert_one_error_line(err, f"needs {missing}, which is not installed", "pip install 'tempcal[html]'")
    assert not (tmp_path / "page.html").exists()
