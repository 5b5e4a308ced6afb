"""A write-back in its own process that announces each step on standard output and can stop at one of them.

Used by the reliability tests to SIGKILL a write-back at a known moment. Torch-free, so it starts fast.

    python writeback_driver.py SOURCE T [--output PATH] [--pause STEP] [--barrier DIR COUNT]

Steps: ``mkstemp``, ``copy:F`` (F of the data copied, 0 < F < 1), ``fsync``, ``before-replace``,
``after-replace``, ``done``. With ``--pause STEP`` the process prints ``paused STEP`` and sleeps
there. With ``--barrier`` it reads SOURCE's header, then waits until COUNT processes are ready
before writing (so that all of them read the same version). A refusal prints one ``error:``
line and exits 2, as the command line does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import tempcal.io.safetensors_header as writeback  # write_temperature and its copy block
from tempcal.errors import TempcalError
from tempcal.io.safetensors_header import read_header


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("source")
    parser.add_argument("temperature", type=float)
    parser.add_argument("--output")
    parser.add_argument("--pause")
    parser.add_argument("--barrier", nargs=2)
    args = parser.parse_args()
    instrument(args.pause)
    step("ready")
    try:
        expected = read_header(args.source)
        if args.barrier:
            wait_for_others(Path(args.barrier[0]), int(args.barrier[1]))
        writeback.write_temperature(args.source, args.temperature, args.output, expected=expected)
    except TempcalError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    step("done")
    return 0


def step(name: str, pause: str | None = None) -> None:
    print(name, flush=True)
    if pause is not None and name == pause:
        print(f"paused {name}", flush=True)
        time.sleep(3600)


def instrument(pause: str | None) -> None:
    """Wrap the system calls the write-back makes so that each announces itself (and may stop)."""
    real_mkstemp, real_fsync, real_replace = tempfile.mkstemp, os.fsync, os.replace
    replaced = []
    fraction = float(pause.split(":")[1]) if pause and pause.startswith("copy:") else None

    def mkstemp(*args, **kwargs):
        result = real_mkstemp(*args, **kwargs)
        step("mkstemp", pause)
        return result

    def copyfileobj(src, dst, length=0):
        total = os.fstat(src.fileno()).st_size - src.tell()
        copied, announced = 0, False
        while block := src.read(length or writeback.COPY_BLOCK):
            dst.write(block)
            copied += len(block)
            if fraction is not None and not announced and copied >= fraction * total and copied < total:
                dst.flush()
                announced = True
                step(pause, pause)

    def fsync(fd):
        if not replaced:
            step("fsync", pause)
        return real_fsync(fd)

    def replace(a, b):
        step("before-replace", pause)
        real_replace(a, b)
        replaced.append(True)
        step("after-replace", pause)

    tempfile.mkstemp, shutil.copyfileobj, os.fsync, os.replace = mkstemp, copyfileobj, fsync, replace


def wait_for_others(folder: Path, count: int) -> None:
    (folder / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + 60
    while len(list(folder.glob("ready-*"))) < count:
        if time.monotonic() > deadline:
            raise SystemExit("barrier: the other processes never came")
        time.sleep(0.001)


if __name__ == "__main__":
    sys.exit(main())
