"""Passes and time of the ECE-minimising search (``tempcal fit --objective ece``) in two shapes.

Two searches run on each data set, in this process, one after the other, on the same validated
:class:`tempcal.Scan` and around the same NLL optimum T*:

* ``2 pieces``: the bound of :mod:`tempcal.core.ece_fit` in the first shipped search's shape (65 points over
  T*/100..T*x100, each open interval halved per round: ``max_pieces=2``);
* ``new``: the defaults (``INITIAL_POINTS`` points, up to ``MAX_PIECES`` pieces a round).

Each line gives the passes over the data, the temperatures evaluated, the best of ``--repeat`` wall times, and
the T and ECE found (both are certified to ``tol`` = 1e-4 on ECE over the same range). A last line per data
set times one pass of the search at 1 and at 65 temperatures: a temperature costs about what the pass itself does.

Run: ``python benchmarks/ece_fit_passes.py [--sizes 10000x100,100000x10] [--threads 1] [--repeat 3]``
(the shipped example ``examples/digits_logits.safetensors`` always comes first).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

import tempcal
from tempcal.core import ece_fit
from tempcal.core.ece_fit import bin_sums
from tempcal.core.scan import Scan

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "digits_logits.safetensors"
BINS = 15


def counting(counted: list[int]) -> Callable:
    """``bin_sums`` that also counts the temperatures it evaluates."""
    def counted_sums(scan: Scan, betas, bins: int) -> torch.Tensor:
        counted[0] += len(betas)
        return bin_sums(scan, betas, bins)
    return counted_sums


def run(name: str, scan: Scan, centre: float, repeat: int) -> None:
    searches = {
        "2 pieces": lambda counted: ece_fit.minimise_ece(scan, centre, bins=BINS, initial_points=65, max_pieces=2),
        "new": lambda counted: ece_fit.minimise_ece(scan, centre, bins=BINS),
    }
    for label, search in searches.items():
        seconds = math.inf
        for _ in range(repeat):
            counted = [0]
            ece_fit.bin_sums = counting(counted)  # type: ignore[assignment]
            passes, start = scan.passes, time.perf_counter()
            temperature, ece, certified = search(counted)
            seconds = min(seconds, time.perf_counter() - start)
            passes = scan.passes - passes
        ece_fit.bin_sums = bin_sums  # type: ignore[assignment]
        print(f"{name:>18} {label:>9} {passes:>6} {counted[0]:>6} {seconds:>8.3f}  T {temperature:.6f}"
              f"  ECE {ece:.6f}  certified {certified}", flush=True)
    one, many = (min(_pass_seconds(scan, k) for _ in range(repeat)) for k in (1, 65))
    print(f"{name:>18} one pass of the search at 1 temperature: {1000 * one:.2f} ms; at 65: {1000 * many:.1f} ms"
          f" ({1000 * many / 65:.2f} ms per temperature)")


def _pass_seconds(scan: Scan, temperatures: int) -> float:
    start = time.perf_counter()
    bin_sums(scan, [math.exp(-k / temperatures) for k in range(temperatures)], BINS)
    return time.perf_counter() - start


def synthetic(rows: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded overconfident float32 logits: labels drawn at half the logits' scale."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(rows, classes, generator=g) * 3
    return z, torch.multinomial(torch.softmax(z.double() / 2, 1), 1, generator=g)[:, 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000x100", help="ROWSxCLASSES synthetic sets, comma-separated")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from safetensors.torch import load_file

    example = load_file(EXAMPLE)
    sets = [("digits example", example["logits"], example["labels"])]
    for size in filter(None, args.sizes.split(",")):
        rows, classes = (int(x) for x in size.lower().split("x"))
        sets.append((f"{rows}x{classes}", *synthetic(rows, classes)))
    print(f"{'data':>18} {'search':>9} {'passes':>6} {'temps':>6} {'seconds':>8}")
    for name, logits, labels in sets:
        scan = tempcal.Scan(tempcal.as_logits_data(logits, labels), device="cpu")
        centre = tempcal.fit_temperature(scan).temperature
        run(name, scan, centre, args.repeat)


if __name__ == "__main__":
    main()
