"""Where the time of one in-memory fit goes: its maps on the block pool, and the calling thread alone between them.

Runs ``tempcal.fit_temperature`` on ``fit_speed.make`` logits, warm (``--warm`` fits first), and times each
map of the block pool from the caller's side (its wall time, and how long after the map began each helper
thread started its first block) and the rest of the fit, which the calling thread runs alone (the checks of
each block, the fit's start from its sample, the certified search on the sums). Prints medians over
``--repeats`` fits, per size, on the default threads.

Run: ``python benchmarks/fit_timeline.py [--sizes 10000x100,50000x1000] [--repeats 30] [--warm 10]``
(``OMP_NUM_THREADS=1`` in front: one thread)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fit_speed import make

import tempcal
from tempcal.core import parallel


class MapClock:
    """Wraps the pool's ``map``: per fit, each map's wall time and each helper's delay to its first block."""

    def __init__(self) -> None:
        self.maps: list[float] = []
        self.helper_starts: list[float] = []
        self._map = parallel.BlockPool.map

    def install(self) -> None:
        clock, original = self, self._map

        def timed(pool, fn, count, threads):
            began = time.perf_counter()
            first: dict[int, float] = {}

            def block(i: int, worker: int):
                first.setdefault(worker, time.perf_counter() - began)
                return fn(i, worker)

            out = original(pool, block, count, threads)
            clock.maps.append(time.perf_counter() - began)
            clock.helper_starts.extend(v for w, v in first.items() if w > 0)
            return out

        parallel.BlockPool.map = timed  # type: ignore[method-assign]


def timeline(n: int, c: int, repeats: int, warm: int, clock: MapClock) -> dict[str, float]:
    z, y = make(n, c)
    for _ in range(warm):
        tempcal.fit_temperature(z, y, device="cpu")
    fits, maps, alone, counts, starts = [], [], [], [], []
    for _ in range(repeats):
        clock.maps.clear()
        clock.helper_starts.clear()
        began = time.perf_counter()
        tempcal.fit_temperature(z, y, device="cpu")
        total = time.perf_counter() - began
        fits.append(total)
        maps.append(sum(clock.maps))
        alone.append(total - sum(clock.maps))
        counts.append(len(clock.maps))
        starts.extend(clock.helper_starts)
    return {"fit": statistics.median(fits), "maps": statistics.median(maps), "alone": statistics.median(alone),
            "count": statistics.median(counts), "start": statistics.median(starts) if starts else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000x100,50000x1000")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warm", type=int, default=10)
    args = parser.parse_args()
    clock = MapClock()
    clock.install()
    print(f"torch threads: {torch.get_num_threads()} (TEMPCAL_THREADS: the CLI's setting, not read here); medians "
          f"over {args.repeats} warm fits")
    print("| size | fit ms | maps | in maps ms | caller alone ms | helper's first block after ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for size in args.sizes.split(","):
        n, c = (int(v) for v in size.split("x"))
        t = timeline(n, c, args.repeats, args.warm, clock)
        print(f"| {size} | {t['fit'] * 1e3:.2f} | {t['count']:.0f} | {t['maps'] * 1e3:.2f} | "
              f"{t['alone'] * 1e3:.2f} | {t['start'] * 1e3:.2f} |", flush=True)


if __name__ == "__main__":
    main()
