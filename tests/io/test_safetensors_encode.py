"""The one safetensors header encoder (tempcal.io.safetensors_header.encode_header): what it writes loads with
safetensors' own reader, whatever the JSON's length before padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors import safe_open

from tempcal.io.safetensors_header import dtype_code, encode_header, laid_out, read_header


@pytest.mark.parametrize("extra", range(8))
def test_encoded_header_loads_with_safe_open(tmp_path, extra):
    """Names one character longer each time: the JSON's length takes every remainder mod 8, so every padding
    (0 to 7 spaces) is written; safetensors reads back the metadata and every tensor's values."""
    tensors = {"logits" + "x" * extra: torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7,
               "labels": torch.tensor([2, 0, 3], dtype=torch.int64),
               "half": torch.tensor([[0.5, -1.25]], dtype=torch.bfloat16)}
    metadata = {"tempcal.temperature": "1.5", "note": "é" * extra}
    header = encode_header(laid_out((k, dtype_code(v.dtype), v.shape) for k, v in tensors.items()), metadata)
    assert len(header) % 8 == 0 and int.from_bytes(header[:8], "little") == len(header) - 8
    path = tmp_path / "encoded.safetensors"
    path.write_bytes(header + b"".join(v.contiguous().view(torch.uint8).numpy().tobytes() for v in tensors.values()))
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == metadata
        assert sorted(f.keys()) == sorted(tensors)
        for name, value in tensors.items():
            loaded = f.get_tensor(name)
            assert loaded.dtype == value.dtype and torch.equal(loaded, value)
    assert read_header(path).metadata == metadata


def test_lengths_cover_every_padding():
    """The cases above do pad by every amount from 0 to 7 (else the test would not test what it says)."""
    paddings = set()
    for extra in range(8):
        layout = laid_out([("logits" + "x" * extra, "F32", (3, 4)), ("labels", "I64", (3,)), ("half", "BF16", (1, 2))])
        header = encode_header(layout, {"tempcal.temperature": "1.5", "note": "é" * extra})
        paddings.add(len(header) - len(header.rstrip(b" ")))
    assert paddings == set(range(8))


def test_layout_and_no_empty_metadata(tmp_path):
    """Offsets follow each other from 0; without metadata no ``__metadata__`` is written (safetensors: None)."""
    infos = laid_out([("a", "F16", (2, 3)), ("b", "U8", (0,)), ("c", "F64", (5,))])
    assert [(i.begin, i.end) for i in infos.values()] == [(0, 12), (12, 12), (12, 52)]
    path = tmp_path / "plain.safetensors"
    path.write_bytes(encode_header(infos) + np.arange(52, dtype=np.uint8).tobytes())
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() is None and f.get_tensor("c").shape == (5,)
