"""tempcal ood: every score against scikit-learn and numpy references, the stored T, gates, bootstrap intervals,
ReAct, score files, plots, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import OOD_CLASSES as C
from conftest import hidden_and_head
from reference import ref_auroc, ref_energy, ref_fpr95, ref_msp, ref_scores, sk_figures
from safetensors import safe_open
from safetensors.torch import save_file

from tempcal.cli.main import main
from tempcal.io.safetensors_header import write_temperature


def test_binary_single_logit_msp_is_max_of_sigmoid(tmp_path, run_json):
    g = torch.Generator().manual_seed(2)
    z_id, z_ood = 4 * torch.randn(150, generator=g), torch.randn(90, 1, generator=g)  # [N] and [N, 1]
    save_file({"logits": z_id, "labels": (z_id > 0).long()}, str(tmp_path / "id.safetensors"))
    save_file({"logits": z_ood}, str(tmp_path / "ood.safetensors"))
    result = run_json(["ood", str(tmp_path / "id.safetensors"), "--ood", str(tmp_path / "ood.safetensors"),
                               "--tau", "1", "--tau", "2.5", "--score", "both", "--scores", str(tmp_path / "s.st")])
    assert result["binary"] is True and result["num_classes"] == 2
    with safe_open(str(tmp_path / "s.st"), "pt") as f:
        for tau, name in ((1.0, "1"), (2.5, "2.5")):
            for side, z in (("id", z_id.double().numpy()), ("ood.0", z_ood[:, 0].double().numpy())):
                sig = 1 / (1 + np.exp(-z / tau))
                np.testing.assert_allclose(f.get_tensor(f"{side}.msp.tau={name}").numpy(), np.maximum(sig, 1 - sig),
                                           rtol=1e-12)
                np.testing.assert_allclose(f.get_tensor(f"{side}.energy.tau={name}").numpy(),
                                           tau * np.logaddexp(0, z / tau), rtol=1e-12)


def test_cli_results_match_references(ood_files, run_json):
    id_path, ood_path, z_id, z_ood = ood_files
    result = run_json(["ood", str(id_path), "--ood", str(ood_path), "--tau", "1", "--tau", "4",
                               "--score", "both"])
    assert [(r["score"], r["tau"]) for r in result["results"]] == [("msp", 1.0), ("msp", 4.0),
                                                                  ("energy", 1.0), ("energy", 4.0)]
    for row in result["results"]:
        ref = ref_msp if row["score"] == "msp" else ref_energy
        a, b = ref(z_id.numpy(), row["tau"]), ref(z_ood.numpy(), row["tau"])
        sk = sk_figures(a, b)
        for key in ("auroc", "aupr_in", "aupr_out"):
            assert row[key] == pytest.approx(sk[key], abs=1e-9), key
        assert row["fpr95"] == ref_fpr95(a, b)
        assert row["mean_id"] == pytest.approx(a.mean(), rel=1e-12)
        assert row["mean_ood"] == pytest.approx(b.mean(), rel=1e-12)
        assert row["ood_file"] == str(ood_path) and row["n_id"] == 300 and row["n_ood"] == 200
    assert result["stored_temperature"] is None
    for best in result["best"]:
        rows = [r for r in result["results"] if r["score"] == best["score"]]
        assert best["auroc"] == max(r["auroc"] for r in rows)
        assert "stores no calibration temperature" in best["sentence"]


def test_default_sweep_and_fitted_read_the_stored_temperature(ood_files, tmp_path, run_json):
    id_path, ood_path, z_id, z_ood = ood_files
    calibrated = tmp_path / "calibrated.safetensors"
    write_temperature(id_path, 3.25, output=calibrated)
    result = run_json(["ood", str(calibrated), "--ood", str(ood_path)])
    taus = result["taus"]
    assert 1.0 in taus and 3.25 in taus and taus == sorted(set(taus)) and len(taus) >= 5
    assert result["stored_temperature"] == 3.25 and result["taus_from"] == "default sweep"
    assert [r["tau"] for r in result["results"]] == taus
    at_t = next(r for r in result["results"] if r["tau"] == 3.25)
    assert at_t["auroc"] == pytest.approx(sk_figures(ref_msp(z_id, 3.25), ref_msp(z_ood, 3.25))["auroc"], abs=1e-9)
    best = result["best"][0]
    assert best["calibration_tau"] == 3.25 and best["calibration_auroc"] == at_t["auroc"]
    assert "T = 3.25" in best["sentence"] and str(ood_path) in best["sentence"]
    fitted = run_json(["ood", str(calibrated), "--ood", str(ood_path), "--tau", "fitted", "--tau", "1"])
    assert [r["tau"] for r in fitted["results"]] == [3.25, 1.0]
    assert fitted["results"][0]["auroc"] == at_t["auroc"]


def test_several_ood_files_one_block_each(ood_files, tmp_path, run_json):
    id_path, ood_path, z_id, _ = ood_files
    g = torch.Generator().manual_seed(5)
    z_far = 0.3 * torch.randn(120, C, generator=g)
    save_file({"logits": z_far, "labels": torch.zeros(120, dtype=torch.int64)}, str(tmp_path / "far.safetensors"))
    far = tmp_path / "far.safetensors"
    both = run_json(["ood", str(id_path), "--ood", str(ood_path), "--ood", str(far), "--tau", "2"])
    assert [r["ood_file"] for r in both["results"]] == [str(ood_path), str(far)]
    assert [b["ood_file"] for b in both["best"]] == [str(ood_path), str(far)]
    assert both["n_ood"] == [200, 120]
    alone = run_json(["ood", str(id_path), "--ood", str(far), "--tau", "2"])
    assert both["results"][1] == alone["results"][0]
    assert both["results"][1]["auroc"] == pytest.approx(
        ref_auroc(ref_msp(z_id, 2.0), ref_msp(z_far, 2.0)), abs=1e-12)


def test_scores_file_contents(ood_files, tmp_path, run_json):
    id_path, ood_path, z_id, z_ood = ood_files
    out = tmp_path / "scores.safetensors"
    result = run_json(["ood", str(id_path), "--ood", str(ood_path), "--tau", "0.5", "--tau", "2",
                               "--score", "both", "--scores", str(out)])
    assert result["scores_file"] == str(out)
    with safe_open(str(out), "pt") as f:
        keys = set(f.keys())
        assert keys == {f"{side}.{s}.tau={t}" for side in ("id", "ood.0") for s in ("msp", "energy")
                        for t in ("0.5", "2")}
        assert f.metadata()["tempcal.ood.0"] == str(ood_path)
        for t in (0.5, 2.0):
            name = "0.5" if t == 0.5 else "2"
            np.testing.assert_allclose(f.get_tensor(f"id.msp.tau={name}").numpy(), ref_msp(z_id, t), rtol=1e-12)
            np.testing.assert_allclose(f.get_tensor(f"ood.0.energy.tau={name}").numpy(), ref_energy(z_ood, t),
                                       rtol=1e-12)
            assert f.get_tensor(f"id.msp.tau={name}").dtype == torch.float64
        assert "tempcal.gen_gamma" not in f.metadata()  # GEN's settings only when GEN was scored
    run_json(["ood", str(id_path), "--ood", str(ood_path), "--tau", "2", "--score", "gen", "--gen-gamma", "0.2",
              "--gen-top", "3", "--scores", str(out)])
    with safe_open(str(out), "pt") as f:
        assert set(f.keys()) == {"id.gen.tau=2", "ood.0.gen.tau=2"}
        assert (f.metadata()["tempcal.gen_gamma"], f.metadata()["tempcal.gen_top"]) == ("0.2", "3")


def test_plot_writes_a_png(ood_files, tmp_path, capsys):
    id_path, ood_path, _, _ = ood_files
    out = tmp_path / "ood.png"
    capsys.readouterr()
    assert main(["ood", str(id_path), "--ood", str(ood_path), "--score", "both", "--plot", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert f"wrote the plot to {out}" in capsys.readouterr().out


def test_help_does_not_import_torch():
    code = ("import sys\nfrom tempcal.cli.main import main\ncode = main(['ood', '--help'])\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "--ood" in done.stdout


@pytest.mark.parametrize("score, names", [("all", ["msp", "energy", "maxlogit", "entropy", "gen"]),
                                          ("gen,msp", ["gen", "msp"]), ("maxlogit", ["maxlogit"]),
                                          ("entropy,both", ["entropy", "msp", "energy"])])
def test_every_score_against_the_reference(ood_files, run_json, score, names):
    id_path, ood_path, z_id, z_ood = ood_files
    result = run_json(["ood", str(id_path), "--ood", str(ood_path), "--tau", "0.7", "--tau", "3", "--score", score,
                       "--gen-gamma", "0.25", "--gen-top", "4"])
    assert result["scores"] == names and result["gen_gamma"] == 0.25 and result["gen_top"] == 4
    assert [(r["score"], r["tau"]) for r in result["results"]] == [(n, t) for n in names for t in (0.7, 3.0)]
    for row in result["results"]:
        a = ref_scores(z_id.numpy(), row["tau"], gamma=0.25, top=4)[row["score"]]
        b = ref_scores(z_ood.numpy(), row["tau"], gamma=0.25, top=4)[row["score"]]
        sk = sk_figures(a, b)
        for key in ("auroc", "aupr_in", "aupr_out"):
            assert row[key] == pytest.approx(sk[key], abs=1e-9), (row["score"], key)
        assert row["fpr95"] == ref_fpr95(a, b)


def test_binary_single_logit_is_classes_zero_and_z_for_every_score(tmp_path, run_json):
    g = torch.Generator().manual_seed(12)
    z_id, z_ood = 4 * torch.randn(150, generator=g), torch.randn(90, 1, generator=g)
    save_file({"logits": z_id, "labels": (z_id > 0).long()}, str(tmp_path / "id.safetensors"))
    save_file({"logits": z_ood}, str(tmp_path / "ood.safetensors"))
    out = tmp_path / "s.safetensors"
    result = run_json(["ood", str(tmp_path / "id.safetensors"), "--ood", str(tmp_path / "ood.safetensors"),
                       "--tau", "0.5", "--tau", "2", "--score", "all", "--scores", str(out)])
    assert result["binary"] is True
    with safe_open(str(out), "pt") as f:
        for tau, label in ((0.5, "0.5"), (2.0, "2")):
            for side, z in (("id", z_id.double().numpy()), ("ood.0", z_ood[:, 0].double().numpy())):
                pair = np.stack([np.zeros_like(z), z], axis=1)
                for name, want in ref_scores(pair, tau).items():
                    np.testing.assert_allclose(f.get_tensor(f"{side}.{name}.tau={label}").numpy(), want, rtol=1e-10,
                                               err_msg=name)


def test_gates_exit_3_name_the_failing_rows_and_still_write_the_json(ood_files, tmp_path, cli):
    id_path, ood_path, _, _ = ood_files
    out = tmp_path / "ood.json"
    code, _, err = cli(["ood", str(id_path), "--ood", str(ood_path), "--tau", "0.5", "--tau", "4", "--score", "both",
                        "--min-auroc", "0.9", "--max-fpr95", "0.5", "--json", str(out), "-q"])
    result = json.loads(out.read_text())
    failing = [r for r in result["results"] if r["auroc"] < 0.9 or r["fpr95"] > 0.5]
    assert code == 3 and failing and result["gate_passed"] is False
    assert result["min_auroc"] == 0.9 and result["max_fpr95"] == 0.5
    lines = err.splitlines()
    assert lines[0] == f"gate failed: {len(failing)} of 4 reported rows fail --min-auroc 0.9, --max-fpr95 0.5:"
    assert len(lines) == 1 + len(failing) == 1 + len(result["gate_failures"])
    for line, row in zip(lines[1:], failing, strict=True):
        assert line.startswith(f"  {ood_path}, ") and f"tau = {row['tau']:g}" in line
        assert ("is below 0.9" in line) == (row["auroc"] < 0.9) and ("is above 0.5" in line) == (row["fpr95"] > 0.5)
    # the same rows pass a looser gate: exit 0
    code, out_text, err = cli(["ood", str(id_path), "--ood", str(ood_path), "--tau", "0.5", "--tau", "4",
                               "--score", "both", "--min-auroc", "0.1", "--json", "-"])
    assert code == 0 and json.loads(out_text)["gate_passed"] is True and err == ""


def test_bootstrap_intervals_are_seeded(ood_files, run_json):
    id_path, ood_path, _, _ = ood_files
    argv = ["ood", str(id_path), "--ood", str(ood_path), "--tau", "1", "--score", "msp,maxlogit", "--bootstrap", "40"]
    a, b, c = run_json([*argv, "--seed", "5"]), run_json([*argv, "--seed", "5"]), run_json([*argv, "--seed", "6"])
    assert a["bootstrap"] == {"resamples": 40, "seed": 5, "level": 0.95}
    for row in a["results"]:
        assert row["auroc_ci"][0] <= row["auroc"] <= row["auroc_ci"][1]
        assert row["fpr95_ci"][0] <= row["fpr95_ci"][1]
    assert [r["auroc_ci"] for r in a["results"]] == [r["auroc_ci"] for r in b["results"]]
    assert [r["auroc_ci"] for r in a["results"]] != [r["auroc_ci"] for r in c["results"]]
    assert "auroc_ci" not in run_json(argv[:-2])["results"][0]


def test_react_on_hidden_states(tmp_path, run_json):
    h, w, b, y = hidden_and_head(500, 12, 30, seed=6)
    h = torch.relu(2 * h)
    h_ood = torch.relu(3 * torch.randn(200, 12, generator=torch.Generator().manual_seed(1)))
    save_file({"hidden": h, "labels": y}, str(tmp_path / "hidden.safetensors"))
    save_file({"hidden": h_ood}, str(tmp_path / "ood.safetensors"))
    save_file({"weight": w, "bias": b}, str(tmp_path / "head.safetensors"))
    threshold = float(np.percentile(h.numpy(), 90))
    clipped = {"hidden": h.clamp_max(threshold), "ood": h_ood.clamp_max(threshold)}
    save_file({"logits": clipped["hidden"] @ w.T + b, "labels": y}, str(tmp_path / "z.safetensors"))
    save_file({"logits": clipped["ood"] @ w.T + b}, str(tmp_path / "z_ood.safetensors"))
    result = run_json(["ood", str(tmp_path / "hidden.safetensors"), "--head", str(tmp_path / "head.safetensors"),
                       "--ood", str(tmp_path / "ood.safetensors"), "--react", "90", "--score", "all", "--tau", "1"])
    assert result["react_threshold"] == threshold and result["react_percentile"] == 90
    assert result["react_passes"] == 2
    logits = run_json(["ood", str(tmp_path / "z.safetensors"), "--ood", str(tmp_path / "z_ood.safetensors"),
                       "--score", "all", "--tau", "1"])
    assert logits["react_threshold"] is None
    for x, y_ in zip(result["results"], logits["results"], strict=True):
        for key in ("auroc", "aupr_in", "aupr_out", "fpr95"):
            assert x[key] == pytest.approx(y_[key], abs=1e-6)


def test_plot_histograms_only_at_each_score_s_best_tau_and_the_calibration_t(ood_files, tmp_path, monkeypatch):
    """All five scores, two OOD files and a stored T: 4 curve panels (AUROC and FPR95 per file) and, per file and
    score, histograms at its best tau and at the calibration T (one panel when they coincide), not at every tau."""
    from tempcal.output import ood_plots

    id_path, ood_path, _, z_ood = ood_files
    far = tmp_path / "far.safetensors"
    save_file({"logits": 0.3 * z_ood}, str(far))
    calibrated = tmp_path / "calibrated.safetensors"
    write_temperature(id_path, 2.5, output=calibrated)
    figures = []
    save = ood_plots._save
    monkeypatch.setattr(ood_plots, "_save", lambda fig, path, dpi=120: (figures.append(fig), save(fig, path, dpi))[1])
    out = tmp_path / "ood.png"
    assert main(["ood", str(calibrated), "--ood", str(ood_path), "--ood", str(far), "--score", "all",
                 "--plot", str(out), "--json", str(tmp_path / "ood.json")]) == 0
    result = json.loads((tmp_path / "ood.json").read_text())
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    [figure] = figures
    drawn = [ax for ax in figure.axes if ax.axison]
    coincide = sum(b["tau"] == 2.5 for b in result["best"])
    assert len(drawn) == 4 + 2 * 5 * 2 - coincide
    titles = [ax.get_title() for ax in drawn]
    assert sum("AUROC (ID positive)" in t for t in titles) == 2 and sum("FPR95 (OOD" in t for t in titles) == 2
    assert sum(", calibration T: tau = 2.5" in t for t in titles) == 10 - coincide
    assert sum("best tau = calibration T: tau = 2.5" in t for t in titles) == coincide
    assert len(result["taus"]) == 10  # ten temperatures, yet no histogram at most of them


# -- bad input: exit 2, one line, nothing written ---------------------------------------------------------------


def bad(tmp_path: Path, cli, argv: list[str], *details: str) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = cli([*argv, "--json", str(tmp_path / "out.json"), "--scores", str(tmp_path / "s.safetensors")])
    assert code == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    for detail in details:
        assert detail in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_missing_ood_is_usage_error(ood_files, tmp_path, cli):
    bad(tmp_path, cli, ["ood", str(ood_files[0])], "--ood")


def test_class_count_mismatch(ood_files, tmp_path, cli):
    save_file({"logits": torch.randn(10, C + 1)}, str(tmp_path / "other.safetensors"))
    bad(tmp_path, cli, ["ood", str(ood_files[0]), "--ood", str(tmp_path / "other.safetensors")],
        "other.safetensors", f"{C + 1} classes", f"has {C}")


def test_binary_against_two_columns(tmp_path, cli):
    save_file({"logits": torch.randn(10), "labels": torch.zeros(10, dtype=torch.int64)}, str(tmp_path / "a.st"))
    save_file({"logits": torch.randn(10, 2)}, str(tmp_path / "b.st"))
    bad(tmp_path, cli, ["ood", str(tmp_path / "a.st"), "--ood", str(tmp_path / "b.st")], "binary")


def test_fitted_without_stored_temperature(ood_files, tmp_path, cli):
    bad(tmp_path, cli, ["ood", str(ood_files[0]), "--ood", str(ood_files[1]), "--tau", "fitted"],
        "no stored temperature", str(ood_files[0]))


@pytest.mark.parametrize("tau", ["0", "-1", "abc", "nan", "inf"])
def test_bad_tau(ood_files, tmp_path, cli, tau):
    bad(tmp_path, cli, ["ood", str(ood_files[0]), "--ood", str(ood_files[1]), "--tau", tau], f"--tau {tau}")


def test_bad_values_in_ood_file(ood_files, tmp_path, cli):
    z = torch.randn(30, C)
    z[7, 2] = float("nan")
    save_file({"logits": z}, str(tmp_path / "nan.safetensors"))
    bad(tmp_path, cli, ["ood", str(ood_files[0]), "--ood", str(tmp_path / "nan.safetensors")],
        "nan.safetensors", "NaN", "index 7")


def test_output_over_an_input_is_refused(ood_files, tmp_path, capsys):
    id_path, ood_path, _, _ = ood_files
    before = id_path.read_bytes()
    assert main(["ood", str(id_path), "--ood", str(ood_path), "--plot", str(tmp_path / "x.jpg")]) == 2
    assert main(["ood", str(id_path), "--ood", str(ood_path), "--scores", str(id_path)]) == 2
    assert id_path.read_bytes() == before and not (tmp_path / "x.jpg").exists()


@pytest.mark.parametrize("argv, details", [
    (["--score", "odin"], ["--score odin", "'odin' is not a score"]),
    (["--score", "msp,,gen"], ["--score msp,,gen", "empty name"]),
    (["--gen-gamma", "0"], ["--gen-gamma 0"]),
    (["--gen-gamma", "nan"], ["--gen-gamma nan"]),
    (["--gen-top", "0"], ["--gen-top"]),
    (["--min-auroc", "1.5"], ["--min-auroc 1.5"]),
    (["--max-fpr95", "-0.1"], ["--max-fpr95 -0.1"]),
    (["--bootstrap", "-1"], ["--bootstrap"]),
    (["--react", "90"], ["--react", "--head"]),
])
def test_bad_ood_options(ood_files, tmp_path, cli, argv, details):
    bad(tmp_path, cli, ["ood", str(ood_files[0]), "--ood", str(ood_files[1]), *argv], *details)


@pytest.mark.parametrize("percentile", ["0", "100.5", "nan"])
def test_bad_react_percentile(tmp_path, cli, percentile):
    h, w, b, y = hidden_and_head(50, 4, 6, seed=1)
    save_file({"hidden": h, "labels": y}, str(tmp_path / "hidden.safetensors"))
    save_file({"weight": w, "bias": b}, str(tmp_path / "head.safetensors"))
    bad(tmp_path, cli, ["ood", str(tmp_path / "hidden.safetensors"), "--head", str(tmp_path / "head.safetensors"),
                        "--ood", str(tmp_path / "hidden.safetensors"), "--react", percentile], f"--react {percentile}")


@pytest.mark.slow  # ReAct, scores and the bootstrap under torchrun: tests/cli/test_cli_distributed.py's ood tests
def test_react_every_score_and_gates_under_two_processes_match_one(tmp_path):
    """torchrun, two gloo processes: each counts its own rows' hidden-state values for ReAct's percentile (the counts
    all-reduced), scores its share, and the scores are gathered for the figures: the same JSON as one process."""
    from test_cli_distributed import _torchrun, one_and_two_processes

    if _torchrun() is None:
        pytest.skip("torchrun not installed")
    h, w, b, y = hidden_and_head(900, 16, 120, seed=7)
    save_file({"hidden": torch.relu(2 * h), "labels": y}, str(tmp_path / "hidden.safetensors"))
    save_file({"hidden": torch.relu(3 * torch.randn(500, 16))}, str(tmp_path / "ood.safetensors"))
    save_file({"weight": w, "bias": b}, str(tmp_path / "head.safetensors"))
    one, two = one_and_two_processes(tmp_path, [
        "ood", str(tmp_path / "hidden.safetensors"), "--head", str(tmp_path / "head.safetensors"), "--ood",
        str(tmp_path / "ood.safetensors"), "--react", "85", "--score", "all", "--tau", "0.5", "--tau", "3",
        "--bootstrap", "30", "--max-fpr95", "1"])
    assert one["react_threshold"] == two["react_threshold"] == float(np.percentile(torch.relu(2 * h).numpy(), 85))
    assert one["gate_passed"] is two["gate_passed"] is True
    assert (one["n_id"], one["n_ood"]) == (two["n_id"], two["n_ood"])
    for x, y_ in zip(one["results"], two["results"], strict=True):
        assert (x["score"], x["tau"]) == (y_["score"], y_["tau"])
        for key in ("auroc", "aupr_in", "aupr_out", "fpr95"):
            assert x[key] == pytest.approx(y_[key], abs=1e-6), key
        assert x["auroc_ci"] == pytest.approx(y_["auroc_ci"], abs=1e-6)


@pytest.mark.parametrize(("top", "said"), [(None, "the 10 largest probabilities (all classes)"),
                                           ("4", "the 4 largest probabilities")])
def test_gen_says_how_many_probabilities_it_sums(tmp_path, cli, top, said):
    """GEN sums over min(M, C) probabilities: with 10 classes and the default M = 100, that is 10, all of them."""
    g = torch.Generator().manual_seed(5)
    save_file({"logits": 3 * torch.randn(80, 10, generator=g), "labels": torch.zeros(80, dtype=torch.int64)},
              str(tmp_path / "id.safetensors"))
    save_file({"logits": torch.randn(60, 10, generator=g)}, str(tmp_path / "ood.safetensors"))
    extra = [] if top is None else ["--gen-top", top]
    code, out, err = cli(["ood", str(tmp_path / "id.safetensors"), "--ood", str(tmp_path / "ood.safetensors"),
                          "--tau", "1", "--score", "gen", *extra])
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("GEN: "))
    assert line == f"GEN: gamma 0.1, {said}"


@pytest.mark.parametrize("flags", [[], ["-q"], ["--json", "-"]])
def test_the_float32_caveat_is_said_once(tmp_path, cli, flags):
    """A best tau float32 cannot resolve (ID and OOD differ only in spread: entropy at tau = 1000): a note beside
    the tables when they are printed, else a warning; never both. It stays in the JSON's warnings."""
    g = torch.Generator().manual_seed(3)
    z_id, z_ood = 2.0 * torch.randn(400, 10, generator=g), 1.6 * torch.randn(300, 10, generator=g)
    save_file({"logits": z_id, "labels": torch.zeros(400, dtype=torch.int64)}, str(tmp_path / "id.safetensors"))
    save_file({"logits": z_ood}, str(tmp_path / "ood.safetensors"))
    code, out, err = cli(["ood", str(tmp_path / "id.safetensors"), "--ood", str(tmp_path / "ood.safetensors"),
                          "--score", "entropy", *flags])
    assert code == 0, err
    said = "best tau = 1000 cannot be deployed in float32"
    if flags == ["--json", "-"]:  # standard output holds the JSON only
        assert sum(said in w for w in json.loads(out)["warnings"]) == 1 and err.count(said) == 1
        return
    assert (out + err).count(said) == 1, out + err
    if flags == ["-q"]:
        assert said in err and "warning: " in err
    else:
        assert said in out and said not in err
