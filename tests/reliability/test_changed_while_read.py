"""A file changed while tempcal works on it is detected and reported, never silently overwritten.

tempcal records the file's device, inode, size and mtime when it reads the header, and checks
them again before reading tensors, before copying, and (under the write-back lock) right
before the rename. Any difference: exit 2, one line saying what changed, nothing written.
A change that leaves all four alone (a chmod, a touch to the same time) is not a change of
content and is not refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import assert_one_error_line
from reliability_support import (
    REPO,
    assert_complete_update,
    child_env,
    run_inprocess,
    tempcal_command,
    temporaries,
    valid_file,
)

import tempcal.io.safetensors_header
from tempcal.errors import TempcalError
from tempcal.io.safetensors_header import read_header, read_tensor


def other_version() -> bytes:
    """Another valid file of exactly the same size (other logits): only the content differs."""
    return valid_file(200, 4, seed=99, metadata={"model": "m"})


def _append(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(b"\0" * 8)


def _rewrite_in_place(path: Path) -> None:
    mtime = path.stat().st_mtime_ns
    with open(path, "r+b") as f:
        f.write(other_version())
    os.utime(path, ns=(mtime + 1_000_000_000, mtime + 1_000_000_000))


def _replace_keeping_size_and_mtime(path: Path) -> None:
    st = path.stat()
    fresh = path.with_name("fresh.tmp-file")
    fresh.write_bytes(other_version())
    os.utime(fresh, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(fresh, path)


def _truncate(path: Path) -> None:
    os.truncate(path, 100)


MUTATIONS = {
    "appended": (_append, "its size went from"),
    "rewritten in place": (_rewrite_in_place, "modified"),
    "replaced, same size and mtime": (_replace_keeping_size_and_mtime, "replaced by another file"),
    "truncated": (_truncate, "its size went from"),
}


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "logits.safetensors"
    path.write_bytes(valid_file(200, 4, metadata={"model": "m"}))
    assert len(path.read_bytes()) == len(other_version())
    return path


def change_before_write_back(monkeypatch, source: Path, mutate) -> None:
    """Change ``source`` after the fit read it, just before its write-back starts."""
    real = tempcal.io.safetensors_header.write_temperature

    def write_temperature(*args, **kwargs):
        mutate(source)
        return real(*args, **kwargs)

    monkeypatch.setattr(tempcal.io.safetensors_header, "write_temperature", write_temperature)


@pytest.mark.parametrize("output", [False, True], ids=["in-place", "--output"])
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_change_after_the_fit_is_refused(tmp_path, source, monkeypatch, mutation, output):
    mutate, detail = MUTATIONS[mutation]
    change_before_write_back(monkeypatch, source, mutate)
    target = tmp_path / "out.safetensors"
    argv = ["fit", str(source), "--json", str(tmp_path / "out.json"), "--quiet"]
    code, _, err, _ = run_inprocess(argv + (["--output", str(target)] if output else []))
    assert code == 2, err
    assert_one_error_line(err, str(source), "changed since tempcal read it", detail, "nothing written",
                          warnings=True)
    expected = valid_file(200, 4, metadata={"model": "m"})
    mutate_copy = tmp_path / "expected"
    mutate_copy.write_bytes(expected)
    mutate(mutate_copy)
    assert source.read_bytes() == mutate_copy.read_bytes()  # what the other writer left, untouched
    mutate_copy.unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logits.safetensors"]  # no output, JSON or temp


def test_change_during_the_fit_is_refused(tmp_path, source, monkeypatch):
    """The change lands while T is being fitted (between the reads and the write-back)."""
    import tempcal.workflows.fit

    real = tempcal.workflows.fit.fit_temperature

    def fit_temperature(*args, **kwargs):
        _rewrite_in_place(source)
        return real(*args, **kwargs)

    monkeypatch.setattr(tempcal.workflows.fit, "fit_temperature", fit_temperature)
    code, _, err, _ = run_inprocess(["fit", str(source), "--quiet"])
    assert code == 2, err
    assert_one_error_line(err, str(source), "changed since tempcal read it", warnings=True)
    assert source.read_bytes() == other_version()


@pytest.mark.parametrize("harmless", ["chmod", "touch to the same time", "nothing"])
def test_metadata_only_changes_are_not_refused(tmp_path, source, monkeypatch, harmless):
    def mutate(path: Path) -> None:
        st = path.stat()
        if harmless == "chmod":
            os.chmod(path, 0o640)
        elif harmless == "touch to the same time":
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    original = source.read_bytes()
    change_before_write_back(monkeypatch, source, mutate)
    code, out, err, _ = run_inprocess(["fit", str(source), "--json", "-"])
    assert code == 0, err
    assert_complete_update(source.read_bytes(), original, json.loads(out)["temperature"])


def test_change_between_header_and_tensor_read(source):
    header = read_header(source)
    _replace_keeping_size_and_mtime(source)
    with pytest.raises(TempcalError, match="changed since tempcal read its header") as info:
        read_tensor(header, "logits", option="--logits-key")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("mutation", ["appended", "rewritten in place"])
def test_change_during_the_copy_is_refused(tmp_path, source, monkeypatch, mutation):
    mutate, _ = MUTATIONS[mutation]
    real_copy = tempcal.io.safetensors_header.shutil.copyfileobj

    def copyfileobj(src, dst, length=0):
        real_copy(src, dst, length)
        mutate(source)

    read_header(source)  # the version this process read
    monkeypatch.setattr(tempcal.io.safetensors_header.shutil, "copyfileobj", copyfileobj)
    with pytest.raises(TempcalError, match="changed") as info:
        tempcal.io.safetensors_header.write_temperature(source, 2.5)
    assert "nothing written" in str(info.value)
    assert temporaries(tmp_path) == []
    assert b"tempcal.temperature" not in source.read_bytes()


def test_explicit_expected_header(tmp_path, source):
    """A library caller can pin the version it fitted on; a later version is refused, re-reading accepts it."""
    fitted_on = read_header(source)
    _rewrite_in_place(source)
    read_header(source)  # this process reads the new version, but the caller fitted on the old one
    with pytest.raises(TempcalError, match="changed since tempcal read it"):
        tempcal.io.safetensors_header.write_temperature(source, 2.5, expected=fitted_on)
    tempcal.io.safetensors_header.write_temperature(source, 2.5, expected=read_header(source))
    assert_complete_update(source.read_bytes(), other_version(), 2.5)


def test_write_back_waits_for_the_lock_then_checks(tmp_path, source):
    """Another tempcal in its check-and-rename holds the lock: wait, then go on (the file did not change)."""
    read_header(source)
    fd = os.open(source, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    threading.Timer(0.3, lambda: (fcntl.flock(fd, fcntl.LOCK_UN), os.close(fd))).start()
    start = time.monotonic()
    tempcal.io.safetensors_header.write_temperature(source, 2.5)
    assert time.monotonic() - start >= 0.25
    assert b"2.5" in source.read_bytes()


def test_a_lock_held_too_long_is_an_error(tmp_path, source, monkeypatch):
    monkeypatch.setattr(tempcal.io.safetensors_header, "LOCK_WAIT_SECONDS", 0.2)
    original = source.read_bytes()
    read_header(source)
    fd = os.open(source, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(TempcalError, match="lock") as info:
            tempcal.io.safetensors_header.write_temperature(source, 2.5)
    finally:
        os.close(fd)
    assert "nothing written" in str(info.value)
    assert source.read_bytes() == original
    assert temporaries(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_real_fit_with_a_change_at_a_random_moment(tmp_path, seed):
    """A real process and a real concurrent writer: exit 0 with a complete update of the version it read,
    or exit 2 with the other writer's file untouched."""
    source = tmp_path / "logits.safetensors"
    original = valid_file(200_000, 10, seed=seed)
    source.write_bytes(original)
    changed = valid_file(200_000, 10, seed=seed + 100)
    proc = subprocess.Popen(tempcal_command("fit", str(source), "--quiet", "--json", str(tmp_path / "out.json")),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, env=child_env())
    time.sleep(random.Random(seed).uniform(0.5, 6.0))
    fresh = tmp_path / "fresh"
    fresh.write_bytes(changed)
    os.replace(fresh, source)
    try:
        _, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        raise
    assert "Traceback" not in err
    if proc.returncode == 0:
        temperature = json.loads((tmp_path / "out.json").read_text())["temperature"]
        if source.read_bytes() != changed:  # else it finished first and the other writer replaced its result
            assert_complete_update(source.read_bytes(), changed, temperature)  # it read (and wrote) the new version
    else:
        assert proc.returncode == 2, err
        assert_one_error_line(err, str(source), warnings=True)
        assert source.read_bytes() == changed
