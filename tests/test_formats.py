"""Inputs beyond safetensors (.npz, .npy pairs, .pt tensor dicts) and the T sidecar of formats without metadata.

Loaded arrays are compared bit for bit with what numpy/torch saved, fits on them against scipy's
float64 optimum, sidecar fingerprints against hashlib; unsafe files must be refused unexecuted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from reference import optimal_temperature
from safetensors import safe_open
from safetensors.torch import save_file

import tempcal.io.atomic
from tempcal.core.fitting import fit_temperature
from tempcal.errors import DataError, TempcalError
from tempcal.io.sidecar import read_sidecar, sidecar_path, write_sidecar
from tempcal.sources.numpy import npy_labels_path
from tempcal.sources.registry import open_source, read_stored_temperature, write_stored_temperature
from tempcal.validation import TEMPERATURE_KEY

MARKER = "unpickled.marker"


def logits_of(data) -> torch.Tensor:
    """The logits a source holds, in their stored dtype (safetensors files are read as chunked sources)."""
    if hasattr(data, "logits"):
        return data.logits
    rows = data.resident.load()
    return (rows if data.rows is None else rows[data.rows]).squeeze(1) if data.binary else (
        rows if data.rows is None else rows[data.rows])


def make(n: int = 600, c: int = 5, scale: float = 3.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Overconfident float32 logits (``scale`` times the scale the labels were drawn at) and int64 labels."""
    rng = np.random.default_rng(seed)
    base = 2 * rng.normal(size=(n, c))
    p = np.exp(base - base.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    labels = np.minimum((rng.random((n, 1)) > p.cumsum(1)).sum(1), c - 1)
    return (scale * base).astype(np.float32), labels.astype(np.int64)


class Evil:
    """Unpickling this creates MARKER in the working folder: proof that a loader executed a pickle."""

    def __reduce__(self):
        return (open, (MARKER, "w"))


def one_line(exc: pytest.ExceptionInfo) -> str:
    """The error as the command line shows it (parameters named by their flags)."""
    text = exc.value.for_cli()
    assert "\n" not in text and text, text
    return text


def save(kind: str, folder: Path, logits, labels, *, logits_key="logits", labels_key="labels") -> Path:
    """Write logits and labels in ``kind`` with the library that owns the format (never tempcal)."""
    if kind == "npz":
        path = folder / "data.npz"
        np.savez(path, **{logits_key: logits, labels_key: labels})
    elif kind == "npy":
        path = folder / f"val_{logits_key}.npy"
        np.save(path, logits)
        np.save(folder / f"val_{labels_key}.npy", labels)
    elif kind in ("pt", "pt-legacy"):
        path = folder / "data.pt"
        torch.save({logits_key: torch.as_tensor(logits), labels_key: torch.as_tensor(labels), "note": "val split"},
                   path, _use_new_zipfile_serialization=kind == "pt")
    else:
        path = folder / "data.safetensors"
        save_file({logits_key: torch.as_tensor(logits).contiguous(), labels_key: torch.as_tensor(labels)}, str(path))
    return path


# -- loading ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["npz", "npy", "pt", "pt-legacy", "safetensors"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_every_format_loads_the_saved_values_exactly_and_fits_scipys_optimum(tmp_path, kind, dtype):
    z, y = make()
    z = z.astype(dtype)
    path = save(kind, tmp_path, z, y)
    loaded = open_source(path)
    assert loaded.kind.name == kind.removesuffix("-legacy")
    assert loaded.has_labels and loaded.warnings == [] and loaded.stored_temperature is None
    assert loaded.paths == [path]
    assert logits_of(loaded.data).dtype == torch.from_numpy(z).dtype
    assert np.array_equal(logits_of(loaded.data).numpy(), z)
    assert np.array_equal(loaded.data.labels.numpy(), y)
    if dtype != np.float16:  # float16 rounding makes scipy's optimum on the rounded values the reference
        expected = optimal_temperature(torch.from_numpy(z), torch.from_numpy(y))
        fitted = fit_temperature(logits_of(loaded.data), loaded.data.labels, device="cpu").temperature
        assert abs(fitted - expected) / expected < 1e-6


@pytest.mark.parametrize("kind", ["pt", "safetensors"])
def test_bfloat16_logits_keep_their_bits(tmp_path, kind):
    z, y = make(n=50)
    logits = torch.from_numpy(z).to(torch.bfloat16)
    path = save(kind, tmp_path, logits, torch.from_numpy(y))
    loaded = open_source(path)
    assert logits_of(loaded.data).dtype == torch.bfloat16
    assert torch.equal(logits_of(loaded.data).view(torch.int16), logits.view(torch.int16))


@pytest.mark.parametrize("kind", ["npz", "npy", "pt"])
def test_netcal_style_keys(tmp_path, kind):
    z, y = make(n=40)
    path = save(kind, tmp_path, z, y, logits_key="predictions", labels_key="ground_truth")
    loaded = open_source(path, logits_key="predictions", labels_key="ground_truth")
    assert np.array_equal(logits_of(loaded.data).numpy(), z) and np.array_equal(loaded.data.labels.numpy(), y)


@pytest.mark.parametrize("kind", ["npz", "pt"])
@pytest.mark.parametrize("missing", ["logits", "labels"])
def test_missing_key_lists_the_keys_and_the_option(tmp_path, kind, missing):
    z, y = make(n=40)
    path = save(kind, tmp_path, z, y, logits_key="predictions", labels_key="ground_truth")
    keys = {"logits_key": "predictions", "labels_key": "ground_truth"}
    keys[f"{missing}_key"] = missing
    with pytest.raises(TempcalError) as exc:
        open_source(path, **keys)
    message = one_line(exc)
    assert message.startswith(f"{path}: no ") and f"'{missing}'" in message
    assert "'predictions'" in message and "'ground_truth'" in message and f"--{missing}-key" in message


def test_probs_flag_reads_probabilities_as_log_probabilities(tmp_path):
    z, y = make(n=30)
    p = np.exp(z.astype(np.float64) - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.savez(tmp_path / "p.npz", logits=p, labels=y)
    loaded = open_source(tmp_path / "p.npz", probs=True)
    np.testing.assert_allclose(logits_of(loaded.data).numpy(), np.log(p), rtol=0, atol=1e-12)


def test_big_endian_and_unsigned_arrays_load_with_their_values(tmp_path):
    z, y = make(n=30)
    np.savez(tmp_path / "be.npz", logits=z.astype(">f8"), labels=y.astype(">u4"))
    loaded = open_source(tmp_path / "be.npz")
    assert np.array_equal(logits_of(loaded.data).numpy(), z.astype(np.float64))
    assert np.array_equal(loaded.data.labels.numpy(), y)


@pytest.mark.parametrize(("logits", "labels", "words"), [
    (np.array([["a", "b"]] * 3), np.zeros(3, np.int64), ["numpy dtype <U1", "float16, float32 or float64"]),
    (np.zeros((3, 2), np.float32), np.zeros(3, np.float32), ["'labels'", "float32", "integer"]),
    (np.zeros((3, 2), np.int32), np.zeros(3, np.int64), ["'logits'", "int32"]),
    (np.zeros((3, 2, 2), np.float32), np.zeros(3, np.int64), ["'logits'", "[3, 2, 2]"]),
    (np.zeros((3, 2), np.float32), np.zeros(4, np.int64), ["3 rows", "4"]),
])
def test_bad_arrays_are_one_line_data_errors_naming_the_file(tmp_path, logits, labels, words):
    np.savez(tmp_path / "bad.npz", logits=logits, labels=labels)
    with pytest.raises(DataError) as exc:
        open_source(tmp_path / "bad.npz")
    message = one_line(exc)
    assert message.startswith(f"{tmp_path / 'bad.npz'}: ")
    assert all(w in message for w in words), message


@pytest.mark.parametrize(("name", "content", "words"), [
    ("x.csv", b"1,2", ["unknown logits file type", ".npz"]),
    ("noise.npz", b"not a zip", ["not an .npz archive"]),
    ("noise.npy", b"not numpy", ["not an .npy array"]),
    ("noise.pt", b"not torch", ["not a torch.save file"]),
    ("broken.pt", b"\x80\x02garbage", ["not a readable torch.save file"]),
])
def test_unreadable_files_are_one_line_errors(tmp_path, name, content, words):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(TempcalError) as exc:
        open_source(tmp_path / name, labels_key="labels.npy" if name.endswith(".npy") else "labels")
    message = one_line(exc)
    assert all(w in message for w in words), message


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(TempcalError, match="no such file"):
        open_source(tmp_path / "absent.npz")
    (tmp_path / "folder.pt").mkdir()
    with pytest.raises(TempcalError, match="not a regular file"):
        open_source(tmp_path / "folder.pt")


def test_swapped_npz_and_npy_suffixes_say_what_the_file_is(tmp_path):
    z, y = make(n=10)
    np.save(tmp_path / "single.npy", z)
    shutil.copy(tmp_path / "single.npy", tmp_path / "single.npz")
    with pytest.raises(TempcalError, match=r"single \.npy array"):
        open_source(tmp_path / "single.npz")
    np.savez(tmp_path / "archive.npz", logits=z, labels=y)
    shutil.copy(tmp_path / "archive.npz", tmp_path / "archive_logits.npy")
    with pytest.raises(TempcalError, match=r"is an \.npz archive"):
        open_source(tmp_path / "archive_logits.npy")


# -- never unpickle ------------------------------------------------------------------------------


def test_pt_with_arbitrary_objects_is_refused_without_running_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    z, y = make(n=10)
    torch.save({"logits": torch.from_numpy(z), "labels": torch.from_numpy(y), "extra": Evil()}, "evil.pt")
    with pytest.raises(TempcalError) as exc:
        open_source("evil.pt")
    message = one_line(exc)
    assert "refused" in message and "weights_only=True" in message and ".open" in message
    assert not (tmp_path / MARKER).exists()


def test_numpy_arrays_inside_pt_are_refused_with_a_hint(tmp_path):
    z, y = make(n=10)
    torch.save({"logits": z, "labels": y}, tmp_path / "np.pt")
    with pytest.raises(TempcalError) as exc:
        open_source(tmp_path / "np.pt")
    assert "numpy arrays" in one_line(exc)


@pytest.mark.parametrize("kind", ["npz", "npy"])
def test_object_arrays_are_refused_without_running_them(tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)
    evil = np.array([[Evil(), Evil()]] * 3, dtype=object)
    if kind == "npz":
        np.savez("evil.npz", logits=evil, labels=np.zeros(3, np.int64))
        path = "evil.npz"
    else:
        np.save("evil_logits.npy", evil, allow_pickle=True)
        np.save("evil_labels.npy", np.zeros(3, np.int64))
        path = "evil_logits.npy"
    with pytest.raises(TempcalError) as exc:
        open_source(path)
    assert "never unpickles" in one_line(exc)
    assert not (tmp_path / MARKER).exists()


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_torchscript_archive_is_not_read_as_a_tensor_dict(tmp_path):
    torch.jit.script(torch.nn.Linear(3, 2)).save(str(tmp_path / "model.pt"))
    with pytest.raises(TempcalError) as exc:
        open_source(tmp_path / "model.pt")
    message = one_line(exc)
    assert "TorchScript model" in message and "--inputs" in message


@pytest.mark.parametrize("content", [torch.zeros(3, 2), [torch.zeros(3, 2), torch.zeros(3)]])
def test_pt_that_is_not_a_dict(tmp_path, content):
    torch.save(content, tmp_path / "plain.pt")
    with pytest.raises(TempcalError, match="not a dict of tensors"):
        open_source(tmp_path / "plain.pt")


def test_pt_value_that_is_not_a_tensor(tmp_path):
    torch.save({"logits": [[1.0, 2.0]], "labels": torch.zeros(1, dtype=torch.int64)}, tmp_path / "list.pt")
    with pytest.raises(TempcalError, match="'logits' is a list, not a tensor"):
        open_source(tmp_path / "list.pt")


# -- .npy pairs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("logits", "logits_key", "labels_key", "expected"), [
    ("runs/logits.npy", "logits", "labels", "runs/labels.npy"),
    ("runs/val_logits.npy", "logits", "labels", "runs/val_labels.npy"),
    ("runs/logits_of_logits.npy", "logits", "labels", "runs/logits_of_labels.npy"),  # the last occurrence
    ("cifar_predictions.npy", "predictions", "ground_truth", "cifar_ground_truth.npy"),
    ("runs/logits.npy", "logits", "elsewhere/y.npy", "elsewhere/y.npy"),  # a path, as given
    ("runs/scores.npy", "logits", "labels", None),
])
def test_npy_labels_file_naming_rule(logits, logits_key, labels_key, expected):
    found = npy_labels_path(logits, logits_key, labels_key)
    assert found == (None if expected is None else Path(expected))


def test_npy_labels_by_explicit_path(tmp_path):
    z, y = make(n=20)
    np.save(tmp_path / "scores.npy", z)
    (tmp_path / "sub").mkdir()
    np.save(tmp_path / "sub" / "targets.npy", y)
    loaded = open_source(tmp_path / "scores.npy", labels_key=str(tmp_path / "sub" / "targets.npy"))
    assert np.array_equal(loaded.data.labels.numpy(), y)


def test_npy_without_a_derivable_labels_name(tmp_path):
    np.save(tmp_path / "scores.npy", make(n=5)[0])
    with pytest.raises(TempcalError) as exc:
        open_source(tmp_path / "scores.npy")
    assert "--labels-key PATH.npy" in one_line(exc)


def test_npy_missing_labels_file_lists_the_npy_files_there(tmp_path):
    z, y = make(n=5)
    np.save(tmp_path / "val_logits.npy", z)
    np.save(tmp_path / "val_targets.npy", y)
    with pytest.raises(TempcalError) as exc:
        open_source(tmp_path / "val_logits.npy")
    message = one_line(exc)
    assert "val_labels.npy" in message and "val_targets.npy" in message and "--labels-key" in message
    assert np.array_equal(open_source(tmp_path / "val_logits.npy", labels_key="targets").data.labels.numpy(), y)


def test_npy_row_mismatch_names_both_files(tmp_path):
    z, y = make(n=5)
    np.save(tmp_path / "logits.npy", z)
    np.save(tmp_path / "labels.npy", y[:4])
    with pytest.raises(DataError) as exc:
        open_source(tmp_path / "logits.npy")
    message = one_line(exc)
    assert "'logits.npy' has 5 rows" in message and "'labels.npy' has 4" in message


# -- optional labels (out-of-distribution files) ------------------------------------------------


@pytest.mark.parametrize("kind", ["npz", "npy", "pt", "safetensors"])
def test_absent_labels_are_allowed_when_not_required(tmp_path, kind):
    z, _ = make(n=12)
    if kind == "npz":
        np.savez(tmp_path / "ood.npz", logits=z)
        path = tmp_path / "ood.npz"
    elif kind == "npy":
        path = tmp_path / "ood_logits.npy"
        np.save(path, z)
    elif kind == "pt":
        path = tmp_path / "ood.pt"
        torch.save({"logits": torch.from_numpy(z)}, path)
    else:
        path = tmp_path / "ood.safetensors"
        save_file({"logits": torch.from_numpy(z)}, str(path))
    loaded = open_source(path, labels_optional=True)
    assert not loaded.has_labels
    assert np.array_equal(logits_of(loaded.data).numpy(), z)
    assert loaded.data.labels.shape == (12,) and not bool(loaded.data.labels.any())
    with pytest.raises(TempcalError, match="labels"):
        open_source(path)


def test_present_labels_are_read_when_not_required(tmp_path):
    z, y = make(n=12)
    path = save("npz", tmp_path, z, y)
    loaded = open_source(path, labels_optional=True)
    assert loaded.has_labels and np.array_equal(loaded.data.labels.numpy(), y)


# -- the stored temperature: safetensors metadata or a sidecar -----------------------------------


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("kind", ["npz", "npy", "pt"])
def test_sidecar_round_trip_is_exact_and_fingerprints_the_file(tmp_path, kind):
    z, y = make(n=20)
    path = save(kind, tmp_path, z, y)
    before = path.read_bytes()
    temperature = 1 / 3
    written = write_stored_temperature(path, temperature)
    assert written == sidecar_path(path) == path.with_name(path.name + ".tempcal.json")
    assert path.read_bytes() == before
    record = json.loads(written.read_text())
    assert record["sha256"] == sha256_of(path) and record["size"] == len(before)
    assert record["metadata"] == {TEMPERATURE_KEY: repr(temperature)}
    assert read_stored_temperature(path) == (temperature, [])
    assert open_source(path).stored_temperature == temperature


def test_safetensors_write_goes_into_the_metadata_not_a_sidecar(tmp_path):
    z, y = make(n=20)
    path = save("safetensors", tmp_path, z, y)
    assert write_stored_temperature(path, 2.5) == path
    with safe_open(str(path), "pt") as f:
        assert f.metadata()[TEMPERATURE_KEY] == "2.5"
        assert np.array_equal(f.get_tensor("logits").numpy(), z)
    assert not sidecar_path(path).exists()
    assert read_stored_temperature(path) == (2.5, []) and open_source(path).stored_temperature == 2.5


def test_sidecar_is_current_after_touch_or_copy_and_stale_after_a_change(tmp_path):
    z, y = make(n=20)
    path = save("npz", tmp_path, z, y)
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
    z, y = make(n=20)
    path = save("pt", tmp_path, z, y)
    write_sidecar(path, 2.0, metadata={"model": "resnet-18"})
    write_sidecar(path, 3.0)
    assert json.loads(sidecar_path(path).read_text())["metadata"] == {"model": "resnet-18", TEMPERATURE_KEY: "3.0"}


@pytest.mark.parametrize("content", ["{not json", '{"metadata": {"tempcal.temperature": "2"}}', "[1, 2]",
                                     '{"metadata": {"tempcal.temperature": "-1"}, "size": 1, "mtime_ns": 1, '
                                     '"sha256": "x"}'])
def test_malformed_sidecar_fails_only_when_the_stored_t_is_asked_for(tmp_path, content):
    z, y = make(n=20)
    path = save("npz", tmp_path, z, y)
    side = sidecar_path(path)
    side.write_text(content)
    if "-1" in content:  # well-formed but a bad value: make the fingerprint current
        record = json.loads(content)
        record.update(size=path.stat().st_size, mtime_ns=path.stat().st_mtime_ns, sha256=sha256_of(path))
        side.write_text(json.dumps(record))
    loaded = open_source(path)  # a fit can still run on the file ...
    assert np.array_equal(logits_of(loaded.data).numpy(), z)
    with pytest.raises(TempcalError) as exc:
        _ = loaded.stored_temperature
    assert one_line(exc).startswith(f"{side}: ")
    write_sidecar(path, 1.5)  # ... and its write-back replaces the broken sidecar
    assert read_stored_temperature(path) == (1.5, [])


def test_sidecar_write_is_atomic_fsynced_and_leaves_nothing_on_failure(tmp_path, monkeypatch):
    z, y = make(n=20)
    path = save("npz", tmp_path, z, y)
    write_sidecar(path, 2.0)
    side = sidecar_path(path)
    old = side.read_bytes()
    calls: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(tempcal.io.atomic.os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])

    def failing_replace(src, dst):
        calls.append("replace")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempcal.io.atomic.os, "replace", failing_replace)
    with pytest.raises(TempcalError) as exc:
        write_sidecar(path, 3.0)
    assert "No space left" in one_line(exc)
    assert calls[:2] == ["fsync", "replace"]  # the data reached the disk before the rename
    assert side.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, side.name])


def test_symlinked_sidecar_is_written_through(tmp_path):
    z, y = make(n=20)
    path = save("npz", tmp_path, z, y)
    target = tmp_path / "kept" / "real.json"
    target.parent.mkdir()
    target.write_text("{}")
    sidecar_path(path).symlink_to(target)
    write_sidecar(path, 2.25)
    assert sidecar_path(path).is_symlink()
    assert json.loads(target.read_text())["metadata"][TEMPERATURE_KEY] == "2.25"
    assert read_stored_temperature(path) == (2.25, [])


def test_output_copies_npz_and_pt_and_stores_t_beside_the_copy(tmp_path):
    z, y = make(n=20)
    for kind in ("npz", "pt"):
        source = save(kind, tmp_path, z, y)
        before = source.read_bytes()
        output = tmp_path / f"calibrated{source.suffix}"
        written = write_stored_temperature(source, 1.75, output)
        assert written == sidecar_path(output)
        assert output.read_bytes() == before and source.read_bytes() == before
        assert not sidecar_path(source).exists()
        assert read_stored_temperature(output) == (1.75, [])
        assert np.array_equal(logits_of(open_source(output).data).numpy(), z)


def test_output_is_refused_where_no_copy_can_hold_t(tmp_path):
    z, y = make(n=20)
    npy = save("npy", tmp_path, z, y)
    with pytest.raises(TempcalError) as exc:
        write_stored_temperature(npy, 2.0, tmp_path / "out.npy")
    assert "--no-write" in one_line(exc)
    npz = save("npz", tmp_path, z, y)
    with pytest.raises(TempcalError, match="suffix"):
        write_stored_temperature(npz, 2.0, tmp_path / "out.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([npy.name, "val_labels.npy", npz.name])


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_temperature_is_not_written(tmp_path, bad):
    z, y = make(n=20)
    path = save("npz", tmp_path, z, y)
    with pytest.raises(TempcalError):
        write_sidecar(path, bad)
    assert not sidecar_path(path).exists()


def test_read_sidecar_without_one(tmp_path):
    z, y = make(n=20)
    path = save("npz", tmp_path, z, y)
    assert read_sidecar(path) == ({}, [])


def test_what_the_cli_checks_before_reading_stays_torch_and_numpy_free():
    """Options, model detection and validation are checked without slowing ``tempcal --help``."""
    code = ("import sys, tempcal.cli.options, tempcal.models.detect, tempcal.validation\n"
            "assert not {'torch', 'numpy'} & set(sys.modules), sorted(sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("kind", ["npz", "pt", "safetensors"])
def test_ignore_index_rows_are_left_out_like_cross_entropy(tmp_path, kind):
    z, y = make(n=50)
    y[[3, 17, 18]] = -100
    path = save(kind, tmp_path, z, y)
    keep = y != -100
    loaded = open_source(path)
    assert np.array_equal(logits_of(loaded.data).numpy(), z[keep])
    assert np.array_equal(loaded.data.labels.numpy(), y[keep])
    custom = y.copy()
    custom[keep & (y == 0)] = 7  # another ignore value; -100 rows are then ordinary (bad) labels
    path.unlink()
    path = save(kind, tmp_path, z, custom)
    loaded = open_source(path, ignore_index=7)
    assert np.array_equal(loaded.data.labels.numpy(), custom[custom != 7])
    assert int(loaded.data.num_samples) == int((custom != 7).sum())


def test_token_level_logits_without_labels(tmp_path):
    z = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)
    np.savez(tmp_path / "tokens.npz", logits=z)
    loaded = open_source(tmp_path / "tokens.npz", labels_optional=True)
    assert not loaded.has_labels
    assert np.array_equal(logits_of(loaded.data).numpy(), z.reshape(6, 4))
