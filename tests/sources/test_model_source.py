"""A model with its inputs as SOURCE (tempcal.sources.model), opened as every SOURCE is: TorchScript, .pt2, ONNX."""

from __future__ import annotations

import pytest
import torch
from model_builders import save_program

from tempcal.errors import TempcalError
from tempcal.models.save import save_calibrated_model
from tempcal.sources.registry import open_source, read_stored_temperature

# torch 2.13 deprecates TorchScript; the contract reads it, so these tests script and load models on purpose.
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")


def test_open_model_source_feeds_the_fit_workflow(digits):
    opened = open_source(digits["model"], inputs=str(digits["inputs"]), device="cpu", progress=False)
    assert opened.name == f"{digits['model']} on {digits['inputs']}" and opened.stored_temperature is None
    assert opened.paths == []  # nothing to write T back into
    assert opened.data.num_samples == len(digits["y"]) and opened.data.num_classes == 10
    with pytest.raises(TempcalError, match=r"mlp\.pt: a TorchScript model SOURCE needs its inputs: inputs"):
        open_source(digits["model"])


def test_every_format_opens_alike_and_a_calibrated_one_gives_its_stored_t(digits, tmp_path):
    pytest.importorskip("onnxruntime")
    from model_builders import onnx_mlp

    program = save_program(digits["mlp"], digits["x"][:4], tmp_path / "digits.pt2")
    as_pt = tmp_path / "exported.pt"  # an exported program under a TorchScript-like name: told by its contents
    as_pt.write_bytes(program.read_bytes())
    onnx_file = onnx_mlp(digits["mlp"], tmp_path / "digits.onnx")
    reference = open_source(digits["model"], inputs=str(digits["inputs"]), device="cpu").data.logits
    for path, what in ((program, "an exported program"), (as_pt, "an exported program"),
                       (onnx_file, "an ONNX model")):
        opened = open_source(path, inputs=str(digits["inputs"]), device="cpu")
        assert opened.name == f"{path} on {digits['inputs']}" and opened.paths == []
        assert opened.stored_temperature is None
        torch.testing.assert_close(opened.data.logits, reference, rtol=1e-5, atol=1e-5)
        assert torch.equal(opened.data.labels, digits["y"])
        with pytest.raises(TempcalError, match=rf"{path.name}: {what} SOURCE needs its inputs: inputs"):
            open_source(path)
        calibrated = tmp_path / f"calibrated-{path.stem}{'.onnx' if path is onnx_file else '.pt2'}"
        save_calibrated_model(path, 2.5, calibrated, check_inputs=digits["inputs"])
        assert read_stored_temperature(calibrated) == (2.5, []) and read_stored_temperature(path) == (None, [])
        again = open_source(calibrated, inputs=str(digits["inputs"]), device="cpu")
        assert again.stored_temperature == 2.5 and torch.equal(again.data.logits, opened.data.logits)
        with pytest.raises(TempcalError, match="a model has no logits file to store T in"):
            again.kind.write_reading(calibrated, 3.0, None, {})
