"""An interrupted write-back never leaves a mix: the file is the old bytes or the complete new file.

A large file (64 MB of a non-repeating pattern, so a misplaced block could not go unnoticed)
is written back in a separate process that is SIGKILLed at each step: right after the
temporary file is created, at 10%, 50% and 90% of the copy, before the fsync, just before
and just after the rename. A real ``tempcal fit`` is also killed mid-copy by polling the
temporary file's size. Failures Python sees (a write refused by the kernel past a file-size
limit, an exception) leave no temporary file; one left by a SIGKILL is removed by the next
write-back once it is stale and unlocked, never while its writer is alive.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import assert_one_error_line, sha256
from reliability_support import (
    DRIVER,
    KEY,
    PYTHON,
    REPO,
    child_env,
    parse_file,
    tempcal_command,
    temporaries,
)

FAST_MB, FULL_MB = 64, 192
STEPS = ["mkstemp", "copy:0.1", "copy:0.5", "copy:0.9", "fsync", "before-replace", "after-replace"]


def big_file(path: Path, megabytes: int) -> None:
    """Logits, labels and a large tensor whose every 4-byte word differs (written by safetensors)."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(400, 5, generator=g)
    labels = torch.multinomial(torch.softmax(logits / 3, 1), 1, generator=g)[:, 0]
    blob = torch.arange(megabytes << 18, dtype=torch.int32)
    save_file({"logits": logits, "labels": labels, "blob": blob}, str(path), metadata={"origin": "test"})


class Version:
    """What a file held: its bytes' hash, and its parsed header and data-section hash."""

    def __init__(self, path: Path) -> None:
        self.sha = sha256(path)
        self.metadata, self.entries, self.data_sha, self.data_size = parse_file(path)

    def classify(self, path: Path, temperature: float) -> str:
        """'old' when ``path`` holds these bytes, 'new' when it is this file with T written; else fail."""
        if sha256(path) == self.sha:
            return "old"
        metadata, entries, data_sha, data_size = parse_file(path)  # fails on a torn header
        assert entries == self.entries, "tensor entries differ"
        assert (data_sha, data_size) == (self.data_sha, self.data_size), "data section differs: a mix"
        assert metadata == {**self.metadata, KEY: repr(temperature)}, metadata
        return "new"


def start_driver(source: Path, temperature: float, pause: str | None = None, **more) -> subprocess.Popen:
    args = [PYTHON, str(DRIVER), str(source), repr(temperature)]
    if pause:
        args += ["--pause", pause]
    for key, value in more.items():
        args += [f"--{key}", *([value] if isinstance(value, str) else value)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=child_env())


def wait_for_line(proc: subprocess.Popen, wanted: str, timeout: float = 60.0) -> list[str]:
    """Read the driver's steps until ``wanted``; returns the steps seen."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"driver ended before {wanted!r}: {seen}, {proc.stderr.read()}")
        seen.append(line.strip())
        if seen[-1] == wanted:
            return seen
    raise AssertionError(f"no {wanted!r} within {timeout} s: {seen}")


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    proc.stdout.close()
    proc.stderr.close()


@pytest.mark.parametrize("megabytes", [FAST_MB, pytest.param(FULL_MB, marks=pytest.mark.slow)])
def test_sigkill_at_every_step_leaves_old_or_new(tmp_path, megabytes):
    source = tmp_path / "big.safetensors"
    big_file(source, megabytes)
    seen = {}
    for k, pause in enumerate(STEPS):
        before = Version(source)
        temperature = 1.5 + k  # differs from any T the file already holds
        proc = start_driver(source, temperature, pause)
        wait_for_line(proc, f"paused {pause}")
        leftover = temporaries(tmp_path)
        if pause.startswith("copy:"):  # really mid-copy: the temporary file is partly written
            size = (tmp_path / leftover[0]).stat().st_size
            assert 0 < size < source.stat().st_size, (pause, size)
        kill(proc)
        seen[pause] = before.classify(source, temperature)
        assert seen[pause] == ("new" if pause == "after-replace" else "old"), seen
        # the killed writer's temporary file is hidden, named for the file, and (once stale) swept
        for name in temporaries(tmp_path):
            assert name.startswith(".big.safetensors.tempcal-"), name
            old = time.time() - 3600
            os.utime(tmp_path / name, (old, old))
    # the next write-back removes every stale temporary file and completes
    before = Version(source)
    proc = start_driver(source, 9.25)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert before.classify(source, 9.25) == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.safetensors"]


def test_sigkill_of_real_fit_mid_copy(tmp_path):
    """``tempcal fit`` as users run it, killed when its temporary file is half written (polled)."""
    source = tmp_path / "big.safetensors"
    big_file(source, FAST_MB)
    before = Version(source)
    proc = subprocess.Popen(tempcal_command("fit", str(source), "--quiet", "--val-fraction", "1.0",
                                            "--json", str(tmp_path / "out.json")),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO, env=child_env())
    total = source.stat().st_size
    killed_at = None
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        leftover = temporaries(tmp_path)
        if leftover:
            try:
                size = (tmp_path / leftover[0]).stat().st_size
            except FileNotFoundError:
                size = 0
            if size >= total // 2:
                proc.send_signal(signal.SIGKILL)
                killed_at = size
                break
        time.sleep(0.0005)
    proc.wait(timeout=60)
    proc.stderr.close()
    if killed_at is None:  # the copy outran the polling: the run must then have completed
        assert proc.returncode == 0
        temperature = json.loads((tmp_path / "out.json").read_text())["temperature"]
        assert before.classify(source, temperature) == "new"
        pytest.skip("the write-back finished before the poll saw it half done")
    assert proc.returncode == -signal.SIGKILL
    assert sha256(source) == before.sha  # killed before the rename: the old bytes
    assert not (tmp_path / "out.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("trigger", ["appears", "complete", "random"])
def test_sigkill_of_real_fit_other_moments(tmp_path, trigger):
    source = tmp_path / "big.safetensors"
    big_file(source, FULL_MB)
    before = Version(source)
    proc = subprocess.Popen(tempcal_command("fit", str(source), "--quiet", "--val-fraction", "1.0",
                                            "--json", str(tmp_path / "out.json")),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO, env=child_env())
    total = source.stat().st_size
    deadline = time.monotonic() + 300
    start = time.monotonic()
    while proc.poll() is None and time.monotonic() < deadline:
        leftover = temporaries(tmp_path)
        size = 0
        if leftover:
            with contextlib.suppress(FileNotFoundError):
                size = (tmp_path / leftover[0]).stat().st_size
        if (trigger == "appears" and leftover) or (trigger == "complete" and size >= total) or \
                (trigger == "random" and time.monotonic() - start > 2.5):
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.0005)
    proc.wait(timeout=60)
    if proc.returncode == 0:
        temperature = json.loads((tmp_path / "out.json").read_text())["temperature"]
        assert before.classify(source, temperature) == "new"
    else:
        assert proc.returncode == -signal.SIGKILL
        metadata = parse_file(source)[0]
        assert before.classify(source, float(metadata.get(KEY, "nan"))) in ("old", "new")


# -- failures Python sees leave nothing behind ---------------------------------------------------------------


def _limit_file_size(limit: int):
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG

    return preexec


@pytest.mark.parametrize("where", ["in the header", "mid-copy", "at the last byte"])
def test_write_refused_by_the_kernel_leaves_no_trace(tmp_path, where):
    """A real failing write(2) (RLIMIT_FSIZE, as a full disk would): exit 2, one line, file and folder unchanged."""
    source = tmp_path / "big.safetensors"
    big_file(source, 8)
    total = source.stat().st_size
    limit = {"in the header": 16, "mid-copy": total // 2, "at the last byte": total - 1}[where]
    before = sha256(source)
    result = subprocess.run([PYTHON, str(DRIVER), str(source), "2.5"], capture_output=True, text=True,
                            cwd=REPO, env=child_env(), timeout=120, preexec_fn=_limit_file_size(limit))
    assert result.returncode == 2, result.stderr
    assert_one_error_line(result.stderr, str(source), "File too large", "unchanged")
    assert sha256(source) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.safetensors"]


@pytest.mark.slow
def test_real_fit_against_a_full_disk(tmp_path):
    source = tmp_path / "big.safetensors"
    big_file(source, 8)
    before = sha256(source)
    result = subprocess.run(tempcal_command("fit", str(source), "--json", str(tmp_path / "out.json")),
                            capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=300,
                            preexec_fn=_limit_file_size(source.stat().st_size // 2))
    assert result.returncode == 2, result.stderr
    assert_one_error_line(result.stderr, str(source), "File too large")
    assert sha256(source) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.safetensors"]


def test_live_writer_keeps_its_temporary_file(tmp_path):
    """The sweep never takes a temporary file a live write-back holds, however old it looks."""
    import tempcal.io.safetensors_header

    source = tmp_path / "big.safetensors"
    big_file(source, 8)
    proc = start_driver(source, 3.5, "copy:0.5")
    try:
        wait_for_line(proc, "paused copy:0.5")
        (live,) = temporaries(tmp_path)
        old = time.time() - 3600
        os.utime(tmp_path / live, (old, old))
        stale = tmp_path / ".big.safetensors.tempcal-deadbeef.tmp"  # one a killed writer left
        stale.write_bytes(b"partial")
        os.utime(stale, (old, old))
        fresh = tmp_path / ".big.safetensors.tempcal-cafebabe.tmp"  # just created by a writer not yet locked
        fresh.write_bytes(b"")
        tempcal.io.safetensors_header.write_temperature(source, 4.5)
        names = temporaries(tmp_path)
        assert live in names and fresh.name in names and stale.name not in names, names
    finally:
        kill(proc)
