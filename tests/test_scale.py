"""Shards, chunked reads, token-level logits and torch.distributed give the in-memory figures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from reference import ece_loop, miscalibrated, optimal_temperature
from safetensors import safe_open
from safetensors.torch import save_file

import tempcal
from tempcal.cli.main import main


@pytest.fixture(params=["resident", "streamed"])
def reads(request, monkeypatch) -> str:
    """Inputs up to 256 MiB are read once and kept, larger ones read a chunk at a time on every pass: test both."""
    if request.param == "streamed":
        monkeypatch.setenv("TEMPCAL_RESIDENT_BYTES", "0")
    return request.param


def write_shards(folder: Path, sizes, *, c=12, dtype=torch.float64, seed=0):
    logits, labels = miscalibrated(sum(sizes), c, 2.3, seed=seed, dtype=dtype)
    paths, start = [], 0
    for k, size in enumerate(sizes):
        path = folder / f"part-{k:02d}.safetensors"
        save_file({"logits": logits[start:start + size].contiguous(), "labels": labels[start:start + size].clone()},
                  str(path))
        paths.append(path)
        start += size
    return paths, logits, labels


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


def test_cli_on_a_glob_of_shards_writes_each_shard(tmp_path, capsys, reads):
    paths, logits, labels = write_shards(tmp_path, [400, 300, 500])
    assert main(["fit", str(tmp_path / "part-*.safetensors"), "--val-fraction", "1.0", "--json", "-",
                 "--chunk-rows", "64"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_fit"] == len(labels)
    assert abs(out["temperature"] - optimal_temperature(logits, labels)) / out["temperature"] < 1e-6
    assert out["after"]["ece"] == pytest.approx(ece_loop(logits, labels, out["temperature"])[0], abs=1e-9)
    for path in paths:
        with safe_open(str(path), "pt") as f:
            assert float(f.metadata()["tempcal.temperature"]) == out["temperature"]


def test_glob_without_match_and_mixed_shards_are_bad_input(tmp_path, capsys):
    assert main(["fit", str(tmp_path / "nothing-*.safetensors")]) == 2
    assert "no file matches" in capsys.readouterr().err
    write_shards(tmp_path, [50], c=4)
    other = tmp_path / "other.safetensors"
    save_file({"logits": torch.randn(30, 5), "labels": torch.zeros(30, dtype=torch.long)}, str(other))
    assert main(["fit", str(tmp_path / "part-00.safetensors"), str(other), "--no-write"]) == 2
    assert "unlike the shards before it" in capsys.readouterr().err


def test_token_level_logits_skip_the_ignore_index(tmp_path, capsys, reads):
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 40, 30, generator=g, dtype=torch.float64) * 3
    labels = torch.multinomial(torch.softmax(logits.reshape(-1, 30) / 3, 1), 1, generator=g)[:, 0].reshape(6, 40)
    labels[:, 30:] = -100  # padding
    labels[2, :5] = -100
    path = tmp_path / "tokens.safetensors"
    save_file({"logits": logits, "labels": labels}, str(path))
    assert main(["report", str(path), "--tau", "2", "--json", "-"]) == 0
    row = json.loads(capsys.readouterr().out)["results"][0]
    expected = F.cross_entropy(logits.reshape(-1, 30) / 2, labels.reshape(-1), ignore_index=-100)
    assert row["nll"] == pytest.approx(float(expected), rel=1e-9)
    keep = labels.reshape(-1) != -100
    assert sum(b["count"] for b in row["bins"]) == int(keep.sum())
    assert row["ece"] == pytest.approx(ece_loop(logits.reshape(-1, 30)[keep], labels.reshape(-1)[keep], 2)[0],
                                       abs=1e-9)
    api = tempcal.calibration_metrics(logits, labels, 2.0, device="cpu")
    assert api.nll == pytest.approx(float(expected), rel=1e-9)


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


def _torchrun() -> list[str] | None:
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    return [exe] if exe else None


@pytest.mark.skipif(_torchrun() is None, reason="torchrun not installed")
def test_two_processes_with_gloo_match_one(tmp_path, reads):
    write_shards(tmp_path, [900, 650, 1100], seed=9, dtype=torch.float32)
    pattern = str(tmp_path / "part-*.safetensors")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # with TEMPCAL_RESIDENT_BYTES as ``reads`` set it
    common = ["fit", pattern, "--no-write", "--device", "cpu", "--quiet", "--val-fraction", "0.6", "--seed", "2"]
    single = subprocess.run([sys.executable, "-m", "tempcal", *common, "--json", str(tmp_path / "one.json")],
                            capture_output=True, text=True, env=env, timeout=300)
    assert single.returncode == 0, single.stderr
    launched = subprocess.run([*_torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "tempcal", *common,
                               "--json", str(tmp_path / "two.json")], capture_output=True, text=True, env=env,
                              timeout=300)
    assert launched.returncode == 0, launched.stderr[-2000:]
    one = json.loads((tmp_path / "one.json").read_text())
    two = json.loads((tmp_path / "two.json").read_text())
    assert abs(one["temperature"] - two["temperature"]) / one["temperature"] < 1e-6
    assert (one["n_fit"], one["n_eval"]) == (two["n_fit"], two["n_eval"])
    for side in ("before", "after"):
        for key in ("nll", "ece", "mce", "brier", "accuracy", "entropy"):
            assert two[side][key] == pytest.approx(one[side][key], abs=1e-6)
