"""What ``report --conformal-alpha`` adds to a sweep: time, peak memory and reads of the data.

Writes a seeded float32 logits file (default 200,000 rows x 1,000 classes, 0.8 GB) under ``benchmarks/data/``
(gitignored), then runs ``tempcal report FILE --sweep 0.5:5:COUNT --json - --device cpu`` in a fresh process,
streamed from disk (larger than the 256 MiB tempcal keeps in memory), without and with ``--conformal-alpha 0.1
--conformal-alpha 0.05``, alternately, ``--repeats`` times each. It prints each run's wall and CPU time after the
imports, peak resident memory (``VmHWM``), the reads the sets took (JSON ``conformal_reads``) and the ratios.
The sets cost one read of the calibration rows (their scores at every tau) and ride on the metrics pass, so the
expected added time is about half a read of the data at every tau: a quarter to a half of the report.

Run: ``python benchmarks/report_sets_cost.py [--rows 200000] [--classes 1000] [--taus 10] [--repeats 3]``; it times
the tempcal of the checkout it belongs to (to time another checkout, run that checkout's copy of the script).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _machine import machine_lines
from memory_scaling import warm_page_cache, write_logits_file

DATA = Path(__file__).resolve().parent / "data"
#: The checkout this script belongs to: its child processes import the tempcal there (``python -c`` puts the
#: current folder first on the path), whatever folder the script is run from.
ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import sys, time
from tempcal.cli.main import main
start, cpu = time.perf_counter(), time.process_time()
code = main(sys.argv[1:])
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
with open("/proc/self/status") as f:
    peak = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
print("maxrss_kb", peak, "main_s", seconds, "cpu_s", cpu, file=sys.stderr)
sys.exit(code)
"""


def run_report(path: Path, taus: int, sets: bool) -> dict:
    """``tempcal report`` in a fresh process: its time after the imports, peak RSS and the reads the sets took."""
    argv = ["report", str(path), "--json", "-", "--device", "cpu", "--sweep", f"0.5:5:{taus}"]
    if sets:
        argv += ["--conformal-alpha", "0.1", "--conformal-alpha", "0.05"]
    done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"tempcal report failed: {done.stderr[-800:]}")
    result = json.loads(done.stdout)
    fields = done.stderr.split("maxrss_kb")[-1].split()
    if all(r.get("conformal") for r in result["results"]) != sets:
        raise SystemExit(f"conformal sets {'missing' if sets else 'present'} in the JSON")
    return {"seconds": float(fields[2]), "cpu": float(fields[4]), "peak_mb": int(fields[0]) / 1024,
            "reads": result.get("conformal_reads", 0), "best": (result["sweep"] or {}).get("best_set_size_tau")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--taus", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    DATA.mkdir(exist_ok=True)
    path = DATA / f"decisions-{args.rows}x{args.classes}.safetensors"
    if not path.exists():
        partial = path.with_suffix(".partial")  # renamed once whole: an interrupted write is never reused
        write_logits_file(partial, args.rows, args.classes)
        partial.rename(path)
    for line in machine_lines():
        print(line)
    print(f"file: {path.name}, {path.stat().st_size / 1e9:.2f} GB float32, streamed; a sweep of {args.taus} taus")
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for k in range(args.repeats):
        for sets in (False, True) if k % 2 == 0 else (True, False):
            warm_page_cache(path)
            load = os.getloadavg()[0]
            run = run_report(path, args.taus, sets)
            runs[sets].append(run)
            print(f"  run {k + 1}, sets {'on ' if sets else 'off'}: {run['seconds']:.1f} s wall, {run['cpu']:.1f} s "
                  f"CPU, peak {run['peak_mb']:.0f} MB, {run['reads']} read(s) for the sets (load {load:.1f} before)",
                  flush=True)
    best = {s: min(r["seconds"] for r in runs[s]) for s in runs}
    median = {s: statistics.median(r["seconds"] for r in runs[s]) for s in runs}
    peak = {s: max(r["peak_mb"] for r in runs[s]) for s in runs}
    print(f"without sets: best {best[False]:.1f} s, median {median[False]:.1f} s; with: best {best[True]:.1f} s, "
          f"median {median[True]:.1f} s: {best[True] / best[False]:.2f}x best against best, "
          f"{median[True] / median[False]:.2f}x median against median")
    print(f"peak RSS {peak[False]:.0f} MB without, {peak[True]:.0f} MB with: "
          f"{(peak[True] - peak[False]) * 2**20 / args.rows:+.1f} bytes per row; "
          f"reads for the sets: {runs[True][0]['reads']}")
    print(f"smallest sets over the sweep: {runs[True][0]['best']}")


if __name__ == "__main__":
    main()
