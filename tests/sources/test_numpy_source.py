""".npz archives and .npy pairs as SOURCE (tempcal.sources.numpy): values, bad arrays, labels files, no unpickling."""

from __future__ import annotations

import io
import re
import shutil
import struct
import subprocess
import sys
import time
import tracemalloc
import zipfile
import zlib
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


# -- sizes the files declare, bounded before memory is given --------------------------------------------------------


def npy_bytes(array: np.ndarray) -> bytes:
    """``array`` as ``np.save`` writes it."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def doctored(npy: bytes, shape: tuple[int, ...]) -> bytes:
    """An .npy file whose header declares ``shape`` (the padding absorbs the longer text; the data is as written)."""
    (length,) = struct.unpack("<H", npy[8:10])
    header = npy[10:10 + length].decode("latin1")
    claimed = re.sub(r"'shape': \([^)]*\)", f"'shape': {shape!r}", header).rstrip() + " "
    new = claimed.ljust(length - 1) + "\n"
    assert len(new) == length and repr(shape) in new
    return npy[:10] + new.encode("latin1") + npy[10 + length:]


def deflated_zeros(prefix: bytes, zeros: int, block: int = 8_000_000) -> tuple[bytes, int]:
    """A raw deflate stream of ``prefix`` and ``zeros`` zero bytes, and its CRC-32: one compressed block of zeros,
    fully flushed so that it stands alone, repeated (deflating 4 GB itself would take a minute)."""
    assert zeros % block == 0
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    start = c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH)
    chunk = c.compress(bytes(block)) + c.flush(zlib.Z_FULL_FLUSH)
    end = c.flush()
    assert zlib.decompress(start + chunk * 2 + end, -15) == prefix + bytes(2 * block)
    crc, zero = zlib.crc32(prefix), bytes(block)
    for _ in range(zeros // block):
        crc = zlib.crc32(zero, crc)
    return start + chunk * (zeros // block) + end, crc


def write_zip(path: Path, members: list[tuple[str, bytes, int, int]]) -> Path:
    """A zip of deflated members ``(name, raw deflate stream, CRC-32, uncompressed size)``, written field by field."""
    out, central = bytearray(), bytearray()
    for name, data, crc, size in members:
        encoded, offset = name.encode(), len(out)
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 8, 0, 0x21, crc, len(data), size, len(encoded), 0)
        out += encoded + data
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 8, 0, 0x21, crc, len(data), size,
                               len(encoded), 0, 0, 0, 0, 0, offset) + encoded
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), len(out), 0)
    path.write_bytes(bytes(out + central + end))
    return path


def deflated(data: bytes) -> tuple[bytes, int, int]:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(), zlib.crc32(data), len(data)


#: Run by a small interpreter between the test and tempcal: Linux carries a process's peak RSS across fork and exec
#: into the child's ``ru_maxrss``, so a child forked straight from a large test process reports the test's size.
_MEASURE = """
import os, subprocess, sys
process = subprocess.Popen([sys.executable, "-m", "tempcal", *sys.argv[1:]], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
err = process.stderr.read()
_, status, usage = os.wait4(process.pid, 0)
sys.stderr.buffer.write(err)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024)
"""


def peak_rss_of(argv: list[str]) -> tuple[int, str, int]:
    """Exit status, standard error and peak resident memory (bytes) of ``python -m tempcal ARGV``, run alone."""
    done = subprocess.run([sys.executable, "-c", _MEASURE, *argv], capture_output=True, text=True, timeout=600)
    code, peak = (int(v) for v in done.stdout.split())
    return code, done.stderr, peak


def test_a_zip_bomb_member_exits_2_before_it_is_inflated(tmp_path):
    """A 4 MB .npz whose deflated logits.npy declares (and really inflates to) shape (1e8, 5) float64: 4 GB."""
    shape = (100_000_000, 5)
    header = doctored(npy_bytes(np.zeros((1, 5))), shape)[:-8 * 5]  # the header alone; 4e9 zero bytes follow it
    data, crc = deflated_zeros(header, 8 * shape[0] * shape[1])
    labels = deflated(npy_bytes(np.zeros(shape[0] // 10**6, np.int64)))
    bomb = write_zip(tmp_path / "bomb.npz", [("logits.npy", data, crc, len(header) + 4 * 10**9),
                                             ("labels.npy", *labels)])
    assert bomb.stat().st_size < 5 * 2**20
    with zipfile.ZipFile(bomb) as archive, archive.open("logits.npy") as f:  # a real archive, as numpy reads it
        assert archive.getinfo("logits.npy").file_size == len(header) + 4 * 10**9
        assert np.lib.format.read_magic(f) == (1, 0) and np.lib.format.read_array_header_1_0(f)[0] == shape
    started = time.monotonic()
    code, err, peak = peak_rss_of(["fit", str(bomb), "--no-write"])
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: {bomb}: member 'logits.npy' "), err
    assert "would inflate from" in err and "4000000128 bytes" in err, err
    assert peak < 1.2e9, peak  # an import of torch and numpy; inflating would take 4 GB
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("kind", ["npz", "npz-compressed", "npy"])
def test_a_header_declaring_more_than_the_file_holds_exits_2_at_once(tmp_path, cli, kind):
    """np.savez / np.save of a small array, then its header doctored (via zipfile) to declare shape (1e8, 5)."""
    z, y = numpy_logits(n=10)
    if kind == "npy":
        np.save(tmp_path / "logits.npy", z)
        (tmp_path / "logits.npy").write_bytes(doctored((tmp_path / "logits.npy").read_bytes(), (10**8, 5)))
        np.save(tmp_path / "labels.npy", y)
        path, where = tmp_path / "logits.npy", f"{tmp_path / 'logits.npy'}: the header declares"
    else:
        save = np.savez_compressed if kind == "npz-compressed" else np.savez
        save(tmp_path / "honest.npz", logits=z, labels=y)
        path, where = tmp_path / "liar.npz", f"{tmp_path / 'liar.npz'}: array 'logits' (member 'logits.npy')"
        with zipfile.ZipFile(tmp_path / "honest.npz") as src, \
                zipfile.ZipFile(path, "w", src.infolist()[0].compress_type) as out:
            for name in src.namelist():
                out.writestr(name, doctored(src.read(name), (10**8, 5)) if name == "logits.npy" else src.read(name))
    tracemalloc.start()
    try:
        code, _, err = cli(["fit", str(path), "--no-write"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 2 and err.count("\n") == 1 and f"error: {where}" in err, err
    assert "(100000000, 5) of float32 (2000000000 bytes)" in err and "bytes follow it" in err, err
    assert peak < 50e6, peak  # numpy's allocations are traced: nothing the size of the claim was given


def test_a_member_that_is_not_an_npy_array_exits_2_naming_it(tmp_path, cli):
    """An .npz whose labels.npy member holds other bytes (numpy hands them back as bytes, not an array)."""
    z, _ = numpy_logits(n=10)
    np.savez(tmp_path / "odd.npz", logits=z)
    with zipfile.ZipFile(tmp_path / "odd.npz", "a") as archive:
        archive.writestr("labels.npy", b"0,1,2,1,0,2,1,0,1,2\n")
    code, _, err = cli(["fit", str(tmp_path / "odd.npz"), "--no-write"])
    assert code == 2 and err.count("\n") == 1, err
    assert f"error: {tmp_path / 'odd.npz'}: array 'labels' (member 'labels.npy'): not an .npy array" in err, err


def test_compressed_archives_and_other_npy_versions_still_load(tmp_path):
    z, y = numpy_logits(n=50)
    np.savez_compressed(tmp_path / "c.npz", logits=np.asfortranarray(z), labels=y)
    loaded = open_source(tmp_path / "c.npz")
    assert np.array_equal(logits_of(loaded.data).numpy(), z) and np.array_equal(loaded.data.labels.numpy(), y)
    with open(tmp_path / "v2_logits.npy", "wb") as f:
        np.lib.format.write_array(f, z, version=(2, 0))
    np.save(tmp_path / "v2_labels.npy", y)
    assert np.array_equal(logits_of(open_source(tmp_path / "v2_logits.npy").data).numpy(), z)


def test_arrays_larger_than_the_memory_available_are_refused_before_reading(tmp_path, monkeypatch):
    z, y = numpy_logits(n=1000)
    np.savez(tmp_path / "big.npz", logits=z, labels=y)
    monkeypatch.setattr("tempcal.core.limits.available_bytes", lambda device: 10_000)
    with pytest.raises(TempcalError) as exc:
        open_source(tmp_path / "big.npz")
    assert one_line(exc) == (f"{tmp_path / 'big.npz'}: arrays 'logits' and 'labels' need {z.nbytes + y.nbytes} "
                             "bytes in memory, more than the 10000 available")
