"""Time ``tempcal.fit_temperature`` on in-memory logits from two checkouts, interleaved, and print the ratios.

Each round runs every checkout in a fresh interpreter (``PYTHONPATH`` set to it) on the same float32 logits
(``fit_speed.make``: T* near 2.5); each run times ``--repeats`` fits and reports the best and the median, the
passes, and the first call (``import tempcal`` and one fit, torch already loaded: what a script's one fit pays).
The table holds, per size, the median over rounds of each of these and their ratio (after / before).
Interleaving spreads a shared machine's load over both checkouts alike.

Run: ``python benchmarks/fit_before_after.py --before ../old-checkout [--after .] [--sizes 10000x100]
[--threads 1] [--rounds 5] [--scale 2.5] [--tau T] [--results FILE]``; ``--tau T`` times ``tempcal.evaluate`` at T on a
validated scan instead of the fit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fit_speed import make  # noqa: E402

CHILD = """
import json, statistics, sys, time
import torch
started = time.perf_counter()
import tempcal
z, y = torch.load(sys.argv[1])
repeats, tau = int(sys.argv[2]), float(sys.argv[3])
if tau > 0:  # time the metrics pass at tau on a validated scan instead of the fit
    scan = tempcal.Scan(tempcal.as_logits_data(z, y), device="cpu")
    job = lambda: tempcal.evaluate(scan, tau)
else:
    job = lambda: tempcal.fit_temperature(z, y, device="cpu")
job()  # warm-up: allocator, lazy imports
first = time.perf_counter() - started  # import tempcal and the first call, as a script's one fit pays
times = []
for _ in range(repeats):
    start = time.perf_counter()
    result = job()
    times.append(time.perf_counter() - start)
result = tempcal.fit_temperature(z, y, device="cpu")
print(json.dumps({"first": first, "best": min(times), "median": statistics.median(times), "passes": result.passes,
                  "temperature": result.temperature, "file": tempcal.__file__}))
"""


def run(tree: Path, data: Path, repeats: int, threads: int | None, tau: float = 0.0) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # modules load from bytecode, as an installed tool's do
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    done = subprocess.run([sys.executable, "-c", CHILD, str(data), str(repeats), str(tau)], env=env,
                          capture_output=True, text=True, check=True, cwd=tree)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out["file"].startswith(str(tree.resolve())):
        raise SystemExit(f"{tree}: imported tempcal from {out['file']}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the checkout to compare against")
    parser.add_argument("--after", type=Path, default=HERE.parent, help="the checkout measured (default: this one)")
    parser.add_argument("--sizes", default="1000x10,10000x100,50000x1000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--scale", type=float, default=2.5, help="logits N(0, 1) times this (T* near it)")
    parser.add_argument("--tau", type=float, default=0.0,
                        help="time tempcal.evaluate at this T on a validated scan instead of the fit")
    parser.add_argument("--results", type=Path, default=None, help="also write the table (markdown) here")
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    timed = f"tempcal.evaluate at T = {args.tau:g}" if args.tau > 0 else "tempcal.fit_temperature"
    lines = [f"{timed} on N(0, 1) x {args.scale:g} logits; threads: {args.threads or 'default'}; {args.rounds} "
             f"rounds, each checkout {args.repeats} runs per "
             "round in a fresh interpreter, interleaved; medians over rounds", "",
             "| size | passes before | passes after | best before | best after | ratio | median before | "
             "median after | ratio | first call before | first call after | ratio |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    with tempfile.TemporaryDirectory() as folder:
        for size in args.sizes.split(","):
            n, c = (int(v) for v in size.split("x"))
            data = Path(folder) / f"{size}.pt"
            torch.save(make(n, c, args.scale), data)
            runs: dict[str, list[dict]] = {"before": [], "after": []}
            for _ in range(args.rounds):
                for name, tree in trees.items():
                    runs[name].append(run(tree, data, args.repeats, args.threads, args.tau))
            best = {k: statistics.median(r["best"] for r in v) for k, v in runs.items()}
            median = {k: statistics.median(r["median"] for r in v) for k, v in runs.items()}
            first = {k: statistics.median(r["first"] for r in v) for k, v in runs.items()}
            lines.append(f"| {size} | {runs['before'][0]['passes']} | {runs['after'][0]['passes']} | "
                         f"{best['before'] * 1e3:.2f} ms | {best['after'] * 1e3:.2f} ms | "
                         f"{best['after'] / best['before']:.2f}x | {median['before'] * 1e3:.2f} ms | "
                         f"{median['after'] * 1e3:.2f} ms | {median['after'] / median['before']:.2f}x | "
                         f"{first['before'] * 1e3:.1f} ms | {first['after'] * 1e3:.1f} ms | "
                         f"{first['after'] / first['before']:.2f}x |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.results:
        args.results.write_text(text)


if __name__ == "__main__":
    main()
