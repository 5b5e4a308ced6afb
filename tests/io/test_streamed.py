"""Tensors written chunk by chunk (``tempcal apply``'s output): read back by the libraries that own the formats."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from conftest import files_in
from safetensors import safe_open

from tempcal.errors import TempcalError
from tempcal.io.streamed import Planned, write_streamed


def planned(values: torch.Tensor, name: str = "probs", rows: int = 7) -> Planned:
    return Planned(name, values.dtype, tuple(values.shape), lambda: (values[k:k + rows] for k in range(0, len(values),
                                                                                                        rows)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_safetensors_read_back_by_safetensors(tmp_path, dtype):
    values = (torch.randn(50, 3) * 10).to(dtype)
    labels = torch.arange(50)
    path = write_streamed(tmp_path / "out.safetensors", [planned(values), planned(labels, "labels", 9)],
                          metadata={"tempcal.applied": "probs"})
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"tempcal.applied": "probs"} and list(f.keys()) == ["labels", "probs"]
        assert torch.equal(f.get_tensor("probs"), values) and torch.equal(f.get_tensor("labels"), labels)
    (length,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert length % 8 == 0  # the header padded as the safetensors library pads it


def test_npz_and_npy_read_back_by_numpy(tmp_path):
    values = torch.randn(40, 4, dtype=torch.float64)
    write_streamed(tmp_path / "out.npz", [planned(values), planned(torch.arange(40), "labels")])
    with np.load(tmp_path / "out.npz", allow_pickle=False) as archive:
        assert sorted(archive.files) == ["labels", "probs"]
        np.testing.assert_array_equal(archive["probs"], values.numpy())
    write_streamed(tmp_path / "out.npy", [planned(values)])
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy", mmap_mode="r"), values.numpy())
    with pytest.raises(TempcalError, match="holds one array, not 2"):
        write_streamed(tmp_path / "two.npy", [planned(values), planned(values, "other")])


def test_fewer_bytes_than_declared_leave_nothing(tmp_path):
    values = torch.randn(10, 2)
    short = Planned("probs", values.dtype, (11, 2), lambda: [values])
    with pytest.raises(TempcalError, match="bytes were computed where 88 were declared"):
        write_streamed(tmp_path / "out.safetensors", [short])
    assert files_in(tmp_path) == []
