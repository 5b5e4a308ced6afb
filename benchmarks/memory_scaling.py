"""Peak memory and seconds per GB of ``tempcal fit`` on float32 logits files of growing size.

Writes seeded logits files (not committed; default sizes 0.5, 1, 2 and 4 GB, 32,000 classes
like a language model's vocabulary) into a scratch folder without ever holding a whole file
in memory, then runs ``tempcal fit FILE --no-write --json -`` on each in a fresh process and
reports the child's peak resident memory (``VmHWM``, file-backed pages included), the wall
time, seconds per GB (also net: the child's time after its imports, less that on a tiny
file), and passes, medians of ``--repeats`` runs. Each file is read once before its runs, so
every size starts from the page cache. Targets: peak RSS under 1 GB at every size, seconds per GB constant within 25%.

Run: ``python benchmarks/memory_scaling.py [--sizes-gb 0.5,1,2,4] [--classes 32000] [--keep DIR]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

BLOCK_ROWS = 2048


def write_logits_file(path: Path, rows: int, classes: int, seed: int = 0) -> None:
    """A safetensors file with float32 ``logits`` [rows, classes] and int64 ``labels``, written block by block."""
    logits_bytes, labels_bytes = rows * classes * 4, rows * 8
    header = {"logits": {"dtype": "F32", "shape": [rows, classes], "data_offsets": [0, logits_bytes]},
              "labels": {"dtype": "I64", "shape": [rows], "data_offsets": [logits_bytes, logits_bytes + labels_bytes]}}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    g = torch.Generator().manual_seed(seed)
    labels = []
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for start in range(0, rows, BLOCK_ROWS):
            n = min(BLOCK_ROWS, rows - start)
            z = torch.randn(n, classes, generator=g) * 2
            labels.append(torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0])
            f.write((z * 2.5).numpy().tobytes())
        f.write(torch.cat(labels).numpy().tobytes())


# VmHWM is this process's own high-water mark since exec; getrusage's ru_maxrss would also count
# the parent's resident size when it forked (Linux carries it across exec), and the parent holds
# large blocks while it writes the files.
# The child also times ``main`` alone (torch and tempcal already imported): the work that should
# grow with the file, without the start-up that does not.
CHILD = """
import sys, time
import torch
from tempcal.cli.main import main
start = time.perf_counter()
code = main(sys.argv[1:])
seconds = time.perf_counter() - start
with open("/proc/self/status") as f:
    peak = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
print("maxrss_kb", peak, "main_s", seconds, file=sys.stderr)
sys.exit(code)
"""


def warm_page_cache(path: Path, block: int = 64 << 20) -> None:
    """Read ``path`` once, so every size is timed from the page cache (as far as memory holds it)."""
    buffer = bytearray(block)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buffer):
            pass


def run_fit(path: Path) -> dict:
    """``tempcal fit`` in a fresh process that reports its own peak RSS on exit."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, "fit", str(path), "--no-write", "--json", "-",
                           "--device", "cpu"], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"tempcal fit failed on {path}: {done.stderr[-500:]}")
    result = json.loads(done.stdout)
    fields = done.stderr.split("maxrss_kb")[-1].split()
    peak_kb, main_s = int(fields[0]), float(fields[2])
    return {"seconds": seconds, "main_s": main_s, "passes": result["passes"], "temperature": result["temperature"],
            "peak_mb": peak_kb / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-gb", default="0.5,1,2,4")
    parser.add_argument("--classes", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=3, help="runs per size (medians; default 3)")
    parser.add_argument("--keep", help="folder for the generated files (default: a temporary one, removed)")
    args = parser.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tempcal-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.classes} classes, files in {folder}")
    tiny = folder / "logits-tiny.safetensors"
    write_logits_file(tiny, 16, args.classes)
    tiny_runs = [run_fit(tiny) for _ in range(3)]
    start_up = min(r["seconds"] for r in tiny_runs)
    fixed = min(r["main_s"] for r in tiny_runs)
    print(f"start-up (the same command on a {tiny.stat().st_size / 1e6:.1f} MB file, best of 3): {start_up:.1f} s, "
          f"{fixed:.2f} s of it after the imports")
    print(f"{'size GB':>8} {'rows':>9} {'peak RSS MB':>12} {'seconds':>8} {'s/GB':>7} {'s/GB net':>9} {'passes':>6} "
          f"{'T':>9}")
    rates, net_rates = [], []
    try:
        for size in (float(s) for s in args.sizes_gb.split(",")):
            rows = int(size * 1e9 / (args.classes * 4))
            path = folder / f"logits-{size:g}GB.safetensors"
            if not path.exists():
                write_logits_file(path, rows, args.classes)
            gigabytes = path.stat().st_size / 1e9
            warm_page_cache(path)
            runs = [run_fit(path) for _ in range(args.repeats)]
            run = {key: statistics.median(r[key] for r in runs) for key in ("seconds", "main_s", "passes",
                                                                            "temperature")}
            peak_mb = max(r["peak_mb"] for r in runs)
            rates.append(run["seconds"] / gigabytes)
            # Net: the child's own time after its imports, less that of the tiny file (option parsing and such).
            net_rates.append((run["main_s"] - fixed) / gigabytes)
            print(f"{gigabytes:8.2f} {rows:9d} {peak_mb:12.0f} {run['seconds']:8.1f} {rates[-1]:7.2f} "
                  f"{net_rates[-1]:9.2f} {run['passes']:6d} {run['temperature']:9.5f}")
    finally:
        if not args.keep:
            for path in folder.glob("*.safetensors"):
                path.unlink()
            folder.rmdir()
    if len(rates) > 1:
        print(f"seconds per GB: max / min = {max(rates) / min(rates):.2f}; after start-up "
              f"{max(net_rates) / min(net_rates):.2f} (target <= 1.25)")


if __name__ == "__main__":
    main()
