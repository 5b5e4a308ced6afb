"""What the decision figures (AURC, E-AURC, AUGRC, smooth ECE, the risk-coverage curve) add to ``tempcal report``.

Writes a seeded float32 logits file (default 1,000,000 rows x 1,000 classes, 4 GB) under ``benchmarks/data/``
(gitignored; kept for later runs), block by block, then runs ``tempcal report FILE --json - --device cpu`` in a
fresh process, streamed from disk (the file is larger than the 256 MiB tempcal keeps in memory, so each pass
reads it again a chunk at a time), with the decision figures and without them (``TEMPCAL_SKIP_DECISIONS=1``,
the switch that exists for this measurement), alternately, ``--repeats`` times each. It prints the child's
wall and CPU time after its imports (medians), its peak resident memory (``VmHWM``, max) and the differences:
seconds as a share of the run without the figures (target: at most 20%; on a shared machine the CPU time is the
steadier figure), bytes per row (target: at most 16). Also the decision figures computed alone on the same
number of confidences (``decision_figures``, in this process).

Run: ``python benchmarks/decisions_cost.py [--rows 1000000] [--classes 1000] [--tau 1 ...] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _machine import machine_lines
from memory_scaling import warm_page_cache, write_logits_file

DATA = Path(__file__).resolve().parent / "data"

# The child also times the decision figures' own work inside the run (the rows' confidences ranked, the figures
# summed), the figure that contention on a shared machine disturbs least.
CHILD = """
import sys, time
import tempcal.metrics.decisions as decisions
from tempcal.cli.main import main
spent = [0.0]
plain = decisions.decision_figures
def timed(*args, **kwargs):
    start = time.perf_counter()
    try:
        return plain(*args, **kwargs)
    finally:
        spent[0] += time.perf_counter() - start
decisions.decision_figures = timed
start, cpu = time.perf_counter(), time.process_time()
code = main(sys.argv[1:])
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
with open("/proc/self/status") as f:
    peak = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
print("maxrss_kb", peak, "main_s", seconds, "cpu_s", cpu, "figures_s", spent[0], file=sys.stderr)
sys.exit(code)
"""


def run_report(path: Path, taus: list[str], decisions: bool) -> dict:
    """``tempcal report`` in a fresh process: its time after the imports, peak RSS and whether the figures came."""
    env = {**os.environ}
    env.pop("TEMPCAL_SKIP_DECISIONS", None)
    if not decisions:
        env["TEMPCAL_SKIP_DECISIONS"] = "1"
    argv = ["report", str(path), "--json", "-", "--device", "cpu", *(a for t in taus for a in ("--tau", t))]
    done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"tempcal report failed: {done.stderr[-800:]}")
    rows = json.loads(done.stdout)["results"]
    fields = done.stderr.split("maxrss_kb")[-1].split()
    computed = all(r["aurc"] is not None for r in rows)  # null without the figures
    if computed != decisions:
        raise SystemExit(f"decision figures {'missing' if decisions else 'present'} in the JSON")
    return {"seconds": float(fields[2]), "cpu": float(fields[4]), "figures": float(fields[6]),
            "peak_mb": int(fields[0]) / 1024,
            "aurc": rows[0]["aurc"], "smece": rows[0]["smece"]}


def compute_alone(rows: int, repeats: int = 3) -> float:
    """Seconds of ``decision_figures`` on ``rows`` float64 confidences (ties included), median of ``repeats``."""
    from tempcal.metrics.decisions import decision_figures

    rng = np.random.default_rng(0)
    times = []
    for _ in range(repeats):
        confidence = np.round(rng.random(rows), 6)
        correct = rng.random(rows) < confidence
        start = time.perf_counter()
        decision_figures(confidence, correct, overwrite=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--tau", action="append", help="temperatures reported (default: the command's own, 1)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    taus = args.tau or []
    DATA.mkdir(exist_ok=True)
    path = DATA / f"decisions-{args.rows}x{args.classes}.safetensors"
    if not path.exists():
        start = time.perf_counter()
        partial = path.with_suffix(".partial")  # renamed once whole: an interrupted write is never reused
        write_logits_file(partial, args.rows, args.classes)
        partial.rename(path)
        print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - start:.0f} s")
    for line in machine_lines():
        print(line)
    print(f"file: {path.name}, {path.stat().st_size / 1e9:.2f} GB float32, streamed; "
          f"taus: {', '.join(taus) or 'the default (1)'}")
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for k in range(args.repeats):
        for decisions in (False, True) if k % 2 == 0 else (True, False):
            warm_page_cache(path)  # every run from the page cache, as far as memory holds the file
            load = os.getloadavg()[0]
            run = run_report(path, taus, decisions)
            runs[decisions].append(run)
            inside = f", {run['figures']:.2f} s of it in the decision figures" if decisions else ""
            print(f"  run {k + 1}, decisions {'on ' if decisions else 'off'}: {run['seconds']:.1f} s wall{inside}, "
                  f"{run['cpu']:.1f} s CPU, peak {run['peak_mb']:.0f} MB (load average {load:.1f} before)",
                  flush=True)
    on, off = runs[True], runs[False]
    peak = {d: max(r["peak_mb"] for r in runs[d]) for d in runs}
    extra_bytes = (peak[True] - peak[False]) * 2**20 / args.rows
    print(f"{'':>16} {'best wall':>9} {'median':>7} {'best CPU':>9} {'median':>7} {'peak RSS MB':>12}   "
          f"({args.repeats} runs each; peak: the largest)")
    for decisions, label in ((False, "without"), (True, "with decisions")):
        wall, cpu = [r["seconds"] for r in runs[decisions]], [r["cpu"] for r in runs[decisions]]
        print(f"{label:>16} {min(wall):9.1f} {statistics.median(wall):7.1f} {min(cpu):9.1f} "
              f"{statistics.median(cpu):7.1f} {peak[decisions]:12.0f}")
    # Other jobs slow a run by up to 20x on a shared machine: the best run of each is the cost of the work itself.
    best = {d: min(r["seconds"] for r in runs[d]) for d in runs}
    extra = best[True] - best[False]
    inside = statistics.median(r["figures"] for r in on)
    print(f"added, best against best: {extra:+.2f} s wall = {100 * extra / best[False]:+.1f}% of the report "
          f"(target <= 20%); {extra_bytes:+.1f} bytes per row of peak RSS (target <= 16)")
    print(f"the decision figures' own work inside each run: {inside:.2f} s (median) = "
          f"{100 * inside / best[False]:.1f}% of the best run without them")
    print(f"AURC {on[0]['aurc']:.6f}, smooth ECE {on[0]['smece']:.6f} (tau {taus[0] if taus else 1}); "
          f"the runs without: null ({len(off)} runs)")
    print(f"decision_figures alone on {args.rows} confidences: {compute_alone(args.rows):.2f} s (median of 3)")


if __name__ == "__main__":
    main()
