"""Which files are models (tempcal.models.detect): TorchScript archives only, never a torch.save zip of tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tempcal.errors import TempcalError
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
