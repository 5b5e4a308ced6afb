"""``torch.softmax`` against the fit's exp, row sum and division (``core.kernels``) on rows whose largest entry is 0.

For each shape, on one torch thread (as every block of a pass runs), times both into a reused output and prints
their microseconds, the ratio, and the largest relative difference of the probabilities.

Run: ``python benchmarks/softmax_rows.py [--shapes 1000x10,10000x10,5000x100,500x1000] [--repeats 300]``
"""

from __future__ import annotations

import argparse
import time

import torch

from tempcal.core.kernels import _softmax_of_shifted


def timed(fn, repeats: int) -> float:
    """Best of three runs of ``repeats`` calls, microseconds a call."""
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - start) / repeats * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1000x10,10000x10,5000x100,500x1000")
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    print("| rows x classes | torch.softmax us | exp, sum, divide us | softmax / ours | max relative difference |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for shape in args.shapes.split(","):
        rows, classes = (int(v) for v in shape.split("x"))
        z = 2.5 * torch.randn(rows, classes, generator=generator)
        x = z - z.amax(1, keepdim=True)
        out = torch.empty_like(x)
        theirs = timed(lambda x=x, out=out: torch.softmax(x, 1, out=out), args.repeats)
        ours = timed(lambda x=x, out=out: _softmax_of_shifted(x, out), args.repeats)
        reference = torch.softmax(x.double(), 1)
        difference = float(((_softmax_of_shifted(x, out).double() - reference).abs() / reference).max())
        print(f"| {shape} | {theirs:.1f} | {ours:.1f} | {theirs / ours:.2f}x | {difference:.1e} |", flush=True)


if __name__ == "__main__":
    main()
