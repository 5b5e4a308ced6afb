"""Time the bootstrap: one per-sample pass over the logits, then the vectorised resampling.

Prints the seconds (median of ``--repeats`` runs) of the validating scan, the per-sample pass
(confidence, correctness, NLL) and the resampling (seeded multinomial counts times a fixed matrix of
per-sample figures), the intervals, and what re-running the per-sample pass for every resample would
cost instead (resamples x one pass).

Run: ``python benchmarks/bootstrap_speed.py [--size 50000x1000] [--resamples 1000]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import tempcal
from tempcal.metrics.bootstrap import bootstrap_intervals


def make(n: int, c: int, scale: float = 2.5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g)
    y = torch.multinomial(torch.softmax(z.double(), 1), 1, generator=g)[:, 0]
    return (z * scale).contiguous(), y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="50000x1000", help="NxC logits (float32)")
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--tau", type=float, default=2.5)
    parser.add_argument("--bins", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n, c = (int(v) for v in args.size.split("x"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, tempcal {tempcal.__version__}; "
          f"{n} x {c} float32 logits, {args.resamples} resamples, tau {args.tau}, {args.bins} bins")
    z, y = make(n, c, seed=args.seed)

    def timed(job):
        """Median seconds over the repeats, and the last result."""
        times, result = [], None
        for _ in range(args.repeats):
            start = time.perf_counter()
            result = job()
            if torch.device(args.device).type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times), result

    scan_s, scan = timed(lambda: tempcal.Scan(tempcal.as_logits_data(z, y), device=args.device))
    pass_s, stats = timed(lambda: scan.per_sample(1.0 / args.tau))
    resample_s, intervals = timed(lambda: bootstrap_intervals(stats["confidence"], stats["correct"], stats["nll"],
                                                              args.resamples, args.seed, args.bins))

    point = tempcal.evaluate(scan, args.tau, bins=args.bins)
    print(f"validating scan      {scan_s:8.3f} s")
    print(f"per-sample pass      {pass_s:8.3f} s")
    print(f"resampling           {resample_s:8.3f} s   ({resample_s / args.resamples * 1e3:.2f} ms per resample)")
    print(f"bootstrap total      {pass_s + resample_s:8.3f} s   (a pass per resample instead: "
          f"~{pass_s * args.resamples:.0f} s)")
    print(f"ECE {point.ece:.5f}  95% [{intervals['ece'][0]:.5f}, {intervals['ece'][1]:.5f}]")
    print(f"NLL {point.nll:.5f}  95% [{intervals['nll'][0]:.5f}, {intervals['nll'][1]:.5f}]")


if __name__ == "__main__":
    main()
