"""Models through the command line: model -> logits -> fit -> calibrated model -> report; ood on inputs. TorchScript,
exported programs (.pt2) and ONNX models, each against independent references (scipy's T, the saved logits, the
saved model run by stock torch.export.load or onnxruntime)."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch
from conftest import EXAMPLES, MARKER, assert_one_error_line, snapshot, write_inputs
from model_builders import divided, save_program, ulps, with_opaque_payload
from reference import nll_at, optimal_temperature
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


# -- v2: exported programs (.pt2) and ONNX models ----------------------------------------------------------------------


@pytest.fixture
def digits_pt2(digits, tmp_path):
    """The digits MLP exported with a dynamic batch (the way a release ships it), in this test's folder."""
    return save_program(digits["mlp"], digits["x"][:4], tmp_path / "digits.pt2")


@pytest.fixture
def digits_onnx(digits, tmp_path):
    pytest.importorskip("onnxruntime")
    from model_builders import onnx_mlp

    return onnx_mlp(digits["mlp"], tmp_path / "digits.onnx")


def _fit(run_json, source, inputs, *more):
    return run_json(["fit", str(source), "--inputs", str(inputs), "--val-fraction", "1.0", *map(str, more)])


def _t_of_logits(run_json, logits_file) -> float:
    return run_json(["fit", str(logits_file), "--val-fraction", "1.0", "--no-write"])["temperature"]


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")
def test_pt2_source_fits_like_its_logits_and_saves_an_exact_program(digits, digits_pt2, tmp_path, run_json):
    calibrated, logits = tmp_path / "calibrated.pt2", tmp_path / "logits.safetensors"
    fit = _fit(run_json, digits_pt2, digits["inputs"], "--save-model", calibrated, "--save-logits", logits)
    t = fit["temperature"]
    assert fit["written"] == str(calibrated) and fit["source"] == f"{digits_pt2} on {digits['inputs']}"
    saved = load_file(str(logits))
    assert _t_of_logits(run_json, logits) == pytest.approx(t, rel=1e-12)  # the same T as its saved logits
    assert t == pytest.approx(optimal_temperature(saved["logits"], saved["labels"]), rel=1e-6)  # and scipy's
    assert t > 1.5
    extra = {"tempcal.temperature": ""}
    with warnings.catch_warnings():  # stock torch reads our file (our own file: safe to load with it here)
        warnings.simplefilter("ignore")
        program = torch.export.load(str(calibrated), extra_files=extra)
    assert extra["tempcal.temperature"] == repr(t)
    for rows in (1, 7, 1348):  # the batch size stays dynamic
        x = digits["x"][:rows]
        with torch.no_grad():
            want, got = digits["mlp"](x), program.module()(x)
        assert torch.equal(got, divided(want, t))
        torch.testing.assert_close(got.double(), want.double() / t, rtol=2**-24, atol=0)  # float32 rounding
    # report on the calibrated program shows its stored T by default: the calibrated outputs at T = 1
    row = run_json(["report", str(calibrated), "--inputs", str(digits["inputs"])])["results"][0]
    with torch.no_grad():
        scaled = program.module()(digits["x"]).double().numpy()
    assert row["tau"] == t and row["stored"] is True
    assert row["nll"] == pytest.approx(nll_at(scaled, digits["y"].numpy(), 1.0), rel=1e-6)
    plain = run_json(["report", str(calibrated), "--inputs", str(digits["inputs"]), "--tau", "1"])["results"][0]
    assert plain["nll"] == pytest.approx(nll_at(saved["logits"].double().numpy(), digits["y"].numpy(), 1.0), rel=1e-6)


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")
def test_torchscript_to_pt2_is_the_migration_path(tmp_path, run_json):
    migrated = tmp_path / "digits.pt2"
    t = _fit(run_json, MODEL, INPUTS, "--save-model", migrated)["temperature"]
    assert t == pytest.approx(_t_of_logits(run_json, LOGITS), rel=1e-5)  # the shipped logits are this model's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program, original = torch.export.load(str(migrated)), torch.jit.load(str(MODEL))
    x = load_file(str(INPUTS))["inputs"]
    for rows in (3, 1348):
        with torch.no_grad():
            assert torch.equal(program.module()(x[:rows]), divided(original(x[:rows]), t))
    row = run_json(["report", str(migrated), "--inputs", str(INPUTS)])["results"][0]
    assert row["tau"] == t and row["stored"] is True
    again = _fit(run_json, migrated, INPUTS)["temperature"]  # the migrated program, fitted again: the original's T
    assert again == pytest.approx(t, rel=1e-9)


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")
def test_onnx_source_fits_like_its_logits_and_saves_an_exact_model(digits, digits_onnx, tmp_path, run_json):
    from model_builders import metadata_props, run_onnx_file

    calibrated, logits = tmp_path / "calibrated.onnx", tmp_path / "logits.safetensors"
    t = _fit(run_json, digits_onnx, digits["inputs"], "--save-model", calibrated, "--save-logits", logits)[
        "temperature"]
    saved = load_file(str(logits))
    assert _t_of_logits(run_json, logits) == pytest.approx(t, rel=1e-12)
    assert t == pytest.approx(optimal_temperature(saved["logits"], saved["labels"]), rel=1e-6)
    x = digits["x"].numpy()
    original, got = run_onnx_file(digits_onnx, x), run_onnx_file(calibrated, x)  # onnxruntime, as deployed
    assert np.array_equal(got, original / np.float32(t))
    assert ulps(got, (original.astype(np.float64) / t).astype(np.float32)) <= 1  # float32 rounding of z / T
    assert metadata_props(calibrated)["tempcal.temperature"] == repr(t)
    row = run_json(["report", str(calibrated), "--inputs", str(digits["inputs"])])["results"][0]
    assert row["tau"] == t and row["stored"] is True
    assert row["nll"] == pytest.approx(nll_at(got.astype(np.float64), digits["y"].numpy(), 1.0), rel=1e-6)


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")
def test_pt2_eval_ood_and_odin_match_the_torchscript_model(digits, digits_pt2, tmp_path, run_json):
    """The same weights as TorchScript and as .pt2: --eval, --ood-inputs and --odin-eps give the same figures."""
    x, y = digits["x"], digits["y"]
    first = write_inputs(tmp_path / "first.safetensors", x[:700].contiguous(), y[:700].contiguous())
    second = write_inputs(tmp_path / "second.safetensors", x[700:].contiguous(), y[700:].contiguous())
    g = torch.Generator().manual_seed(0)
    noise = write_inputs(tmp_path / "noise.safetensors", torch.randn(300, 64, generator=g))
    for argv in (["fit", "{m}", "--inputs", str(first), "--eval", str(second), "--no-write"],
                 ["ood", "{m}", "--inputs", str(second), "--ood-inputs", str(noise), "--tau", "1", "--tau", "2"],
                 ["ood", "{m}", "--inputs", str(second), "--ood-inputs", str(noise), "--tau", "1000",
                  "--odin-eps", "0.01"]):
        ours = run_json([a.format(m=digits_pt2) for a in argv])
        theirs = run_json([a.format(m=digits["model"]) for a in argv])
        if argv[0] == "fit":
            assert ours["n_fit"] == 700 and ours["n_eval"] == len(y) - 700
            assert ours["temperature"] == pytest.approx(theirs["temperature"], rel=1e-5)
            assert ours["after"]["nll"] == pytest.approx(theirs["after"]["nll"], rel=1e-5)
        else:
            assert len(ours["results"]) == len(theirs["results"]) > 0
            for a, b in zip(ours["results"], theirs["results"], strict=True):
                assert a["tau"] == b["tau"] and a["auroc"] == pytest.approx(b["auroc"], abs=1e-4)


def test_odin_on_an_onnx_model_is_a_clear_error(digits, digits_onnx, tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    noise = write_inputs(tmp_path / "noise.safetensors", torch.randn(50, 64))
    code, _, err = cli(["ood", str(digits_onnx), "--inputs", str(digits["inputs"]), "--ood-inputs", str(noise),
                        "--odin-eps", "0.01", "--json", "out.json"])
    assert code == 2
    assert_one_error_line(err, "--odin-eps", "gradient", "ONNX model")
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize(("source", "out", "message"), [
    ("digits.pt2", "calibrated.onnx", "an ONNX model is written from an ONNX SOURCE only"),
    ("digits.pt2", "calibrated.ts", "a TorchScript model is written from a TorchScript SOURCE only"),
    ("digits.pt2", "calibrated.bin", "suffix '.bin': not a model format tempcal writes"),
    ("digits.pt2", "digits.pt2", "would overwrite the input file"),
    ("digits.pt2", "missing/calibrated.pt2", "does not exist"),
])
def test_save_model_suffixes_that_cannot_be_written_are_refused_before_any_work(digits, digits_pt2, tmp_path, cli,
                                                                                 monkeypatch, source, out, message):
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    code, _, err = cli(["fit", source, "--inputs", str(digits["inputs"]), "--save-model", out, "--json", "x.json"])
    assert code == 2
    assert_one_error_line(err, message)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["fit", "report", "ood"])
def test_a_pt2_whose_pickle_would_create_a_file_is_refused(digits_pt2, digits, tmp_path, cli, monkeypatch, command):
    """The crafted archive runs its payload under plain torch.export.load (tests/models/test_export.py); here it
    is refused with exit 2, the file its pickle would create never appears, and nothing is written."""
    monkeypatch.chdir(tmp_path)
    hostile = with_opaque_payload(digits_pt2, tmp_path / "hostile.pt2", tmp_path / MARKER)
    before = snapshot(tmp_path)
    argv = [command, str(hostile), "--inputs", str(digits["inputs"]), "--json", "out.json"]
    if command == "ood":
        argv += ["--ood-inputs", str(digits["inputs"])]
    if command == "fit":
        argv += ["--save-model", "calibrated.pt2", "--save-logits", "logits.safetensors"]
    code, _, err = cli(argv)
    assert code == 2
    assert_one_error_line(err, str(hostile), "opaque_obj_0", "refused")
    assert not (tmp_path / MARKER).exists() and snapshot(tmp_path) == before


def test_onnx_external_data_leaving_the_folder_is_refused(digits, tmp_path, cli, monkeypatch):
    pytest.importorskip("onnxruntime")
    from model_builders import external_onnx

    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.bin").write_bytes(b"\0" * 4096)
    path = external_onnx(tmp_path / "release", np.ones((64, 10), np.float32), np.zeros(10, np.float32),
                         "../secret.bin", write_data=False)
    before = snapshot(tmp_path)
    code, _, err = cli(["fit", str(path), "--inputs", str(digits["inputs"]), "--save-model", "c.onnx"])
    assert code == 2
    assert_one_error_line(err, str(path), "tensor 'W' has external data at '../secret.bin'", "refused")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("package", ["onnx", "onnxruntime"])
def test_a_missing_onnx_extra_says_how_to_install_it(digits, tmp_path, cli, monkeypatch, package):
    import sys

    pytest.importorskip("onnxruntime")
    from model_builders import onnx_mlp

    path = onnx_mlp(digits["mlp"], tmp_path / "digits.onnx")
    monkeypatch.setitem(sys.modules, package, None)  # `import package` raises ImportError
    code, _, err = cli(["report", str(path), "--inputs", str(digits["inputs"])])
    assert code == 2
    assert_one_error_line(err, "pip install 'tempcal[onnx]'", f"the '{package}' package is not installed")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pt2_on_cuda_fits_the_same_t(digits, digits_pt2, run_json):
    on_cpu = _fit(run_json, digits_pt2, digits["inputs"], "--device", "cpu")["temperature"]
    on_cuda = _fit(run_json, digits_pt2, digits["inputs"], "--device", "cuda")["temperature"]
    assert on_cuda == pytest.approx(on_cpu, rel=1e-5)
