"""Safetensors shards read in chunks (tempcal.sources.safetensors), kept or streamed, give the in-memory figures."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import write_shards
from reference import optimal_temperature

import tempcal


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_sharded_chunked_equals_in_memory(tmp_path, device, reads):
    paths, logits, labels = write_shards(tmp_path, [700, 1, 555, 1200])
    data = tempcal.open_source(paths).data
    assert (data.resident is not None) == (reads == "resident")
    streamed = tempcal.Scan(data, device=device, chunk_rows=97)
    whole = tempcal.Scan(tempcal.as_logits_data(logits, labels), device=device)
    t_streamed = tempcal.fit_temperature(streamed).temperature
    t_whole = tempcal.fit_temperature(whole).temperature
    assert abs(t_streamed - t_whole) / t_whole < 1e-6
    assert abs(t_streamed - optimal_temperature(logits, labels)) / t_whole < 1e-6
    a, b = tempcal.evaluate(streamed, 1.7), tempcal.evaluate(whole, 1.7)
    for key in ("nll", "ece", "mce", "brier", "accuracy", "entropy"):
        assert getattr(a, key) == pytest.approx(getattr(b, key), abs=1e-7)
    rows = torch.arange(3, len(labels), 5)
    a, b = tempcal.evaluate(streamed.select(rows), 0.8), tempcal.evaluate(whole.select(rows), 0.8)
    assert a.ece == pytest.approx(b.ece, abs=1e-7) and a.nll == pytest.approx(b.nll, abs=1e-7)


def test_a_kept_input_is_read_once_whatever_the_passes(tmp_path, monkeypatch):
    import tempcal.sources.safetensors

    paths, logits, labels = write_shards(tmp_path, [300, 200], dtype=torch.float32)
    reads = []
    real = tempcal.sources.safetensors._read_slice
    monkeypatch.setattr(tempcal.sources.safetensors, "_read_slice", lambda *args: (reads.append(args[2]), real(*args)))
    monkeypatch.setattr(tempcal.sources.safetensors._Resident, "SLICE_BYTES", 4096)
    scan = tempcal.Scan(tempcal.open_source(paths).data, device="cpu", chunk_rows=64)
    fitted = tempcal.fit_temperature(scan.select(torch.arange(0, 500, 2)))
    tempcal.evaluate(scan.select(torch.arange(1, 500, 2)), fitted.temperature)
    assert fitted.passes >= 3
    expected = sum(-(-size * 12 * 4 // 4096) for size in (300, 200))  # slices of each shard
    assert len(reads) == expected
    assert abs(fitted.temperature - optimal_temperature(logits[::2], labels[::2])) / fitted.temperature < 1e-6


def test_a_file_truncated_after_its_header_was_read_is_an_error(tmp_path, reads):
    from tempcal.errors import TempcalError

    paths, _, _ = write_shards(tmp_path, [300])
    data = tempcal.open_source(paths).data
    os.truncate(paths[0], paths[0].stat().st_size - 1000)
    with pytest.raises(TempcalError, match="file ended early"):
        tempcal.Scan(data, device="cpu")


def test_resident_limit_from_the_environment(monkeypatch):
    from tempcal.errors import TempcalError
    from tempcal.sources.safetensors import RESIDENT_BYTES, resident_limit

    monkeypatch.delenv("TEMPCAL_RESIDENT_BYTES", raising=False)
    assert resident_limit() == RESIDENT_BYTES
    monkeypatch.setenv("TEMPCAL_RESIDENT_BYTES", "1000")
    assert resident_limit() == 1000
    monkeypatch.setenv("TEMPCAL_RESIDENT_BYTES", "lots")
    with pytest.raises(TempcalError, match="TEMPCAL_RESIDENT_BYTES"):
        resident_limit()
