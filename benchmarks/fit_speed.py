"""Time tempcal's fit against the floor of one bare logsumexp pass over the same logits.

Prints, per size: the fitted T and its error against scipy's bounded optimiser in float64,
the passes tempcal made, the median fit time over 3 runs, the floor (median of 3 chunked
``torch.logsumexp`` passes, the least any exact fit must read) and the fit time in floors.

Run: ``python benchmarks/fit_speed.py [--sizes 10000x100,50000x1000]``
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp

import tempcal


def make(n: int, c: int, scale: float = 2.5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g)
    y = torch.multinomial(torch.softmax(z.double(), 1), 1, generator=g)[:, 0]
    return (z * scale).contiguous(), y


def scipy_optimum(z: torch.Tensor, y: torch.Tensor, chunk: int = 4096) -> float:
    y = y.numpy()

    def nll(log_t: float) -> float:
        beta, total = math.exp(-log_t), 0.0
        for a in range(0, len(y), chunk):
            zz = z[a : a + chunk].double().numpy() * beta
            total += float(np.sum(logsumexp(zz, axis=1) - zz[np.arange(len(zz)), y[a : a + chunk]]))
        return total / len(y)

    return math.exp(minimize_scalar(nll, bounds=(-5, 5), method="bounded", options={"xatol": 1e-10}).x)


def floor_pass(z: torch.Tensor) -> float:
    rows = max(1, tempcal.core.data.CPU_CHUNK_ELEMENTS // z.shape[1])
    start = time.perf_counter()
    for a in range(0, z.shape[0], rows):
        torch.logsumexp(z[a : a + rows], 1)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000x100,50000x1000")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, tempcal {tempcal.__version__}")
    print(f"{'size':>14} {'T':>10} {'|T-T*|/T*':>10} {'passes':>6} {'fit s':>8} {'floor s':>8} {'floors':>7}")
    for size in args.sizes.split(","):
        n, c = (int(v) for v in size.split("x"))
        z, y = make(n, c)
        t_star = scipy_optimum(z, y)
        times, result = [], None
        for _ in range(args.repeats):
            start = time.perf_counter()
            result = tempcal.fit_temperature(z, y, device="cpu")
            times.append(time.perf_counter() - start)
        fit_s = statistics.median(times)
        floor_s = statistics.median(floor_pass(z) for _ in range(args.repeats))
        error = abs(result.temperature - t_star) / t_star
        print(f"{size:>14} {result.temperature:10.6f} {error:10.2e} {result.passes:6d} {fit_s:8.3f} "
              f"{floor_s:8.3f} {fit_s / floor_s:7.1f}")


if __name__ == "__main__":
    main()
