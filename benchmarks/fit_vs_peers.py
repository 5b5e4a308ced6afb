"""Fit the exact temperature with tempcal and with the tools a user would pick instead; print ratios.

For each size, seeded miscalibrated float32 logits are written once to a cache folder
(z ~ N(0, 1), labels drawn from softmax(z), every tool given 2.5 z, so T* is near 2.5).
Every contender then runs in a fresh interpreter (``benchmarks/peers/*.py``), loads the data
into memory and times ``--repeats`` fits alone. The table shows per tool: version, T, its
relative error against scipy's bounded optimum in float64, NLL - NLL*, the median seconds,
passes over the data, peak RSS while fitting (the resident data included) and its time
divided by tempcal's; below it the floor (one bare chunked logsumexp pass) and tempcal's
time in floors, and the targets: tempcal >= 5x faster than the fastest peer that reaches
|T - T*|/T* < 1e-3, its own error < 1e-6, and within 12 floors. A missed target gets a
``torch.profiler`` table of one tempcal fit. With CUDA present, the same table is made on the GPU.

Run: ``python benchmarks/fit_vs_peers.py [--sizes 10000x100,50000x1000,200000x1000]``
(peers come from ``pip install -e ".[bench]"``; one that is missing is skipped with the reason).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from _machine import (
    CLOCK_TICKS,
    RESULTS,
    QuietGate,
    cpu_jiffies,
    machine_lines,
    markdown_table,
    package_versions,
    text_table,
)

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
DEFAULT_SIZES = "10000x100,50000x1000,200000x1000"
SCALE = 2.5
#: (key, runner script, extra arguments); the floor and tempcal come first.
CONTENDERS = [
    ("floor", "floor.py", []),
    ("tempcal", "tempcal_fit.py", []),
    ("sklearn", "sklearn_temperature.py", []),
    ("netcal32", "netcal_temperature.py", ["--dtype", "float32"]),
    ("netcal64", "netcal_temperature.py", ["--dtype", "float64"]),
    ("torch-uncertainty", "torch_uncertainty_temperature.py", []),
    ("pytorch-ood", "pytorch_ood_temperature.py", []),
    ("guo", "guo_lbfgs.py", []),
]
ACCURATE = 1e-3  # a peer "reaches the optimum" below this relative error in T
TARGET_SPEEDUP, TARGET_ERROR, TARGET_FLOORS = 5.0, 1e-6, 12.0


@dataclass
class Outcome:
    """What one contender's subprocess reported (or why it has no figures)."""

    key: str
    tool: str = ""
    version: str = ""
    temperature: float = math.nan
    passes: int | None = None
    times: list[float] = field(default_factory=list)
    peak_rss_mb: float = math.nan
    data_rss_mb: float = math.nan
    notes: list[str] = field(default_factory=list)
    status: str = "ok"  # ok | skipped | timeout | failed
    reason: str = ""
    timeout_s: float = math.nan
    load: float = math.nan  # 1-minute load average when it started
    busy: float = math.nan  # cores other jobs kept busy just before it started
    others: float = math.nan  # cores other jobs kept busy while it ran (all busy time less its own CPU time)
    wall_s: float = math.nan
    error: float = math.nan
    nll_gap: float = math.nan

    @property
    def seconds(self) -> float:
        return statistics.median(self.times) if self.times else math.nan


# --- data and the float64 reference -------------------------------------------------------------------------


def parse_size(text: str) -> tuple[int, int]:
    n, c = (int(v) for v in text.lower().split("x"))
    return n, c


def make_data(folder: Path, n: int, c: int, seed: int) -> None:
    """Write logits.npy (float32, 2.5 z) and labels.npy (int64, drawn from softmax(z)) block by block."""
    import numpy as np
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    logits = np.lib.format.open_memmap(folder / "logits.tmp.npy", mode="w+", dtype=np.float32, shape=(n, c))
    labels = np.empty(n, dtype=np.int64)
    g = torch.Generator().manual_seed(seed)
    block = max(1, (1 << 22) // c)
    for a in range(0, n, block):
        z = torch.randn(min(block, n - a), c, generator=g)
        labels[a : a + len(z)] = torch.multinomial(torch.softmax(z.double(), 1), 1, generator=g)[:, 0].numpy()
        logits[a : a + len(z)] = (SCALE * z).numpy()
    logits.flush()
    del logits
    np.save(folder / "labels.npy", labels)
    (folder / "logits.tmp.npy").rename(folder / "logits.npy")


def nll64(folder: Path, temperature: float, block_rows: int = 8192) -> float:
    """Mean NLL of softmax(logits / T) in float64, read block by block from the memory-mapped file."""
    import numpy as np
    import torch

    z = np.load(folder / "logits.npy", mmap_mode="r")
    y = torch.from_numpy(np.load(folder / "labels.npy"))
    total = 0.0
    for a in range(0, len(y), block_rows):
        scaled = torch.from_numpy(np.array(z[a : a + block_rows])).double() / temperature
        true = scaled.gather(1, y[a : a + block_rows, None])[:, 0]
        total += float((torch.logsumexp(scaled, 1) - true).sum())
    return total / len(y)


def slope64(folder: Path, temperature: float, block_rows: int = 8192) -> float:
    """dNLL/dbeta = mean(E_p[z] - z_y) at beta = 1/T in float64: negative below the optimal beta, positive above."""
    import numpy as np
    import torch

    z = np.load(folder / "logits.npy", mmap_mode="r")
    y = torch.from_numpy(np.load(folder / "labels.npy"))
    total = 0.0
    for a in range(0, len(y), block_rows):
        zz = torch.from_numpy(np.array(z[a : a + block_rows])).double()
        p = torch.softmax(zz / temperature, 1)
        total += float(((p * zz).sum(1) - zz.gather(1, y[a : a + block_rows, None])[:, 0]).sum())
    return total / len(y)


def reference(folder: Path) -> dict:
    """T* by scipy's bounded scalar optimiser over log T on the float64 NLL (cached next to the data).

    scipy's bounded method stops at about sqrt(eps) * |log T| + xatol / 3, so T* is also checked
    independently: the float64 slope must change sign between T* (1 - r) and T* (1 + r); the
    smallest such r of 1e-8, 1e-7, ... is recorded as ``bracket``.
    """
    path = folder / "reference.json"
    if path.exists():
        return json.loads(path.read_text())
    from scipy.optimize import minimize_scalar

    start = time.perf_counter()
    found = minimize_scalar(lambda log_t: nll64(folder, math.exp(log_t)), bounds=(math.log(0.05), math.log(50.0)),
                            method="bounded", options={"xatol": 1e-10, "maxiter": 500})
    t_star = math.exp(found.x)
    bracket = None
    for r in (1e-8, 1e-7, 1e-6, 1e-5):
        # a higher T is a lower beta: the slope in beta is positive at T* (1 - r) and negative at T* (1 + r)
        if slope64(folder, t_star * (1 - r)) > 0 > slope64(folder, t_star * (1 + r)):
            bracket = r
            break
    ref = {"t_star": t_star, "nll_star": float(found.fun), "evaluations": int(found.nfev), "bracket": bracket,
           "seconds": time.perf_counter() - start}
    path.write_text(json.dumps(ref))
    return ref


def prepare_size(cache: Path, n: int, c: int, seed: int) -> tuple[Path, dict]:
    folder = cache / f"n{n}_c{c}_seed{seed}"
    if not (folder / "logits.npy").exists():
        print(f"  writing {n:,} x {c:,} float32 logits to {folder}", flush=True)
        make_data(folder, n, c, seed)
    ref = reference(folder)
    return folder, ref


# --- running one contender --------------------------------------------------------------------------------


def child_env(threads: int | None) -> dict[str, str]:
    """The environment of a runner: this one, with the thread count of every math library pinned if asked."""
    env = dict(os.environ)
    if threads:
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[name] = str(threads)
    return env


def run_contender(python: str, key: str, script: str, extra: list[str], folder: Path, repeats: int, device: str,
                  fit_timeout: float, threads: int | None = None, load_timeout: float = 600.0) -> Outcome:
    """Start the runner in a fresh interpreter; kill it if one fit runs past ``fit_timeout`` seconds."""
    outcome = Outcome(key)
    cmd = [python, str(PEERS / script), "--data", str(folder), "--repeats", str(repeats), "--device", device, *extra]
    busy0, started = cpu_jiffies()[0], time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE.parent,
                            env=child_env(threads))
    lines: queue.Queue = queue.Queue()
    stderr: list[str] = []

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True).start()
    deadline = time.monotonic() + load_timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            proc.kill()
            reap(proc, outcome, busy0, started)
            outcome.status, outcome.timeout_s = "timeout", fit_timeout
            outcome.reason = (f"a fit ran past {fit_timeout:.0f} s" if outcome.times or not math.isnan(
                outcome.data_rss_mb) else f"loading the data took over {load_timeout:.0f} s")
            return outcome
        if line is None:
            break
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a peer printing on standard output
        kind = event.pop("event", None)
        if kind == "skip":
            outcome.status, outcome.reason = "skipped", event["reason"]
        elif kind == "loaded":
            outcome.data_rss_mb = event["rss_mb"]
            deadline = time.monotonic() + fit_timeout
        elif kind == "run":
            outcome.times.append(event["seconds"])
            deadline = time.monotonic() + fit_timeout
        elif kind == "result":
            for name in ("tool", "version", "temperature", "passes", "times", "peak_rss_mb", "notes"):
                setattr(outcome, name, event[name])
    reap(proc, outcome, busy0, started)
    if proc.returncode != 0 and outcome.status == "ok" and not outcome.tool:
        last = [s.strip() for s in stderr if s.strip()]
        outcome.status, outcome.reason = "failed", (last[-1] if last else f"exit status {proc.returncode}")[:300]
    return outcome


def reap(proc: subprocess.Popen, outcome: Outcome, busy0: int, started: float) -> None:
    """Wait for the runner; from its CPU time and the machine's, the cores other jobs used meanwhile."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    outcome.wall_s = time.monotonic() - started
    machine_s = (cpu_jiffies()[0] - busy0) / CLOCK_TICKS
    outcome.others = max(0.0, machine_s - usage.ru_utime - usage.ru_stime) / max(outcome.wall_s, 1e-9)


def profile_tempcal(python: str, folder: Path, device: str, threads: int | None) -> str:
    """torch.profiler's table of one tempcal fit (after one untimed fit), for the closing note of a missed target."""
    cmd = [python, str(PEERS / "tempcal_fit.py"), "--data", str(folder), "--repeats", "1", "--device", device,
           "--profile"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent, env=child_env(threads))
    return "\n".join(line for line in done.stderr.splitlines() if not line.startswith(("USDT:", "STAGE:"))).strip()


# --- one size -------------------------------------------------------------------------------------------------


def fmt(value: float, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def error_text(error: float, resolution: float | None) -> str:
    """The relative error, or "< r" when it is below the resolution r to which T* itself is checked."""
    return f"< {resolution:.0e}" if resolution and error < resolution else f"{error:.1e}"


def table_rows(outcomes: list[Outcome], tempcal_s: float, resolution: float | None) -> list[list[str]]:
    rows = []
    for o in outcomes:
        if o.status != "ok":
            label = {"skipped": "skipped", "timeout": "timeout", "failed": "failed"}[o.status]
            too_long = f"> {o.timeout_s:.0f}" if o.status == "timeout" else "-"
            rows.append([o.tool or o.key, o.version or "-", label, "-", "-", too_long, "-", "-", "-",
                         fmt(o.load, ".2f"), fmt(o.others, ".1f")])
            continue
        is_floor = o.key == "floor"
        rows.append([
            o.tool, o.version,
            "-" if is_floor else f"{o.temperature:.7g}",
            "-" if is_floor else error_text(o.error, resolution),
            "-" if is_floor else f"{o.nll_gap:.1e}",
            f"{o.seconds:.4g}",
            "n/a" if o.passes is None else str(o.passes),
            f"{o.peak_rss_mb:,.0f}",
            "-" if o.key == "tempcal" else f"{o.seconds / tempcal_s:.3g}x",
            fmt(o.load, ".2f"),
            fmt(o.others, ".1f"),
        ])
    return rows


HEADER = ["tool", "version", "T", "|T-T*|/T*", "NLL-NLL*", "median s", "passes", "peak RSS MB", "time / tempcal",
          "load", "others"]


def verdict(outcomes: list[Outcome]) -> tuple[list[str], bool]:
    """The target lines for one size and whether every target is met."""
    by_key = {o.key: o for o in outcomes}
    tempcal, floor = by_key.get("tempcal"), by_key.get("floor")
    if tempcal is None or tempcal.status != "ok":
        return [f"tempcal did not run: {tempcal.reason if tempcal else 'not selected'}"], False
    lines, ok = [], True
    accurate = [o for o in outcomes if o.key not in ("floor", "tempcal") and o.status == "ok" and o.error < ACCURATE]
    if accurate:
        best = min(accurate, key=lambda o: o.seconds)
        speedup = best.seconds / tempcal.seconds
        met = speedup >= TARGET_SPEEDUP
        ok &= met
        lines.append(f"{'MET ' if met else 'MISS'} tempcal is {speedup:.1f}x faster than the fastest peer reaching "
                     f"|T-T*|/T* < {ACCURATE:g} ({best.tool}, {best.seconds:.3g} s); target >= {TARGET_SPEEDUP:g}x")
    else:
        lines.append(f"n/a  no peer that ran reaches |T-T*|/T* < {ACCURATE:g}")
    met = tempcal.error < TARGET_ERROR
    ok &= met
    lines.append(f"{'MET ' if met else 'MISS'} tempcal's |T-T*|/T* = {tempcal.error:.1e}; target < {TARGET_ERROR:g}")
    if floor is not None and floor.status == "ok":
        floors = tempcal.seconds / floor.seconds
        met = floors <= TARGET_FLOORS
        ok &= met
        lines.append(f"{'MET ' if met else 'MISS'} tempcal takes {floors:.1f} floors ({tempcal.passes} passes; "
                     f"floor {floor.seconds * 1e3:.3g} ms); target <= {TARGET_FLOORS:g}")
    return lines, ok


def run_size(args, size: str, device: str, gate: QuietGate) -> dict:
    n, c = parse_size(size)
    print(f"\n== {n:,} x {c:,} float32 on {device} ==", flush=True)
    folder, ref = prepare_size(args.cache, n, c, args.seed)
    print(f"  T* = {ref['t_star']:.10g} (scipy bounded, float64, {ref['evaluations']} evaluations; within "
          f"{ref['bracket']} relative by the float64 slope's sign), NLL* = {ref['nll_star']:.10g}", flush=True)
    outcomes = []
    for key, script, extra in CONTENDERS:
        if args.only and key not in args.only:
            continue
        tries: list[Outcome] = []
        while True:
            load, busy = gate.wait()
            outcome = run_contender(args.python, key, script, extra, folder, args.repeats, device, args.timeout,
                                    args.threads)
            outcome.load, outcome.busy = load, busy
            tries.append(outcome)
            if (outcome.status != "ok" or outcome.others <= args.max_busy or outcome.wall_s > args.retry_under
                    or len(tries) > args.retries):
                break
            print(f"  ({outcome.tool}: other jobs kept {outcome.others:.1f} cores busy during the run; "
                  "measuring again)", flush=True)
        outcome = min(tries, key=lambda o: o.others if o.status == "ok" else math.inf)
        if outcome.status == "ok" and key != "floor":
            outcome.error = abs(outcome.temperature - ref["t_star"]) / ref["t_star"]
            outcome.nll_gap = nll64(folder, outcome.temperature) - ref["nll_star"] if outcome.temperature > 0 else (
                math.nan)
        state = outcome.status if outcome.status != "ok" else f"{outcome.seconds:.4g} s"
        detail = f": {outcome.reason}" if outcome.reason else ""
        print(f"  {outcome.tool or key}: {state}{detail} (load {outcome.load:.2f}; other jobs kept "
              f"{outcome.others:.1f} cores busy during the run)", flush=True)
        outcomes.append(outcome)
    tempcal = next((o for o in outcomes if o.key == "tempcal" and o.status == "ok"), None)
    rows = table_rows(outcomes, tempcal.seconds if tempcal else math.nan, ref.get("bracket"))
    lines, ok = verdict(outcomes)
    print()
    print(text_table(HEADER, rows))
    print("\n".join("  " + line for line in lines))
    profile = ""
    if not ok and tempcal is not None and args.profile_on_miss:
        profile = profile_tempcal(args.python, folder, device, args.threads)
        print("\n  profile of one tempcal fit (torch.profiler, sorted by self CPU time):\n" + profile)
    return {"size": size, "device": device, "ref": ref, "outcomes": outcomes, "rows": rows, "verdict": lines,
            "ok": ok, "profile": profile}


# --- the whole run --------------------------------------------------------------------------------------------


def cuda_available(python: str) -> tuple[bool, str]:
    code = "import torch; print(torch.cuda.is_available(), torch.__version__)"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.split()
    return (out[:1] == ["True"]), (out[1] if len(out) > 1 else "?")


def write_markdown(path: Path, args, sections: list[dict], gpu_note: str, gate: QuietGate) -> None:
    versions = package_versions(args.python, ["torch", "numpy", "scipy", "tempcal", "scikit-learn", "netcal",
                                              "torch-uncertainty", "pytorch-ood"])
    out = ["# tempcal fit vs peers", "",
           "Written by `benchmarks/fit_vs_peers.py`: " + " ".join(sys.argv[1:] or ["(defaults)"]), ""]
    out += [f"- {line}" for line in machine_lines(args.python)]
    out.append("- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    threads = f"threads pinned to {args.threads}" if args.threads else "each tool's default thread count"
    out.append(f"- each contender in a fresh interpreter ({threads}); median of {args.repeats} fits of data already "
               f"in memory; a fit over {args.timeout:.0f} s is recorded as a timeout")
    out.append("- `load`: the 1-minute load average when the contender started; `others`: the cores other jobs "
               "kept busy while it ran (the machine's busy time less the contender's own CPU time, per second). "
               f"This machine is shared: a contender waits while other jobs keep more than {args.max_busy:g} cores "
               f"busy ({gate.waited_s:.0f} s waited in all, at most {args.max_wait:.0f} s), and one that took under "
               f"{args.retry_under:.0f} s is measured again (up to {args.retries} times) when others exceeded that "
               "during its run; the run with the least interference is shown. Multi-threaded torch slows down far "
               "more than its share when another job holds a core")
    out.append("- `passes`: objective evaluations over all the data (an autograd evaluation reads it in the "
               "forward and again in the backward); `peak RSS`: the runner's high-water resident memory (`VmHWM`, "
               "reset after loading and preparing the input) during the fits, the input included")
    out.append("")
    for s in sections:
        ref = s["ref"]
        out += [f"## {s['size']} float32, {s['device']}", "",
                f"T* = {ref['t_star']:.10g}, NLL* = {ref['nll_star']:.10g} (scipy's bounded optimum in float64; "
                f"the float64 slope changes sign within {ref['bracket']} of T* relative)", "",
                markdown_table(HEADER, s["rows"]), ""]
        out += [f"- {line}" for line in s["verdict"]]
        notes = sorted({f"{o.tool or o.key}: {o.reason or n}" for o in s["outcomes"]
                        for n in (o.notes or [""]) if o.reason or n})
        out += [f"- note: {n}" for n in notes]
        if s["profile"]:
            out += ["", "Profile of one tempcal fit (torch.profiler, by self CPU time):", "", "```", s["profile"],
                    "```"]
        out.append("")
    out += ["## GPU", "", gpu_note, ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out))
    print(f"\nwrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"comma-separated NxC (default {DEFAULT_SIZES})")
    parser.add_argument("--repeats", type=int, default=3, help="timed fits per contender (median; default 3)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one fit may take (default 300)")
    parser.add_argument("--only", type=lambda s: set(s.split(",")), default=None,
                        help="contenders to run: " + ",".join(k for k, _, _ in CONTENDERS))
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="auto: the CPU tables, then the GPU tables when CUDA is present")
    parser.add_argument("--python", default=sys.executable, help="interpreter of the contenders (default: this one)")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/tempcal-bench-data"),
                        help="folder for the generated logits (reused across runs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None,
                        help="pin OMP/MKL threads of every contender (default: each tool's own default)")
    parser.add_argument("--results", type=Path, default=RESULTS / "fit_vs_peers.md",
                        help="Markdown results file ('-' for none)")
    parser.add_argument("--max-busy", type=float, default=0.5,
                        help="wait before a run while other jobs keep more cores busy than this (default 0.5)")
    parser.add_argument("--max-wait", type=float, default=600.0, help="total seconds to wait for quiet (default 600)")
    parser.add_argument("--retries", type=int, default=3,
                        help="measure a short contender again when other jobs kept more than --max-busy cores busy "
                             "during its run (default 3 times)")
    parser.add_argument("--retry-under", type=float, default=60.0,
                        help="only contenders whose whole run took fewer seconds are measured again (default 60)")
    parser.add_argument("--no-profile", dest="profile_on_miss", action="store_false",
                        help="skip the torch.profiler table when a target is missed")
    args = parser.parse_args()
    if args.only and "tempcal" not in args.only:
        args.only.add("tempcal")
    gate = QuietGate(args.max_busy, args.max_wait)
    for line in machine_lines(args.python):
        print(line)
    started = time.perf_counter()
    sections = []
    has_cuda, torch_version = cuda_available(args.python)
    if args.device in ("auto", "cpu"):
        sections += [run_size(args, size, "cpu", gate) for size in args.sizes.split(",")]
    if has_cuda and args.device in ("auto", "cuda"):
        sections += [run_size(args, size, "cuda", gate) for size in args.sizes.split(",")]
        gpu_note = "The GPU tables are above."
    elif args.device == "cpu":
        gpu_note = "Not run (--device cpu)."
    else:
        gpu_note = f"Skipped: torch {torch_version} reports no CUDA device (torch.cuda.is_available() is False)."
        print(f"\nGPU section skipped: torch {torch_version} reports no CUDA device")
        if args.device == "cuda":
            sys.exit(1)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if str(args.results) != "-":
        write_markdown(args.results, args, sections, gpu_note, gate)


if __name__ == "__main__":
    main()
