"""Shared pieces of the reliability suite: an independent safetensors parser, a per-case deadline, and running
``tempcal`` in-process or as a real process. Folder snapshots, file hashes, the duplicate-key check, the error-line
check and the logits of :func:`valid_file` are the whole suite's, from tests/conftest.py.

The parser here is written from the safetensors format description, not from tempcal's code,
so that "the file is valid and holds T" is judged independently of what wrote it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import io
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

from conftest import no_duplicates, overconfident

KEY = "tempcal.temperature"
PYTHON = sys.executable
REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().with_name("writeback_driver.py")
#: The slow corpus runs when pytest is given ``-m slow`` (or everything, with no ``-m``).
HASH_BLOCK = 1 << 20


# -- an independent reading of the format -------------------------------------------------------------------


def parse(raw: bytes) -> tuple[dict, dict, bytes]:
    """(metadata, tensor entries, data section) of safetensors bytes; fails on anything malformed."""
    assert len(raw) >= 8, "shorter than the length field"
    (length,) = struct.unpack("<Q", raw[:8])
    assert 8 + length <= len(raw), "header runs past the end"
    header = json.loads(raw[8 : 8 + length].decode("utf-8"), object_pairs_hook=no_duplicates)
    metadata = header.pop("__metadata__", None) or {}
    data = raw[8 + length :]
    end = 0
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        begin, stop = entry["data_offsets"]
        assert begin == end, f"tensor {name!r} starts at {begin}, previous ended at {end}"
        end = stop
    assert end == len(data), f"tensors end at {end}, data section holds {len(data)}"
    return metadata, header, data


def parse_file(path: Path) -> tuple[dict, dict, str, int]:
    """Like :func:`parse` for a (possibly large) file: (metadata, entries, SHA-256 of the data section, its size)."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        assert len(prefix) == 8
        (length,) = struct.unpack("<Q", prefix)
        assert length < 1 << 24
        text = f.read(length)
        assert len(text) == length
        header = json.loads(text.decode("utf-8"), object_pairs_hook=no_duplicates)
        digest, size = hashlib.sha256(), 0
        while block := f.read(HASH_BLOCK):
            digest.update(block)
            size += len(block)
    metadata = header.pop("__metadata__", None) or {}
    return metadata, header, digest.hexdigest(), size


def assert_complete_update(new: bytes, old: bytes, temperature: float | None = None) -> float:
    """``new`` is ``old`` with T in its metadata: same tensors, same data bytes, same other metadata.

    Returns the T stored. Also read back by safetensors itself, tensor by tensor.
    """
    import torch
    from safetensors.torch import load

    old_meta, old_entries, old_data = parse(old)
    new_meta, new_entries, new_data = parse(new)
    # Fields other than these three are not part of the format (safetensors ignores them); tempcal may drop them.
    fields = ("dtype", "shape", "data_offsets")
    assert {k: [v[f] for f in fields] for k, v in new_entries.items()} == \
        {k: [v[f] for f in fields] for k, v in old_entries.items()}
    assert new_data == old_data
    assert KEY in new_meta
    written = (KEY, "tempcal.split")  # T, and the rows that fitted it
    assert {k: v for k, v in new_meta.items() if k not in written} == \
        {k: v for k, v in old_meta.items() if k not in written}
    stored = float(new_meta[KEY])
    if temperature is not None:
        assert stored == temperature
    assert new_meta[KEY] == repr(stored)
    old_tensors, new_tensors = load(old), load(new)
    assert old_tensors.keys() == new_tensors.keys()
    for name, tensor in old_tensors.items():
        other = new_tensors[name]
        assert tensor.dtype == other.dtype and tensor.shape == other.shape
        assert torch.equal(tensor.reshape(-1).view(torch.uint8), other.reshape(-1).view(torch.uint8)), name
    return stored


# -- folders ------------------------------------------------------------------------------------------------


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp"))


def clear(folder: Path) -> None:
    for p in folder.iterdir():
        if p.is_dir() and not p.is_symlink():
            clear(p)
            p.rmdir()
        else:
            p.unlink()


# -- running tempcal ----------------------------------------------------------------------------------------


class CaseTimeout(BaseException):
    """A fuzz case ran past its deadline (a BaseException, so ``main`` cannot turn it into an exit status)."""


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise :class:`CaseTimeout` after ``seconds``; a hard backstop kills the run (with stacks) at 4x that."""

    def expire(signum, frame):
        raise CaseTimeout(f"case ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(4 * seconds + 5, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


def run_inprocess(argv: list[str], seconds: float = 20.0) -> tuple[int, str, str, float]:
    """``tempcal.cli.main.main(argv)`` with its output captured and a deadline: (status, stdout, stderr, seconds)."""
    from tempcal.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with deadline(seconds), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue(), time.perf_counter() - start


@contextlib.contextmanager
def command_built_once():
    """``main`` builds the Typer command on every call (tens of ms); for thousands of cases, build it once.

    The command object is the same either way; only the rebuilding is skipped.
    """
    import typer.main

    original = typer.main.get_command
    built: dict[int, object] = {}

    def get_command(app):
        if id(app) not in built:
            built[id(app)] = original(app)
        return built[id(app)]

    typer.main.get_command = get_command
    try:
        yield
    finally:
        typer.main.get_command = original


def tempcal_command(*args: str) -> list[str]:
    return [PYTHON, "-m", "tempcal", *args]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TEMPCAL_DEBUG", None)
    env.update(extra)
    return env


def run_process(args: list[str], timeout: float = 120.0, **kwargs) -> subprocess.CompletedProcess:
    """A real process, so that "no traceback" is checked where users see it."""
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=child_env(),
                          **kwargs)


def valid_file(n: int = 24, c: int = 3, seed: int = 0, *, metadata: dict[str, str] | None = None,
               extra: dict | None = None) -> bytes:
    """A valid logits file written by safetensors itself: :func:`overconfident` logits and labels drawn from them."""
    from safetensors.torch import save

    logits, labels = overconfident(n, c, seed)
    return save({"logits": logits, "labels": labels, **(extra or {})}, metadata=metadata)
