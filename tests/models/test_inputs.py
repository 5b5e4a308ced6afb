"""Inputs files of model SOURCEs (tempcal.models.run.InputsFile): missing keys, mismatched rows, bad dtypes, no rows."""

from __future__ import annotations

import pytest
import torch
from conftest import run_model_source, script_model, write_inputs
from safetensors.torch import save_file

from tempcal.errors import TempcalError

# torch 2.13 deprecates TorchScript; the contract reads it, so these tests script and load models on purpose.
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")


def test_missing_and_malformed_inputs(digits, small, tmp_path):
    x, y, _ = small
    renamed = tmp_path / "renamed.safetensors"
    save_file({"pixels": x, "labels": y}, str(renamed))
    with pytest.raises(TempcalError, match=r"renamed\.safetensors: no tensor 'inputs' \(keys present: 'labels', "
                                           r"'pixels'; choose one with inputs_key\)"):
        run_model_source(digits["model"], renamed, device="cpu")
    data, _ = run_model_source(script_model(torch.nn.Linear(5, 3), tmp_path / "lin.pt"), renamed, inputs_key="pixels",
                        device="cpu", progress=False)
    assert data.num_samples == 40
    short = write_inputs(tmp_path / "short.safetensors", x, y[:30])
    with pytest.raises(TempcalError, match=r"short\.safetensors: 'inputs' has 40 rows but 'labels' has 30"):
        run_model_source(digits["model"], short, device="cpu")
    floats = write_inputs(tmp_path / "floats.safetensors", x, y.double())
    with pytest.raises(TempcalError, match=r"'labels' has dtype float64; expected an integer dtype"):
        run_model_source(digits["model"], floats, device="cpu")
    empty = write_inputs(tmp_path / "empty.safetensors", torch.zeros(0, 5), torch.zeros(0, dtype=torch.int64))
    with pytest.raises(TempcalError, match=r"empty\.safetensors: 'inputs' holds no samples"):
        run_model_source(digits["model"], empty, device="cpu")
    with pytest.raises(TempcalError, match=r"nothere\.safetensors: no such file"):
        run_model_source(digits["model"], tmp_path / "nothere.safetensors", device="cpu")
