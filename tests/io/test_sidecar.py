"""The T sidecar of formats without metadata (tempcal.io.sidecar): exact round trip, fingerprint, atomic writes."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from conftest import logits_of, numpy_logits, one_line, sha256, write_logits

import tempcal.io.paths
from tempcal.errors import TEMPERATURE_KEY, TempcalError
from tempcal.io.paths import sidecar_path
from tempcal.io.sidecar import check_regular_file, read_sidecar, write_sidecar
from tempcal.sources.registry import open_source, read_stored_temperature, write_stored_temperature


@pytest.mark.parametrize("kind", ["npz", "npy", "pt"])
def test_sidecar_round_trip_is_exact_and_fingerprints_the_file(tmp_path, kind):
    z, y = numpy_logits(n=20)
    path = write_logits(kind, tmp_path, z, y)
    before = path.read_bytes()
    temperature = 1 / 3
    written = write_stored_temperature(path, temperature)
    assert written == sidecar_path(path) == path.with_name(path.name + ".tempcal.json")
    assert path.read_bytes() == before
    record = json.loads(written.read_text())
    assert record["sha256"] == sha256(path) and record["size"] == len(before)
    assert record["metadata"] == {TEMPERATURE_KEY: repr(temperature)}
    assert read_stored_temperature(path) == (temperature, [])
    assert open_source(path).stored_temperature == temperature


def test_sidecar_is_current_after_touch_or_copy_and_stale_after_a_change(tmp_path):
    z, y = numpy_logits(n=20)
    path = write_logits("npz", tmp_path, z, y)
    write_sidecar(path, 2.0)
    os.utime(path, ns=(10**9, 10**9))  # same bytes, new mtime: the hash decides
    assert read_stored_temperature(path) == (2.0, [])
    (tmp_path / "copy").mkdir()
    shutil.copy(path, tmp_path / "copy" / path.name)  # copy() does not keep the mtime
    shutil.copy(sidecar_path(path), tmp_path / "copy" / sidecar_path(path).name)
    assert read_stored_temperature(tmp_path / "copy" / path.name) == (2.0, [])
    np.savez(path, logits=z[::-1].copy(), labels=y)  # same size, other bytes
    assert path.stat().st_size == json.loads(sidecar_path(path).read_text())["size"]
    temperature, notes = read_stored_temperature(path)
    assert temperature is None and len(notes) == 1 and "changed" in notes[0] and "tempcal fit" in notes[0]
    loaded = open_source(path)
    assert loaded.stored_temperature is None and loaded.warnings == list(notes)
    write_sidecar(path, 4.0)  # a new fit refreshes it
    assert read_stored_temperature(path) == (4.0, [])


def test_rewrite_keeps_other_metadata_of_a_current_sidecar(tmp_path):
    z, y = numpy_logits(n=20)
    path = write_logits("pt", tmp_path, z, y)
    write_sidecar(path, 2.0, metadata={"model": "resnet-18"})
    write_sidecar(path, 3.0)
    assert json.loads(sidecar_path(path).read_text())["metadata"] == {"model": "resnet-18", TEMPERATURE_KEY: "3.0"}


@pytest.mark.parametrize("content", ["{not json", '{"metadata": {"tempcal.temperature": "2"}}', "[1, 2]",
                                     '{"metadata": {"tempcal.temperature": "-1"}, "size": 1, "mtime_ns": 1, '
                                     '"sha256": "x"}'])
def test_malformed_sidecar_fails_only_when_the_stored_t_is_asked_for(tmp_path, content):
    z, y = numpy_logits(n=20)
    path = write_logits("npz", tmp_path, z, y)
    side = sidecar_path(path)
    side.write_text(content)
    if "-1" in content:  # well-formed but a bad value: make the fingerprint current
        record = json.loads(content)
        record.update(size=path.stat().st_size, mtime_ns=path.stat().st_mtime_ns, sha256=sha256(path))
        side.write_text(json.dumps(record))
    loaded = open_source(path)  # a fit can still run on the file ...
    assert np.array_equal(logits_of(loaded.data).numpy(), z)
    with pytest.raises(TempcalError) as exc:
        _ = loaded.stored_temperature
    assert one_line(exc).startswith(f"{side}: ")
    write_sidecar(path, 1.5)  # ... and its write-back replaces the broken sidecar
    assert read_stored_temperature(path) == (1.5, [])


def test_sidecar_write_is_atomic_fsynced_and_leaves_nothing_on_failure(tmp_path, monkeypatch):
    z, y = numpy_logits(n=20)
    path = write_logits("npz", tmp_path, z, y)
    write_sidecar(path, 2.0)
    side = sidecar_path(path)
    old = side.read_bytes()
    calls: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(tempcal.io.paths.os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])

    def failing_replace(src, dst):
        calls.append("replace")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempcal.io.paths.os, "replace", failing_replace)
    with pytest.raises(TempcalError) as exc:
        write_sidecar(path, 3.0)
    assert "No space left" in one_line(exc)
    assert calls[:2] == ["fsync", "replace"]  # the data reached the disk before the rename
    assert side.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, side.name])


def test_a_planted_sidecar_link_is_refused_and_its_target_kept(tmp_path):
    """A ``FILE.tempcal.json`` that links elsewhere (a downloaded folder) is never written through."""
    z, y = numpy_logits(n=20)
    path = write_logits("npz", tmp_path, z, y)
    target = tmp_path / "kept" / "real.json"
    target.parent.mkdir()
    target.write_text("{}")
    sidecar_path(path).symlink_to(target)
    with pytest.raises(TempcalError) as exc:
        write_sidecar(path, 2.25)
    assert str(sidecar_path(path)) in one_line(exc) and "symbolic link" in one_line(exc)
    assert target.read_text() == "{}"
    assert sidecar_path(path).is_symlink()


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_temperature_is_not_written(tmp_path, bad):
    z, y = numpy_logits(n=20)
    path = write_logits("npz", tmp_path, z, y)
    with pytest.raises(TempcalError):
        write_sidecar(path, bad)
    assert not sidecar_path(path).exists()


def test_read_sidecar_without_one(tmp_path):
    z, y = numpy_logits(n=20)
    path = write_logits("npz", tmp_path, z, y)
    assert read_sidecar(path) == ({}, [])


@pytest.mark.parametrize("case", ["digits", "nested", "fifo", "huge"])
def test_a_hostile_sidecar_is_one_line_and_exit_2(tmp_path, cli, case):
    """A sidecar with a 5,000-digit size, nesting past Python's stack, a FIFO in its place or 2 MB of spaces."""
    logits, labels = numpy_logits()
    path = tmp_path / "val.npz"
    np.savez(path, logits=logits, labels=labels)
    side = sidecar_path(path)
    if case == "digits":
        side.write_text('{"tempcal_sidecar": 1, "size": ' + "9" * 5000 + "}")
    elif case == "nested":
        side.write_text("[" * 100_000 + "]" * 100_000)
    elif case == "fifo":
        os.mkfifo(side)
    else:
        side.write_text("{}" + " " * (2 << 20))
    code, out, err = cli(["report", str(path), "--no-config"])
    assert code == 2 and err.count("\n") == 1 and str(side) in err, err
    assert out == ""


def test_a_path_that_cannot_be_looked_at_is_not_called_missing(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    check_regular_file(plain)
    cases = {tmp_path / "gone.txt": "no such file", tmp_path: "not a regular file",
             plain / "inside.txt": "cannot read (Not a directory)",
             tmp_path / ("n" * 300): "cannot read (File name too long)"}
    for path, said in cases.items():
        with pytest.raises(TempcalError) as caught:
            check_regular_file(path)
        assert str(caught.value) == f"{path}: {said}"
