"""What ``fit --folds 10`` costs against the plain fit: reads of the data and wall time, from memory, streamed
from a file, and from hidden states with an output head (``--head``).

Every run is the fit workflow (``tempcal.workflows.fit.fit_file``: the validating scan, the fit, the figures
before and after) on the same file, in this process, best of ``--repeat`` runs. Reads are counted where
the data is read: passes over the file (calls of its chunk reader, each a read of the rows it needs: in
memory, each pass still walks the kept tensor), and rows yielded by it, or through the head's matmul,
divided by the rows that count; ``JSON passes`` is the fit's own count (the validating scan and the fit's
reads; the figures before and after take one more). The plain fit is shown twice:
as users run it (half the rows fit, the other half report) and on every row (``--val-fraction 1``, the
fit the folds' written T equals). Targets: ``--folds 10`` reads at most once more than the plain fit and
takes at most 3x its time.

Run: ``python benchmarks/folds_cost.py [--rows 50000] [--classes 1000] [--head-rows 5000] [--width 256]
[--vocab 8000] [--repeat 2] [--results benchmarks/results/folds_cost.md]``
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import QuietGate, machine_lines

RUNS = (("plain (split 0.5)", {}), ("plain (--val-fraction 1)", {"val_fraction": 1.0}), ("--folds 10", {"folds": 10}))


class Counter:
    """Rows read from safetensors chunks and rows through an output head, per call of :meth:`reset`."""

    def __init__(self) -> None:
        self.rows: collections.Counter[str] = collections.Counter()

    @contextlib.contextmanager
    def installed(self):
        from tempcal.models.head import OutputHead
        from tempcal.sources.safetensors import ShardedLogits

        plain_chunks, plain_logits = ShardedLogits.chunks, OutputHead.logits
        counter = self

        def chunks(data, *args, **kwargs):
            counter.rows["file passes"] += 1
            for item in plain_chunks(data, *args, **kwargs):
                counter.rows["file"] += item[1].shape[0]
                yield item

        def logits(head, h, out, *args, **kwargs):
            counter.rows["head"] += h.shape[0]
            return plain_logits(head, h, out, *args, **kwargs)

        ShardedLogits.chunks, OutputHead.logits = chunks, logits
        try:
            yield self
        finally:
            ShardedLogits.chunks, OutputHead.logits = plain_chunks, plain_logits


def logits_file(folder: Path, rows: int, classes: int) -> Path:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(rows, classes, generator=g) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
    path = folder / "logits.safetensors"
    save_file({"logits": z * 2.5, "labels": y}, str(path))
    return path


def head_files(folder: Path, rows: int, width: int, vocab: int) -> tuple[Path, Path]:
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(vocab, width, generator=g) / width ** 0.5 * 3
    hidden = torch.randn(rows, width, generator=g)
    labels = torch.empty(rows, dtype=torch.int64)
    for start in range(0, rows, 256):
        z = hidden[start:start + 256] @ weight.T
        labels[start:start + 256] = torch.multinomial(torch.softmax(z / 2.5, 1), 1, generator=g)[:, 0]
    save_file({"hidden": hidden, "labels": labels}, str(folder / "hidden.safetensors"))
    save_file({"weight": weight}, str(folder / "head.safetensors"))
    return folder / "hidden.safetensors", folder / "head.safetensors"


def measure(path: Path, counter: Counter, what: str, repeat: int, gate: QuietGate, **options) -> list[dict]:
    """Each run's best wall and CPU seconds, reads (rows read / rows), passes and T; the runs interleaved, so that
    a shared machine's load falls on all of them alike, each after waiting for a quiet CPU (within a budget)."""
    from tempcal.workflows.fit import fit_file

    out = [{"run": label, "seconds": float("inf"), "cpu": float("inf"), "load": []} for label, _ in RUNS]
    for _ in range(repeat):
        for row, (_, extra) in zip(out, RUNS, strict=True):
            _, busy = gate.wait()
            counter.rows.clear()
            start, cpu = time.perf_counter(), time.process_time()
            report = fit_file(str(path), device="cpu", **options, **extra)
            row["seconds"] = min(row["seconds"], time.perf_counter() - start)
            row["cpu"] = min(row["cpu"], time.process_time() - cpu)
            row["load"].append(busy)
            row.update(reads=counter.rows[what] / report.opened.data.num_samples, calls=counter.rows["file passes"],
                       passes=report.fit.passes, temperature=report.temperature)
    return out


def table(title: str, runs: list[dict]) -> list[str]:
    plain, whole, folds = runs
    lines = [f"### {title}", "", "| run | passes over the file | rows read / N | JSON passes | wall s | CPU s | other "
             "jobs' busy cores | T |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['calls']} | {r['reads']:.2f} | {r['passes']} | {r['seconds']:.2f} | {r['cpu']:.2f} "
              f"| {', '.join(f'{b:.1f}' for b in r['load'])} | {r['temperature']:.8f} |" for r in runs]
    for base in (plain, whole):
        extra = folds["calls"] - base["calls"]
        wall, cpu = folds["seconds"] / base["seconds"], folds["cpu"] / base["cpu"]
        verdict = "met" if extra <= 1 and min(wall, cpu) <= 3 else "MISSED"
        lines.append(f"\n`--folds 10` against {base['run']}: {extra:+d} passes (target <= +1; rows read "
                     f"{folds['reads'] - base['reads']:+.2f} N), {wall:.2f}x the wall time, {cpu:.2f}x the CPU time "
                     f"(target <= 3x): {verdict}.")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--classes", type=int, default=1_000)
    parser.add_argument("--head-rows", type=int, default=5_000)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--max-busy", type=float, default=0.5, help="wait before a run while other jobs keep more "
                        "cores busy than this")
    parser.add_argument("--wait-budget", type=float, default=300.0, help="seconds of waiting for quiet, in all")
    parser.add_argument("--results", type=Path, default=None, help="also write the tables to this Markdown file")
    args = parser.parse_args()
    torch.manual_seed(0)
    lines = [*machine_lines(), ""]
    counter = Counter()
    gate = QuietGate(args.max_busy, args.wait_budget)
    with tempfile.TemporaryDirectory(prefix="tempcal-folds-") as tmp, counter.installed():
        folder = Path(tmp)
        path = logits_file(folder, args.rows, args.classes)
        size = f"{args.rows:,} x {args.classes:,} float32 ({path.stat().st_size / 1e6:.0f} MB)"
        lines += table(f"{size}, in memory", measure(path, counter, "file", args.repeat, gate))
        os.environ["TEMPCAL_RESIDENT_BYTES"] = "0"
        try:
            lines += table(f"{size}, streamed from the file", measure(path, counter, "file", args.repeat, gate))
        finally:
            del os.environ["TEMPCAL_RESIDENT_BYTES"]
        hidden, head = head_files(folder, args.head_rows, args.width, args.vocab)
        lines += table(f"--head: N = {args.head_rows:,}, d = {args.width}, V = {args.vocab:,} (reads = h W^T "
                       "evaluations of every row)", measure(hidden, counter, "head", args.repeat, gate,
                                                                                  head=str(head)))
    text = "\n".join(lines)
    print(text)
    if args.results:
        command = "python benchmarks/folds_cost.py " + " ".join(sys.argv[1:])
        args.results.write_text(f"# benchmarks/folds_cost.py\n\nCommand: `{command.strip()}`\n\n```\n"
                                + "\n".join(machine_lines()) + "\n```\n\n" + "\n".join(lines[len(machine_lines()):])
                                + "\n")


if __name__ == "__main__":
    main()
