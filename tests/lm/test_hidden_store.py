"""tempcal.lm.hidden: hidden states in memory or in a file without a name read the same; saving them."""

from __future__ import annotations

import errno
import os

import pytest
import torch
from safetensors.torch import load_file

from tempcal.errors import TempcalError
from tempcal.lm.hidden import HiddenStore, StoredHidden, save_hidden


def filled(budget: int, folder, rows: int = 50, width: int = 6, dtype=torch.bfloat16, lo: int = 0,
           hi: int | None = None):
    hi = rows if hi is None else hi
    data = torch.randn(rows, width, generator=torch.Generator().manual_seed(0)).to(dtype)
    store = HiddenStore(lo, hi, width, dtype, budget=budget, folder=folder)
    for start in range(lo, hi, 7):  # written out of order, in pieces, as batches of texts do
        store.write(start, data[start : min(start + 7, hi)])
    return store, data


def rows_of(hidden: StoredHidden, chunk: int = 8) -> torch.Tensor:
    return torch.cat([h for _, h, _ in hidden.chunks(chunk, torch.device("cpu"), torch.float32)])


def test_memory_and_file_hold_the_same_rows_and_the_file_has_no_name(tmp_path):
    labels = torch.arange(50)
    in_memory, data = filled(1 << 30, tmp_path)
    on_disk, _ = filled(0, tmp_path)
    assert not in_memory.spilled and on_disk.spilled
    assert os.listdir(tmp_path) == []  # unlinked at once: nothing to remove, whatever ends the process
    for store in (in_memory, on_disk):
        hidden = StoredHidden(store, labels)
        assert torch.equal(rows_of(hidden), data.float())
        picked = hidden.select(torch.tensor([3, 9, 10, 41])).select(torch.tensor([1, 3]))
        assert torch.equal(rows_of(picked, 1), data[[9, 41]].float())
        assert [picked.original_index(i) for i in range(2)] == [9, 41]
        assert torch.equal(picked.labels, torch.tensor([9, 41]))


def test_a_share_of_the_rows_is_read_and_rows_outside_it_are_never_returned(tmp_path):
    store, data = filled(0, tmp_path, lo=20, hi=35)
    hidden = StoredHidden(store, torch.arange(50))
    assert torch.equal(rows_of(hidden.select(torch.arange(20, 35))), data[20:35].float())
    with pytest.raises(RuntimeError, match="not computed by this process"):
        rows_of(hidden.select(torch.arange(10, 30)))


def test_a_full_disk_is_one_error_before_the_forward_pass(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    with pytest.raises(TempcalError, match=r"cannot reserve .* for the hidden states \(No space left on device\)"):
        HiddenStore(0, 1000, 64, torch.float32, budget=0, folder=tmp_path)


def test_saved_rows_are_a_safetensors_source(tmp_path):
    store, data = filled(0, tmp_path, dtype=torch.float16)
    labels = torch.randint(0, 9, (50,))
    path = save_hidden(tmp_path / "hidden.safetensors", StoredHidden(store, labels), {"tempcal.texts": "t.txt"})
    tensors = load_file(str(path))
    assert torch.equal(tensors["hidden"], data) and torch.equal(tensors["labels"], labels)
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"tempcal.texts": "t.txt"}
