"""How many parallel regions a pass over in-memory logits makes, and the thread time they leave idle.

A block pass (``Scan.block_pass``) shares each read's row blocks among the threads and ends every read at a
barrier, where the thread done first waits for the other's last block. Over logits held in memory a read of
``few``-result passes takes every row (up to ``data.HELD_READ_ROWS``), so the pass is one map; this script
measures that against the bounded reads (8 blocks each on 2 threads) that every pass made before, in one
process, interleaved: maps per pass, idle thread time at the maps' ends (each thread's time from its last
block to the map's end), the pass's wall time; then torch's own threads on each chunk (the code before the
blocks) and one thread, as peers. The two block layouts must give the same bits (checked).

On a loaded machine the idle time and the wall time grow with the load (a parked thread's last block ends
late); the count of maps does not, and the comparison is within one run.

Run: ``python benchmarks/pass_regions.py [--size 50000x1000] [--repeats 20]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from tempcal.core import data as data_module
from tempcal.core import parallel
from tempcal.core.data import as_logits_data
from tempcal.core.kernels import FIELDS, row_cumulants
from tempcal.core.scan import ALL_ROWS, Scan

BETA = 0.25


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="50000x1000")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    n, c = (int(v) for v in args.size.split("x"))
    g = torch.Generator().manual_seed(0)
    z = 3 * torch.randn(n, c, generator=g)
    y = torch.randint(0, c, (n,), generator=g)
    scan = Scan(as_logits_data(z, y), device="cpu", fit_rows=ALL_ROWS)
    maps: list[float] = []
    timed_map = parallel.BlockPool.map

    def counted(self, fn, count, workers):
        ends: dict[int, float] = {}

        def block(i, worker):
            result = fn(i, worker)
            ends[worker] = time.perf_counter()
            return result

        start = time.perf_counter()
        out = timed_map(self, block, count, workers)
        stop = time.perf_counter()
        maps.append(sum(stop - e for e in ends.values()) + (min(workers, count) - len(ends)) * (stop - start))
        return out

    parallel.BlockPool.map = counted  # type: ignore[method-assign]
    bounded = data_module.read_rows

    def pass_with(held: bool):
        data_module.read_rows = bounded if held else (lambda rows, classes, t, *_: bounded(rows, classes, t))
        maps.clear()
        start = time.perf_counter()
        sums = scan.objective(BETA)
        return time.perf_counter() - start, len(maps), sum(maps), sums

    def torch_threads():
        start = time.perf_counter()
        acc = torch.zeros(len(FIELDS), dtype=torch.float64)
        neginf = scan.stats.has_neginf
        for at, zc, yc in scan.data.chunks(scan.chunk_rows, scan.device, scan.compute_dtype):
            rows = slice(at, at + zc.shape[0])
            acc += row_cumulants(zc, yc, BETA, scan.scratch, top=scan.stats.row_max[rows],
                                 impossible=bool(neginf[rows].any()))
        return time.perf_counter() - start

    def one_thread():
        with parallel.single_threaded():
            return pass_with(True)[0]

    runs: dict[str, list] = {"bounded reads": [], "one read": [], "torch's threads": [], "one thread": []}
    for _ in range(args.repeats):
        runs["bounded reads"].append(pass_with(False))
        runs["one read"].append(pass_with(True))
        runs["torch's threads"].append((torch_threads(),))
        runs["one thread"].append((one_thread(),))
    assert runs["bounded reads"][0][3] == runs["one read"][0][3], "the two layouts' sums differ"
    print(f"objective pass at {n:,} x {c:,} float32 in memory, {torch.get_num_threads()} threads, "
          f"{args.repeats} repeats, load {os.getloadavg()[0]:.1f}")
    for name, values in runs.items():
        wall = [v[0] for v in values]
        line = f"  {name:16s} wall min {min(wall) * 1e3:7.1f} ms, median {statistics.median(wall) * 1e3:7.1f} ms"
        if len(values[0]) > 1:
            idle = statistics.median(v[2] for v in values) * 1e3
            line += f"; maps/pass {values[0][1]}, idle thread time at map ends (median) {idle:.1f} ms"
        print(line)


if __name__ == "__main__":
    main()
