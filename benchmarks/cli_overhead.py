"""End-to-end cost of the ``tempcal`` command against the floor of any torch tool on the same file.

Writes a seeded logits file of about 200 MB (50,000 x 1,000 float32 and int64 labels) once,
then times, interleaved and after one warm-up each (page cache and bytecode warm; ``PYTHONDONTWRITEBYTECODE`` is
unset for the commands, as an installed tool has its bytecode cached):

* ``tempcal fit FILE --no-write --json -`` against ``python -c`` importing torch and loading
  the same file with ``safetensors.torch.load_file`` (the least any torch tool must do):
  target ratio <= 1.5;
* ``tempcal --help`` against ``python -c "import torch"``: target ratio <= 0.35.

Prints the medians, each command's peak RSS (``wait4``'s ``ru_maxrss``) and the ratios, and
writes them to ``benchmarks/results/cli_overhead.md``.

``--checkout PATH`` also times the two tempcal commands importing another checkout, in the same rounds (the entry
point imports whichever tempcal comes first on ``PYTHONPATH``), and prints this checkout's time over that one's.

Run: ``python benchmarks/cli_overhead.py [--repeats 5] [--rows 50000 --classes 1000] [--checkout PATH]``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
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

TARGET_FIT, TARGET_HELP = 1.5, 0.35


WRITER = """
import sys, torch
from safetensors.torch import save_file
path, rows, classes, seed = sys.argv[1], *map(int, sys.argv[2:])
g = torch.Generator().manual_seed(seed)
z = torch.randn(rows, classes, generator=g)
labels = torch.multinomial(torch.softmax(z.double(), 1), 1, generator=g)[:, 0]
save_file({"logits": (2.5 * z).contiguous(), "labels": labels}, path)
"""


def write_file(python: str, path: Path, rows: int, classes: int, seed: int) -> None:
    """Seeded float32 logits (2.5 z, labels drawn from softmax(z)) and int64 labels as one safetensors file.

    Written by a child interpreter: this process stays small, because on Linux a child's
    ``ru_maxrss`` starts from the resident size of the parent that started it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    subprocess.run([python, "-c", WRITER, str(partial), str(rows), str(classes), str(seed)], check=True)
    partial.rename(path)


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str, float]:
    """Run ``cmd`` (in ``env``, else this environment); return (wall seconds, the child's peak RSS in MiB, its
    standard output, the cores other jobs kept busy meanwhile). Fails on non-zero exit."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        busy0 = cpu_jiffies()[0]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        machine_s = (cpu_jiffies()[0] - busy0) / CLOCK_TICKS
        others = max(0.0, machine_s - usage.ru_utime - usage.ru_stime) / seconds
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {err.read().strip()[-500:]}")
        return seconds, usage.ru_maxrss / 1024, out.read(), others


def tempcal_command(python: str) -> list[str]:
    """The ``tempcal`` entry point installed next to ``python`` (``python -m tempcal`` when there is none)."""
    script = Path(python).parent / "tempcal"
    return [str(script)] if script.exists() else [python, "-m", "tempcal"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each command (median; default 5)")
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--classes", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--python", default=sys.executable, help="interpreter whose tempcal and torch are timed")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/tempcal-bench-data"))
    parser.add_argument("--results", type=Path, default=RESULTS / "cli_overhead.md", help="('-' for none)")
    parser.add_argument("--checkout", type=Path, default=None,
                        help="another tempcal checkout: its fit and --help timed in the same rounds (PYTHONPATH set to "
                             "it, since the entry point imports whichever tempcal comes first), and the ratios")
    parser.add_argument("--max-busy", type=float, default=0.5,
                        help="wait before a round while other jobs keep more cores busy than this (default 0.5)")
    parser.add_argument("--max-wait", type=float, default=600.0, help="total seconds to wait for quiet (default 600)")
    parser.add_argument("--retries", type=int, default=5,
                        help="rounds measured again when other jobs were busy during them (default 5 in all)")
    args = parser.parse_args()
    # An installed tool runs from cached bytecode: with PYTHONDONTWRITEBYTECODE set, every run would compile
    # tempcal's modules again (about 30 ms of --help's 105 ms here), so the warm-up writes the cache.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

    path = args.cache / f"cli_{args.rows}x{args.classes}_seed{args.seed}.safetensors"
    if not path.exists():
        print(f"writing {path}", flush=True)
        write_file(args.python, path, args.rows, args.classes, args.seed)
    size_mb = path.stat().st_size / 1e6
    tempcal = tempcal_command(args.python)
    commands = {
        "tempcal fit FILE --no-write --json -": [*tempcal, "fit", str(path), "--no-write", "--json", "-"],
        "python -c: import torch; safetensors load_file(FILE)": [
            args.python, "-c", f"import torch; from safetensors.torch import load_file; load_file({str(path)!r})"],
        "tempcal --help": [*tempcal, "--help"],
        'python -c "import torch"': [args.python, "-c", "import torch"],
    }
    envs: dict[str, dict[str, str] | None] = dict.fromkeys(commands)
    if args.checkout is not None:  # the same commands importing the other checkout's tempcal
        other = {**os.environ, "PYTHONPATH": os.pathsep.join([str(args.checkout.resolve()),
                                                              *filter(None, [os.environ.get("PYTHONPATH")])])}
        for name in ("tempcal fit FILE --no-write --json -", "tempcal --help"):
            commands[f"{name} [checkout]"] = commands[name]
            envs[f"{name} [checkout]"] = other
    for line in machine_lines(args.python):
        print(line)
    print(f"file: {path} ({size_mb:.0f} MB)")
    for name, cmd in commands.items():  # warm the page cache and the bytecode caches
        timed(cmd, envs[name])
    names_fit = "tempcal fit FILE --no-write --json -"
    gate = QuietGate(args.max_busy, args.max_wait)
    times: dict[str, list[float]] = {name: [] for name in commands}
    peaks: dict[str, float] = dict.fromkeys(commands, 0.0)
    loads, interference, fit_json, redone = [], [], {}, 0
    while len(loads) < args.repeats:
        load, _busy = gate.wait()
        measured = {name: timed(cmd, envs[name]) for name, cmd in commands.items()}
        worst = max(m[3] for m in measured.values())
        if worst > args.max_busy and redone < args.retries:
            redone += 1
            print(f"  (other jobs kept {worst:.1f} cores busy during a command: measuring the round again)",
                  flush=True)
            continue
        loads.append(load)
        interference.append(worst)
        for name, (seconds, peak, out, _others) in measured.items():
            times[name].append(seconds)
            peaks[name] = max(peaks[name], peak)
            if name == names_fit:
                fit_json = json.loads(out)
    median = {name: statistics.median(v) for name, v in times.items()}
    names = list(commands)
    ratio_fit = median[names[0]] / median[names[1]]
    ratio_help = median[names[2]] / median[names[3]]
    header = ["command", "median s", "min s", "peak RSS MB", "ratio"]
    rows = []
    for i, name in enumerate(names):
        ratio = (f"{ratio_fit:.2f}" if i == 0 else f"{ratio_help:.2f}" if i == 2 else "1 (floor)" if i < 4
                 else f"this / checkout {median[names[(i - 4) * 2]] / median[name]:.2f}")
        rows.append([name, f"{median[name]:.3f}", f"{min(times[name]):.3f}", f"{peaks[name]:,.0f}", ratio])
    verdict = [
        f"{'MET ' if ratio_fit <= TARGET_FIT else 'MISS'} tempcal fit / (import torch + load) = {ratio_fit:.2f}; "
        f"target <= {TARGET_FIT:g} (fit reported {fit_json.get('passes')} passes, T = "
        f"{fit_json.get('temperature', math.nan):.6g}, n_fit {fit_json.get('n_fit')})",
        f"{'MET ' if ratio_help <= TARGET_HELP else 'MISS'} tempcal --help / import torch = {ratio_help:.2f}; "
        f"target <= {TARGET_HELP:g}",
    ]
    print()
    print(text_table(header, rows))
    print("\n".join("  " + line for line in verdict))
    load_line = (f"1-minute load average at each round: {', '.join(f'{v:.2f}' for v in loads)}; the most cores "
                 f"other jobs kept busy during one of its commands: {', '.join(f'{v:.1f}' for v in interference)}")
    print("  " + load_line)
    if str(args.results) == "-":
        return
    versions = package_versions(args.python, ["tempcal", "torch", "safetensors", "typer", "rich", "numpy"])
    out = ["# tempcal CLI overhead", "",
           "Written by `benchmarks/cli_overhead.py`: " + " ".join(sys.argv[1:] or ["(defaults)"]), ""]
    out += [f"- {line}" for line in machine_lines(args.python)]
    out += ["- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
            f"- file: {args.rows:,} x {args.classes:,} float32 logits + int64 labels, {size_mb:.0f} MB, in the page "
            f"cache; median of {args.repeats} interleaved runs after one warm-up each",
            f"- {load_line} (a round waits while other jobs keep more than {args.max_busy:g} cores busy, "
            f"{gate.waited_s:.0f} s waited; a round where they did so during a command is measured again, up to "
            f"{args.retries} times, {redone} redone)", "",
            markdown_table(header, rows), ""]
    out += [f"- {line}" for line in verdict]
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text("\n".join(out) + "\n")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
