"""Which files are models (tempcal.models.detect): .pt2 and .onnx by name, TorchScript and exported archives by their
zip directory, never a torch.save zip of tensors; and what --save-model writes from what."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tempcal.errors import TempcalError, for_cli
from tempcal.models.detect import is_model_path
from tempcal.models.torchscript import load as load_model

# torch 2.13 deprecates TorchScript; the contract reads it, so these tests script and load models on purpose.
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")


def test_is_model_path_needs_a_torchscript_archive(digits, tmp_path):
    blob = Path(digits["model"]).read_bytes()
    for suffix in (".pt", ".pth", ".ts", ".torchscript", ".PT"):
        (tmp_path / f"m{suffix}").write_bytes(blob)
        assert is_model_path(tmp_path / f"m{suffix}")
    (tmp_path / "m.safetensors").write_bytes(blob)
    assert not is_model_path(tmp_path / "m.safetensors")  # not a model suffix
    torch.save({"logits": torch.zeros(3, 2), "labels": torch.zeros(3, dtype=torch.int64)}, tmp_path / "dict.pt")
    assert not is_model_path(tmp_path / "dict.pt")  # a torch.save zip of tensors is a logits file
    assert not is_model_path(tmp_path / "missing.pt")
    (tmp_path / "folder.pt").mkdir()
    assert not is_model_path(tmp_path / "folder.pt")
    with pytest.raises(TempcalError, match=r"dict\.pt: not a TorchScript model \(a torch\.save archive"):
        load_model(tmp_path / "dict.pt", "cpu")
    with pytest.raises(TempcalError, match=r"missing\.pt: no such file"):
        load_model(tmp_path / "missing.pt", "cpu")


def test_formats_by_suffix_and_zip_directory(digits, tmp_path):
    """.pt2 and .onnx are models by name; an exported program saved under a .pt name is found by its directory."""
    from model_builders import save_program

    from tempcal.models.detect import looks_like_model, model_format

    program = save_program(digits["mlp"], digits["x"][:4], tmp_path / "digits.pt2")
    as_pt = tmp_path / "exported.pt"
    as_pt.write_bytes(program.read_bytes())
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07")
    cases = {program: "export", as_pt: "export", digits["model"]: "torchscript", tmp_path / "model.onnx": "onnx",
             tmp_path / "absent.pt2": "export", tmp_path / "absent.ts": "torchscript"}
    for path, kind in cases.items():
        assert model_format(path) == kind, path
        assert looks_like_model(path, with_inputs=False)
    assert is_model_path(program) and is_model_path(as_pt) and is_model_path(tmp_path / "model.onnx")
    assert not is_model_path(tmp_path / "absent.onnx")
    torch.save({"logits": torch.zeros(3, 2)}, tmp_path / "dict.pt")
    assert not looks_like_model(tmp_path / "dict.pt", with_inputs=False)  # a logits file ...
    assert looks_like_model(tmp_path / "dict.pt", with_inputs=True)  # ... unless --inputs says it is a model
    assert not looks_like_model(tmp_path / "logits.safetensors", with_inputs=True)


@pytest.mark.parametrize(("source", "out", "written"), [
    ("m.pt2", "c.pt2", "export"), ("m.ts", "c.pt2", "export"), ("m.pt", "c.PT2", "export"),
    ("m.onnx", "c.onnx", "onnx"), ("m.ts", "c.ts", "torchscript"), ("m.pth", "c.torchscript", "torchscript"),
    ("m.ts", "c.onnx", "an ONNX model is written from an ONNX SOURCE only; m.ts is a TorchScript model, from which "
                       "tempcal writes .pt2 (the migration path) or a TorchScript suffix"),
    ("m.pt2", "c.ts", "a TorchScript model is written from a TorchScript SOURCE only; m.pt2 is an exported program "
                      "(.pt2), from which tempcal writes .pt2"),
    ("m.onnx", "c.pt2", "an exported program (.pt2) is written from a .pt2 or TorchScript SOURCE only; m.onnx is an "
                        "ONNX model, from which tempcal writes .onnx"),
    ("m.onnx", "c.bin", "suffix '.bin': not a model format tempcal writes; m.onnx is an ONNX model"),
    ("m.pt2", "calibrated", "no suffix: not a model format tempcal writes"),
])
def test_what_save_model_writes_from_what(source, out, written):
    from tempcal.models.detect import save_format

    if " " not in written:
        assert save_format(source, out) == written
        return
    with pytest.raises(TempcalError) as info:
        save_format(source, out)
    message = for_cli(info.value)
    assert message.startswith(f"--save-model {out}: ") and written in message
