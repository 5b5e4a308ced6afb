"""``tempcal ood``: MSP and energy scores, AUROC / AUPR / FPR95 against scikit-learn and plain numpy; the CLI."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from safetensors import safe_open
from safetensors.torch import save_file
from scipy.special import logsumexp
from sklearn.metrics import average_precision_score, roc_auc_score

from tempcal.cli.main import main
from tempcal.core.scan import Scan
from tempcal.io.writeback import write_temperature
from tempcal.metrics.detection import detection_metrics, fpr_at_recall
from tempcal.output.console import print_ood
from tempcal.sources.registry import open_source
from tempcal.workflows.ood import ood_file, score_samples

C = 6


# -- independent references (float64 numpy, written from the contract's words) ----------------
def two_class(z: np.ndarray) -> np.ndarray:
    """A single binary logit [N] as the two-class logits [0, z]."""
    return np.stack([np.zeros_like(z), z], axis=1) if z.ndim == 1 else z


def ref_msp(logits, tau: float) -> np.ndarray:
    z = two_class(np.asarray(logits, dtype=np.float64)) / tau
    return np.exp(z.max(axis=1) - logsumexp(z, axis=1))


def ref_energy(logits, tau: float) -> np.ndarray:
    z = two_class(np.asarray(logits, dtype=np.float64))
    return tau * logsumexp(z / tau, axis=1)


def ref_fpr95(id_scores, ood_scores) -> float:
    """The threshold keeps 95% of ID: the largest s with mean(id >= s) >= 0.95; FPR95 = mean(ood >= s), ties in."""
    id_scores, ood_scores = list(map(float, id_scores)), list(map(float, ood_scores))
    threshold = None
    for s in sorted(set(id_scores), reverse=True):
        kept = sum(1 for v in id_scores if v >= s)
        if 100 * kept >= 95 * len(id_scores):  # integers: no rounding at exactly 95%
            threshold = s
            break
    return sum(1 for v in ood_scores if v >= threshold) / len(ood_scores)


def ref_auroc(id_scores, ood_scores) -> float:
    """Mann-Whitney: the chance an ID score beats an OOD score, ties counted half."""
    a = np.asarray(id_scores, dtype=np.float64)[:, None]
    b = np.asarray(ood_scores, dtype=np.float64)[None, :]
    return float(np.mean((a > b) + 0.5 * (a == b)))


def sk_figures(id_scores, ood_scores) -> dict[str, float]:
    y = np.r_[np.ones(len(id_scores)), np.zeros(len(ood_scores))]
    s = np.r_[id_scores, ood_scores]
    return {"auroc": roc_auc_score(y, s), "aupr_in": average_precision_score(y, s),
            "aupr_out": average_precision_score(1 - y, -s)}


# -- data -----------------------------------------------------------------------------------
def id_ood_logits(n_id: int = 300, n_ood: int = 200, c: int = C, seed: int = 0):
    """ID logits with a clear winning class, OOD logits flatter: separable but overlapping."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, c, (n_id,), generator=g)
    z_id = 2 * torch.randn(n_id, c, generator=g)
    z_id[torch.arange(n_id), labels] += 3
    z_ood = 1.5 * torch.randn(n_ood, c, generator=g)
    return z_id, labels, z_ood


@pytest.fixture
def files(tmp_path):
    z_id, y, z_ood = id_ood_logits()
    save_file({"logits": z_id, "labels": y}, str(tmp_path / "id.safetensors"))
    save_file({"logits": z_ood}, str(tmp_path / "ood.safetensors"))  # no labels key
    return tmp_path / "id.safetensors", tmp_path / "ood.safetensors", z_id, z_ood


def run_json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    code = main([*argv, "--json", "-"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)  # stdout holds only the JSON


# -- scores ---------------------------------------------------------------------------------
def test_scores_match_float64_references():
    z_id, y, _ = id_ood_logits(n_id=200, c=9, seed=1)
    z = (z_id * 50).double()  # large magnitudes
    z[3, 2] = -float("inf")  # an impossible class
    taus = [0.3, 1.0, 7.5, 1000.0]
    got = score_samples(Scan(tempcal_data(z, y)), taus)
    for k, tau in enumerate(taus):
        np.testing.assert_allclose(got["msp"][k], ref_msp(z.numpy(), tau), rtol=1e-12, atol=0)
        np.testing.assert_allclose(got["energy"][k], ref_energy(z.numpy(), tau), rtol=1e-12, atol=0)
        assert got["msp"][k].dtype == np.float64


def tempcal_data(z, y):
    from tempcal.core.data import as_logits_data

    return as_logits_data(z, y)


def test_binary_single_logit_msp_is_max_of_sigmoid(tmp_path, capsys):
    g = torch.Generator().manual_seed(2)
    z_id, z_ood = 4 * torch.randn(150, generator=g), torch.randn(90, 1, generator=g)  # [N] and [N, 1]
    save_file({"logits": z_id, "labels": (z_id > 0).long()}, str(tmp_path / "id.safetensors"))
    save_file({"logits": z_ood}, str(tmp_path / "ood.safetensors"))
    result = run_json(capsys, ["ood", str(tmp_path / "id.safetensors"), "--ood", str(tmp_path / "ood.safetensors"),
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


# -- metrics --------------------------------------------------------------------------------
def check_metrics(id_scores, ood_scores):
    m = detection_metrics(id_scores, ood_scores)
    sk = sk_figures(id_scores, ood_scores)
    assert m.auroc == pytest.approx(sk["auroc"], abs=1e-12)
    assert m.auroc == pytest.approx(ref_auroc(id_scores, ood_scores), abs=1e-12)
    assert m.aupr_in == pytest.approx(sk["aupr_in"], abs=1e-12)
    assert m.aupr_out == pytest.approx(sk["aupr_out"], abs=1e-12)
    assert m.fpr95 == ref_fpr95(id_scores, ood_scores)
    assert m.mean_id == pytest.approx(np.mean(id_scores)) and m.mean_ood == pytest.approx(np.mean(ood_scores))
    return m


def test_metrics_with_ties_from_quantized_scores():
    rng = np.random.default_rng(0)
    id_scores = np.round(rng.beta(5, 2, 333), 1)  # few distinct values: many ties across and within sides
    ood_scores = np.round(rng.beta(2, 3, 211), 1)
    m = check_metrics(id_scores, ood_scores)
    assert 0.5 < m.auroc < 1 and 0 < m.fpr95 < 1
    # the threshold keeps at least 95% of ID, and any higher ID value keeps fewer
    assert np.mean(id_scores >= m.fpr95_threshold) >= 0.95
    assert np.mean(id_scores >= np.min(id_scores[id_scores > m.fpr95_threshold])) < 0.95


def test_metrics_all_equal_scores():
    m = check_metrics(np.full(40, 0.25), np.full(60, 0.25))
    assert m.auroc == 0.5 and m.fpr95 == 1.0
    assert m.aupr_in == pytest.approx(0.4) and m.aupr_out == pytest.approx(0.6)


def test_metrics_perfectly_separable():
    m = check_metrics(np.linspace(0.6, 1.0, 50), np.linspace(0.0, 0.5, 70))
    assert (m.auroc, m.aupr_in, m.aupr_out, m.fpr95) == (1.0, 1.0, 1.0, 0.0)
    reverse = check_metrics(np.linspace(0.0, 0.5, 50), np.linspace(0.6, 1.0, 70))
    assert reverse.auroc == 0.0 and reverse.fpr95 == 1.0


def test_fpr95_threshold_at_exactly_95_percent():
    # 20 ID samples: keeping 19 is exactly 95%, so the threshold is the 19th largest (2), and OOD at 2 counts.
    fpr, threshold = fpr_at_recall(np.arange(1, 21), np.array([1.0, 2.0, 1.5, 0.0]))
    assert threshold == 2.0 and fpr == 0.25


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=45), st.lists(st.integers(0, 6), min_size=1, max_size=30))
def test_fpr95_matches_the_contract_loop(id_scores, ood_scores):
    fpr, _ = fpr_at_recall(np.array(id_scores, float), np.array(ood_scores, float))
    assert fpr == ref_fpr95(id_scores, ood_scores)


# -- the command ----------------------------------------------------------------------------
def test_cli_results_match_references(files, capsys):
    id_path, ood_path, z_id, z_ood = files
    result = run_json(capsys, ["ood", str(id_path), "--ood", str(ood_path), "--tau", "1", "--tau", "4",
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


def test_default_sweep_and_fitted_read_the_stored_temperature(files, tmp_path, capsys):
    id_path, ood_path, z_id, z_ood = files
    calibrated = tmp_path / "calibrated.safetensors"
    write_temperature(id_path, 3.25, output=calibrated)
    result = run_json(capsys, ["ood", str(calibrated), "--ood", str(ood_path)])
    taus = result["taus"]
    assert 1.0 in taus and 3.25 in taus and taus == sorted(set(taus)) and len(taus) >= 5
    assert result["stored_temperature"] == 3.25 and result["taus_from"] == "default sweep"
    assert [r["tau"] for r in result["results"]] == taus
    at_t = next(r for r in result["results"] if r["tau"] == 3.25)
    assert at_t["auroc"] == pytest.approx(sk_figures(ref_msp(z_id, 3.25), ref_msp(z_ood, 3.25))["auroc"], abs=1e-9)
    best = result["best"][0]
    assert best["calibration_tau"] == 3.25 and best["calibration_auroc"] == at_t["auroc"]
    assert "T = 3.25" in best["sentence"] and str(ood_path) in best["sentence"]
    fitted = run_json(capsys, ["ood", str(calibrated), "--ood", str(ood_path), "--tau", "fitted", "--tau", "1"])
    assert [r["tau"] for r in fitted["results"]] == [3.25, 1.0]
    assert fitted["results"][0]["auroc"] == at_t["auroc"]


def test_several_ood_files_one_block_each(files, tmp_path, capsys):
    id_path, ood_path, z_id, _ = files
    g = torch.Generator().manual_seed(5)
    z_far = 0.3 * torch.randn(120, C, generator=g)
    save_file({"logits": z_far, "labels": torch.zeros(120, dtype=torch.int64)}, str(tmp_path / "far.safetensors"))
    far = tmp_path / "far.safetensors"
    both = run_json(capsys, ["ood", str(id_path), "--ood", str(ood_path), "--ood", str(far), "--tau", "2"])
    assert [r["ood_file"] for r in both["results"]] == [str(ood_path), str(far)]
    assert [b["ood_file"] for b in both["best"]] == [str(ood_path), str(far)]
    assert both["n_ood"] == [200, 120]
    alone = run_json(capsys, ["ood", str(id_path), "--ood", str(far), "--tau", "2"])
    assert both["results"][1] == alone["results"][0]
    assert both["results"][1]["auroc"] == pytest.approx(
        ref_auroc(ref_msp(z_id, 2.0), ref_msp(z_far, 2.0)), abs=1e-12)


def test_ood_file_without_labels_and_with_impossible_classes(tmp_path):
    z_id, y, z_ood = id_ood_logits(seed=3)
    z_ood[:, 0] = -float("inf")  # class 0 impossible for every OOD row: fine without labels
    p_ood = torch.softmax(z_ood, 1)
    save_file({"logits": z_id, "labels": y}, str(tmp_path / "id.safetensors"))
    save_file({"logits": z_ood}, str(tmp_path / "ood.safetensors"))
    report = ood_file(tmp_path / "id.safetensors", [tmp_path / "ood.safetensors"], taus=[1.5])
    np.testing.assert_allclose(report.ood_scores[0]["msp"][0], ref_msp(z_ood.numpy(), 1.5), rtol=1e-12)
    assert open_source(tmp_path / "ood.safetensors", labels_optional=True).data.num_classes == C
    # probabilities with exact zeros give log(0) = -inf, the same thing
    save_file({"logits": p_ood}, str(tmp_path / "ood_p.safetensors"))
    assert open_source(tmp_path / "ood_p.safetensors", labels_optional=True, probs=True).data.num_samples == 200


def test_scores_file_contents(files, tmp_path, capsys):
    id_path, ood_path, z_id, z_ood = files
    out = tmp_path / "scores.safetensors"
    result = run_json(capsys, ["ood", str(id_path), "--ood", str(ood_path), "--tau", "0.5", "--tau", "2",
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


def test_plot_writes_a_png(files, tmp_path, capsys):
    id_path, ood_path, _, _ = files
    out = tmp_path / "ood.png"
    capsys.readouterr()
    assert main(["ood", str(id_path), "--ood", str(ood_path), "--score", "both", "--plot", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert f"wrote the plot to {out}" in capsys.readouterr().out


def test_table_fits_80_columns(files):
    id_path, ood_path, _, _ = files
    report = ood_file(id_path, [ood_path], scores=["msp", "energy"])
    buffer = io.StringIO()
    print_ood(report, Console(file=buffer, width=80, color_system=None))
    lines = buffer.getvalue().splitlines()
    table_lines = [line for line in lines if "│" in line]
    assert len(table_lines) == 2 * len(report.taus)  # one line per tau: nothing wrapped
    # only the plain-text lines (paths, legend, sentences) may run past 80 columns, never the tables
    prose = ("On ", "OOD ", "in-distribution", str(id_path))
    assert all(len(line) <= 80 for line in lines if not line.startswith(prose))
    assert any(line.startswith("On ") and len(line) > 80 for line in lines)  # the sentences stay on one line


def test_help_does_not_import_torch():
    code = ("import sys\nfrom tempcal.cli.main import main\ncode = main(['ood', '--help'])\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "--ood" in done.stdout


# -- bad input: exit 2, one line, nothing written ---------------------------------------------
def bad(tmp_path: Path, capsys, argv: list[str], *details: str) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    code = main([*argv, "--json", str(tmp_path / "out.json"), "--scores", str(tmp_path / "s.safetensors")])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    for detail in details:
        assert detail in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_missing_ood_is_usage_error(files, tmp_path, capsys):
    bad(tmp_path, capsys, ["ood", str(files[0])], "--ood")


def test_class_count_mismatch(files, tmp_path, capsys):
    save_file({"logits": torch.randn(10, C + 1)}, str(tmp_path / "other.safetensors"))
    bad(tmp_path, capsys, ["ood", str(files[0]), "--ood", str(tmp_path / "other.safetensors")],
        "other.safetensors", f"{C + 1} classes", f"has {C}")


def test_binary_against_two_columns(tmp_path, capsys):
    save_file({"logits": torch.randn(10), "labels": torch.zeros(10, dtype=torch.int64)}, str(tmp_path / "a.st"))
    save_file({"logits": torch.randn(10, 2)}, str(tmp_path / "b.st"))
    bad(tmp_path, capsys, ["ood", str(tmp_path / "a.st"), "--ood", str(tmp_path / "b.st")], "binary")


def test_fitted_without_stored_temperature(files, tmp_path, capsys):
    bad(tmp_path, capsys, ["ood", str(files[0]), "--ood", str(files[1]), "--tau", "fitted"],
        "no stored temperature", str(files[0]))


@pytest.mark.parametrize("tau", ["0", "-1", "abc", "nan", "inf"])
def test_bad_tau(files, tmp_path, capsys, tau):
    bad(tmp_path, capsys, ["ood", str(files[0]), "--ood", str(files[1]), "--tau", tau], f"--tau {tau}")


def test_bad_values_in_ood_file(files, tmp_path, capsys):
    z = torch.randn(30, C)
    z[7, 2] = float("nan")
    save_file({"logits": z}, str(tmp_path / "nan.safetensors"))
    bad(tmp_path, capsys, ["ood", str(files[0]), "--ood", str(tmp_path / "nan.safetensors")],
        "nan.safetensors", "NaN", "index 7")


def test_output_over_an_input_is_refused(files, tmp_path, capsys):
    id_path, ood_path, _, _ = files
    before = id_path.read_bytes()
    assert main(["ood", str(id_path), "--ood", str(ood_path), "--plot", str(tmp_path / "x.jpg")]) == 2
    assert main(["ood", str(id_path), "--ood", str(ood_path), "--scores", str(id_path)]) == 2
    assert id_path.read_bytes() == before and not (tmp_path / "x.jpg").exists()


def test_the_scores_pass_keeps_what_the_calibration_pass_keeps():
    """OOD scoring reads each chunk once and computes only the scores, which equal the calibration pass's."""
    from reference import miscalibrated

    from tempcal.core.data import as_logits_data

    logits, labels = miscalibrated(700, 9, 2.0, seed=21)
    logits[3, 4] = -math.inf
    scan = Scan(as_logits_data(logits, labels), device="cpu", chunk_rows=64)
    before = scan.passes
    fast = scan.scores([1.0, 0.25, 3.0])
    assert scan.passes == before + 1
    full = scan.calibration([1.0, 0.25, 3.0], 15, keep_scores=True)
    for mine, (_, kept) in zip(fast, full, strict=True):
        assert torch.equal(mine["msp"], kept["confidence"])
        assert torch.equal(mine["energy"], kept["energy"])
    z = logits.double()
    assert torch.allclose(fast[1]["energy"], 4.0 * torch.logsumexp(z / 4.0, 1), rtol=1e-6)
    assert torch.allclose(fast[2]["msp"], torch.softmax(z * 3.0, 1).max(1).values, rtol=1e-6)
