"""Saving what a model gives (tempcal.models.save): its logits, and the model calibrated, checked against scipy."""

from __future__ import annotations

import pytest
import torch
from conftest import read_model_temperature, run_model_source
from reference import nll_at, optimal_temperature
from safetensors import safe_open

import tempcal
from tempcal.errors import TempcalError
from tempcal.models.save import save_calibrated_model, save_logits

# torch 2.13 deprecates TorchScript; the contract reads it, so these tests script and load models on purpose.
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")


def test_model_to_logits_to_fit_to_calibrated_model_to_report(digits, tmp_path):
    mlp, x, y = digits["mlp"], digits["x"], digits["y"]
    data, stored = run_model_source(digits["model"], digits["inputs"], device="cpu", batch_size=100, progress=False)
    assert stored is None
    with torch.no_grad():
        direct = mlp(x).double()
    assert data.logits.shape == (len(y), 10)
    assert torch.allclose(data.logits.double(), direct, rtol=0, atol=1e-6)
    assert torch.equal(data.labels, y)

    t = tempcal.fit_temperature(data.logits, data.labels).temperature
    assert t == pytest.approx(optimal_temperature(direct.numpy(), y.numpy()), rel=1e-6)
    assert t > 1.5  # the example is overconfident

    calibrated = tmp_path / "calibrated.pt"
    assert save_calibrated_model(digits["model"], t, calibrated, check_inputs=digits["inputs"]) == calibrated
    reloaded = torch.jit.load(str(calibrated))
    with torch.no_grad():
        scaled = reloaded(x).double()
    assert torch.allclose(scaled, direct / t, rtol=1e-6, atol=1e-6)
    assert read_model_temperature(calibrated) == t
    assert float(reloaded.tempcal_temperature) == t and reloaded.tempcal_temperature.dtype == torch.float64
    assert read_model_temperature(digits["model"]) is None

    # The calibrated model as a SOURCE: the original's logits and T as the stored temperature.
    again, stored = run_model_source(calibrated, digits["inputs"], device="cpu", progress=False)
    assert stored == t
    assert torch.allclose(again.logits.double(), direct, atol=1e-6)
    # ... so that a report at the stored T is the calibrated model's outputs at T = 1 (numpy NLL).
    saved = save_logits(again, tmp_path / "logits.safetensors", temperature=stored)
    report = tempcal.report_file(str(saved), device="cpu")
    assert report.stored_temperature == t and [m.tau for m in report.results] == [t]
    assert report.results[0].nll == pytest.approx(nll_at(scaled.numpy(), y.numpy(), 1.0), rel=1e-6)
    assert report.results[0].nll < nll_at(direct.numpy(), y.numpy(), 1.0)
    # Calibrating a calibrated model replaces T instead of dividing twice.
    twice = tmp_path / "twice.pt"
    save_calibrated_model(calibrated, 3.0, twice)
    with torch.no_grad():
        assert torch.allclose(torch.jit.load(str(twice))(x).double(), direct / 3.0, rtol=1e-6, atol=1e-6)
    assert read_model_temperature(twice) == 3.0


def test_save_logits_round_trip(digits, tmp_path):
    data, _ = run_model_source(digits["model"], digits["inputs"], device="cpu", progress=False)
    path = tmp_path / "logits.safetensors"
    save_logits(data, path, temperature=2.5, metadata={"tempcal.model": "mlp.pt"})
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"tempcal.model": "mlp.pt", "tempcal.temperature": "2.5"}
        assert torch.equal(f.get_tensor("logits"), data.logits)
        assert torch.equal(f.get_tensor("labels"), data.labels)
    loaded = tempcal.open_source(path)
    assert loaded.stored_temperature == 2.5
    save_logits(data, path, labels=False)  # replaces the file atomically
    with safe_open(str(path), framework="pt") as f:
        assert list(f.keys()) == ["logits"] and not f.metadata()
    assert [p.name for p in tmp_path.iterdir()] == ["logits.safetensors"]  # no temporary file left
    with pytest.raises(TempcalError, match="is a folder"):
        save_logits(data, tmp_path)
