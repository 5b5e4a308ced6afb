""".npz archives and .npy pairs as SOURCE (tempcal.sources.numpy): values, bad arrays, labels files, no unpickling."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import MARKER, Evil, logits_of, numpy_logits, one_line

from tempcal.errors import DataError, TempcalError
from tempcal.sources.numpy import npy_labels_path
from tempcal.sources.registry import open_source


def test_big_endian_and_unsigned_arrays_load_with_their_values(tmp_path):
    z, y = numpy_logits(n=30)
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


def test_swapped_npz_and_npy_suffixes_say_what_the_file_is(tmp_path):
    z, y = numpy_logits(n=10)
    np.save(tmp_path / "single.npy", z)
    shutil.copy(tmp_path / "single.npy", tmp_path / "single.npz")
    with pytest.raises(TempcalError, match=r"single \.npy array"):
        open_source(tmp_path / "single.npz")
    np.savez(tmp_path / "archive.npz", logits=z, labels=y)
    shutil.copy(tmp_path / "archive.npz", tmp_path / "archive_logits.npy")
    with pytest.raises(TempcalError, match=r"is an \.npz archive"):
        open_source(tmp_path / "archive_logits.npy")


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


# -- .npy pairs -------------------------------------------------------------------------------------------------


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
    z, y = numpy_logits(n=20)
    np.save(tmp_path / "scores.npy", z)
    (tmp_path / "sub").mkdir()
    np.save(tmp_path / "sub" / "targets.npy", y)
    loaded = open_source(tmp_path / "scores.npy", labels_key=str(tmp_path / "sub" / "targets.npy"))
    assert np.array_equal(loaded.data.labels.numpy(), y)


def test_npy_without_a_derivable_labels_name(tmp_path):
    np.save(tmp_path / "scores.npy", numpy_logits(n=5)[0])
    with pytest.raises(TempcalError) as exc:
        open_source(tmp_path / "scores.npy")
    assert "--labels-key PATH.npy" in one_line(exc)


def test_npy_missing_labels_file_lists_the_npy_files_there(tmp_path):
    z, y = numpy_logits(n=5)
    np.save(tmp_path / "val_logits.npy", z)
    np.save(tmp_path / "val_targets.npy", y)
    with pytest.raises(TempcalError) as exc:
        open_source(tmp_path / "val_logits.npy")
    message = one_line(exc)
    assert "val_labels.npy" in message and "val_targets.npy" in message and "--labels-key" in message
    assert np.array_equal(open_source(tmp_path / "val_logits.npy", labels_key="targets").data.labels.numpy(), y)


def test_npy_row_mismatch_names_both_files(tmp_path):
    z, y = numpy_logits(n=5)
    np.save(tmp_path / "logits.npy", z)
    np.save(tmp_path / "labels.npy", y[:4])
    with pytest.raises(DataError) as exc:
        open_source(tmp_path / "logits.npy")
    message = one_line(exc)
    assert "'logits.npy' has 5 rows" in message and "'labels.npy' has 4" in message
