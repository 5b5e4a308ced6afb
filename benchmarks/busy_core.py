"""A fit while another process keeps a core busy: torch's default threads against one thread and scikit-learn.

The script starts its own busy process (a plain Python loop, pinned to the last usable core, free with ``--busy
free``, or pinned at the lowest priority with ``--busy nice``: a background job), and measures, each figure in a
fresh interpreter, ``fit_temperature`` on seeded float32 logits (2.5 z, labels drawn from softmax(z), as
``fit_vs_peers.py``) in memory and streamed from a safetensors file (``TEMPCAL_RESIDENT_BYTES=0``: read a chunk at
a time, the validating scan included): with torch's default threads and with ``torch.set_num_threads(1)``; and
scikit-learn's temperature core (``sklearn.calibration._TemperatureScaling``, on the NumPy arrays in memory; it has
no streamed form). Then the default threads again without the busy process. With ``--base DIR`` (a checkout of an
earlier tempcal), that tree's default-threads figures are measured in the same run, idle and busy.

Every figure is the median over ``--repeats`` fresh processes of each process's median fit
(``--fits`` fits after one warm-up on 2,000 rows; one fit for scikit-learn and ``--base`` above
10,000 x 100); the processes of one repeat run one after the other, contenders interleaved, so
slow minutes hit them alike. Targets (issue 39): with one core busy, default threads within 1.5x
of one thread, and faster than scikit-learn by >= 5x at 10,000 x 100 and >= 10x at 50,000 x 1,000;
idle, no slower than ``--base``.

With ``--commands also`` (or ``only``), the CLI commands whose passes are not the fit's are timed too, each
run in a fresh process at ``--command-size`` (default 50,000 x 1,000 float32, a group column and an OOD
file), the busy process running: ``ood``, ``fit --estimators all``, ``fit --conformal-alpha 0.1`` and
``fit --folds 5 --group-by g``, on the default threads and with ``TEMPCAL_THREADS=1`` (interleaved, the
median of ``--repeats``).

Run: ``python benchmarks/busy_core.py [--repeats 3] [--sizes 10000x100,50000x1000] [--base DIR]
[--busy pinned|free|nice] [--commands also|only]``
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

from _machine import RESULTS, busy_cores, load_average, machine_lines, markdown_table, text_table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_SIZES = "10000x100,50000x1000"
SPEEDUP_ONE, SPEEDUP_SKLEARN = 1.5, {"10000x100": 5.0, "50000x1000": 10.0}
CHILD_TIMEOUT_S = 300


# --- the child: one figure in a fresh interpreter ---------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    """Load the data, time ``fits`` fits (after a warm-up), print one JSON line."""
    if args.tree:
        sys.path.insert(0, args.tree)
    import numpy as np
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(args.data)
    logits = torch.from_numpy(np.load(folder / "logits.npy"))
    labels = torch.from_numpy(np.load(folder / "labels.npy"))
    if args.tool == "sklearn":
        import sklearn.calibration as calibration

        fit = lambda: 1.0 / float(calibration._TemperatureScaling().fit(logits.numpy(), labels.numpy()).beta_)  # noqa: E731
        warm = None
    else:
        import tempcal

        if args.mode == "memory":
            fit = lambda: tempcal.fit_temperature(logits, labels, device="cpu").temperature  # noqa: E731
        else:
            from tempcal.core.scan import ALL_ROWS, Scan

            path = folder / "logits.safetensors"
            fit = lambda: tempcal.fit_temperature(Scan(tempcal.open_source(path).data, device="cpu",  # noqa: E731
                                                       fit_rows=ALL_ROWS)).temperature
        def warm():
            return tempcal.fit_temperature(logits[:2000], labels[:2000], device="cpu")
    if warm is not None:
        warm()
    times, temperature = [], float("nan")
    for _ in range(args.fits):
        start = time.perf_counter()
        temperature = fit()
        times.append(time.perf_counter() - start)
    print(json.dumps({"seconds": statistics.median(times), "times": times, "temperature": temperature,
                      "threads": torch.get_num_threads()}), flush=True)


# --- the CLI commands ------------------------------------------------------------------------------------------

COMMANDS = {"ood": ["ood", "{id}", "--ood", "{ood}"], "fit --estimators all": ["fit", "{id}", "--estimators", "all"],
            "fit --conformal-alpha 0.1": ["fit", "{id}", "--conformal-alpha", "0.1"],
            "fit --folds 5 --group-by g": ["fit", "{id}", "--folds", "5", "--group-by", "g"]}


def make_command_data(folder: Path, n: int, c: int) -> dict[str, Path]:
    """Seeded float32 logits (2.5 z, labels drawn from softmax(z)), a group column ``g`` of 8 groups, and OOD logits
    (2 z): the files the commands read."""
    files = {"id": folder / "id.safetensors", "ood": folder / "ood.safetensors"}
    if all(path.exists() for path in files.values()):
        return files
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    z = 2.5 * torch.randn(n, c, generator=g)
    tensors = {"id": {"logits": z, "labels": torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0],
                      "g": torch.randint(0, 8, (n,), generator=g)},
               "ood": {"logits": 2.0 * torch.randn(n, c, generator=g)}}
    for name, path in files.items():
        save_file(tensors[name], str(path.with_suffix(".tmp")))
        path.with_suffix(".tmp").rename(path)
    return files


def run_command(name: str, files: dict[str, Path], threads: str, out: Path) -> float:
    """Seconds of one CLI command in a fresh process (``threads``: "default" or a ``TEMPCAL_THREADS`` value)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TEMPCAL_THREADS", None)
    if threads != "default":
        env["TEMPCAL_THREADS"] = threads
    words = [w.format(**{k: str(v) for k, v in files.items()}) for w in COMMANDS[name]]
    words += ["--json", str(out), "-q"] + (["--no-write"] if words[0] == "fit" else [])
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "tempcal", *words], capture_output=True, text=True, env=env,
                              timeout=CHILD_TIMEOUT_S * 2)
    except subprocess.TimeoutExpired:
        return float("nan")
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
        return float("nan")
    return time.perf_counter() - start


def measure_commands(args: argparse.Namespace) -> list[str]:
    """The commands with the busy process running: a table (markdown lines) of median seconds per thread count."""
    n, c = (int(v) for v in args.command_size.lower().split("x"))
    files = make_command_data(args.cache / f"commands-{args.command_size}", n, c)
    samples: dict[tuple[str, str], list[float]] = {(name, t): [] for name in COMMANDS for t in ("default", "1")}
    seen = []
    process = start_busy(args.busy)
    try:
        time.sleep(0.5)
        for _ in range(args.repeats):
            for name, threads in samples:
                samples[name, threads].append(run_command(name, files, threads, args.cache / "command.json"))
            seen.append(f"load {load_average():.2f}")
    finally:
        stop_busy(process)
    header = ["command", "default s", "1 thread s", "default / 1 thread"]
    rows = []
    for name in COMMANDS:
        default, one = statistics.median(samples[name, "default"]), statistics.median(samples[name, "1"])
        rows.append([f"tempcal {name}", f"{default:.2f}", f"{one:.2f}", ratio(default, one)])
    title = f"CLI commands at {args.command_size}, {args.busy} busy loop; load seen: {', '.join(seen)}"
    print(f"\n{title}\n{text_table(header, rows)}", flush=True)
    return ["", f"## {title}", "", markdown_table(header, rows)]


# --- the parent ---------------------------------------------------------------------------------------------


def make_data(folder: Path, n: int, c: int) -> None:
    """The logits as .npy (``fit_vs_peers.make_data``) and as one safetensors file."""
    if (folder / "logits.safetensors").exists():
        return
    import numpy as np
    import torch
    from fit_vs_peers import make_data as make_npy
    from safetensors.torch import save_file

    make_npy(folder, n, c, seed=0)
    tensors = {"logits": torch.from_numpy(np.load(folder / "logits.npy")),
               "labels": torch.from_numpy(np.load(folder / "labels.npy"))}
    save_file(tensors, str(folder / "logits.tmp.safetensors"))
    (folder / "logits.tmp.safetensors").rename(folder / "logits.safetensors")


def start_busy(kind: str) -> subprocess.Popen | None:
    """A plain Python loop, pinned to the last core this process may use (``pinned``), free, or pinned at the
    lowest priority (``nice``: a background job; it also keeps that core from idling between a pass's maps)."""
    if kind == "none":
        return None
    cores = sorted(os.sched_getaffinity(0))

    def pin() -> None:
        os.sched_setaffinity(0, {cores[-1]})
        if kind == "nice":
            os.nice(19)
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=None if kind == "free" else pin)


def stop_busy(process: subprocess.Popen | None) -> None:
    if process is not None:
        process.kill()
        process.wait()


def run_child(tree: str | None, tool: str, mode: str, threads: int, data: Path, fits: int) -> float:
    env = dict(os.environ)
    env.pop("TEMPCAL_THREADS", None)
    if mode == "stream":
        env["TEMPCAL_RESIDENT_BYTES"] = "0"
    command = [sys.executable, __file__, "--child", "--tool", tool, "--mode", mode, "--threads", str(threads),
               "--data", str(data), "--fits", str(fits)]
    if tree:
        command += ["--tree", tree]
        env["PYTHONPATH"] = tree
    try:
        out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return float("nan")
    if out.returncode:
        print(out.stderr[-2000:], file=sys.stderr)
        return float("nan")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def contenders(base: str | None) -> list[tuple[str, str | None, str, str, int]]:
    """(label, tree, tool, mode, threads): 0 threads is torch's default."""
    here = str(ROOT)
    rows = [("default, memory", here, "tempcal", "memory", 0), ("1 thread, memory", here, "tempcal", "memory", 1),
            ("default, streamed", here, "tempcal", "stream", 0), ("1 thread, streamed", here, "tempcal", "stream", 1)]
    if base:
        rows += [("base default, memory", base, "tempcal", "memory", 0),
                 ("base default, streamed", base, "tempcal", "stream", 0)]
    return rows


def measure(size: str, data: Path, args: argparse.Namespace, busy: str) -> tuple[dict[str, float], list[str]]:
    """Median seconds per contender under ``busy``, and the load seen."""
    who = contenders(args.base)
    if busy == "none":  # idle: what the default threads give, and the earlier tree's, for the "no slower" check
        who = [w for w in who if "default" in w[0]]
    else:
        who.append(("scikit-learn", None, "sklearn", "memory", 0))
    samples: dict[str, list[float]] = {label: [] for label, *_ in who}
    seen = []
    process = start_busy(busy)
    try:
        time.sleep(0.5)
        for _ in range(args.repeats):
            for label, tree, tool, mode, threads in who:
                slow = (tool == "sklearn" or tree != str(ROOT)) and size != "10000x100"  # seconds per fit
                fits = 1 if slow else args.fits
                samples[label].append(run_child(tree, tool, mode, threads, data, fits))
            seen.append(f"load {load_average():.2f}")
    finally:
        stop_busy(process)
    return {label: statistics.median(v) for label, v in samples.items()}, seen


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per figure (the median is shown)")
    parser.add_argument("--fits", type=int, default=3, help="fits per process (its median counts)")
    parser.add_argument("--busy", choices=("pinned", "free", "nice"), default="pinned",
                        help="the busy loop: pinned to the last core, free, or pinned at the lowest priority")
    parser.add_argument("--base", help="a checkout of an earlier tempcal to measure alongside (idle and busy)")
    parser.add_argument("--commands", choices=("none", "also", "only"), default="none",
                        help="also (or only) time the CLI commands ood, fit --estimators/--conformal-alpha/--folds")
    parser.add_argument("--command-size", default="50000x1000")
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "tempcal-busy-core")
    parser.add_argument("--out", type=Path, default=RESULTS / "busy_core.md")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tool", default="tempcal", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="memory", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    began = time.perf_counter()
    lines = machine_lines()
    lines.append(f"other jobs before the run: {busy_cores():.1f} cores busy, load {load_average():.2f}")
    print("\n".join(lines), flush=True)
    report = ["# A fit with one core kept busy (benchmarks/busy_core.py)", "", *[f"- {x}" for x in lines]]
    verdicts: list[str] = []
    for size in args.sizes.split(",") if args.commands != "only" else []:
        n, c = (int(v) for v in size.lower().split("x"))
        data = args.cache / size
        make_data(data, n, c)
        busy, busy_load = measure(size, data, args, args.busy)
        idle, idle_load = measure(size, data, args, "none")
        header = ["contender", "busy s", "idle s", "busy / 1 thread", "sklearn / busy"]
        rows = []
        for label in busy:
            one = busy.get("1 thread, " + label.rsplit(", ", 1)[-1], float("nan"))
            rows.append([label, f"{busy[label]:.4f}", f"{idle[label]:.4f}" if label in idle else "-",
                         ratio(busy[label], one) if "thread" not in label and label != "scikit-learn" else "-",
                         ratio(busy["scikit-learn"], busy[label]) if label != "scikit-learn" else "-"])
        title = f"{size}, {args.busy} busy loop; load seen: busy {', '.join(busy_load)}; idle {', '.join(idle_load)}"
        print(f"\n{title}\n{text_table(header, rows)}", flush=True)
        report += ["", f"## {title}", "", markdown_table(header, rows)]
        for mode in ("memory", "streamed"):
            default, one = busy[f"default, {mode}"], busy[f"1 thread, {mode}"]
            verdicts.append(f"{size} {mode}: busy default / 1 thread {default / one:.2f} (target <= {SPEEDUP_ONE}); "
                            f"scikit-learn / busy default {busy['scikit-learn'] / default:.1f} "
                            f"(target >= {SPEEDUP_SKLEARN.get(size, 5.0):g})")
            if args.base:
                now, before = idle[f"default, {mode}"], idle[f"base default, {mode}"]
                verdicts.append(f"{size} {mode}: idle default / base {now / before:.2f} (target <= 1, within noise)")
    if verdicts:
        print("\n" + "\n".join(verdicts))
        report += ["", "## Against the targets", "", *[f"- {v}" for v in verdicts]]
    if args.commands != "none":
        report += measure_commands(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(report) + "\n")
    print(f"\nwritten: {args.out} ({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
