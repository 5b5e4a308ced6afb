"""Memory per row of the ECE-minimising search (``tempcal fit --objective ece``), beside its T, passes and time.

Each size runs in a fresh process: seeded float32 logits in memory, one validating :class:`tempcal.Scan`,
then :func:`tempcal.core.ece_fit.minimise_ece` around T = 2. It reports what the search adds to the
process's peak memory, per row: on the CPU the rise of the peak resident set (``VmHWM``, reset after the
scan through ``/proc/self/clear_refs``), on CUDA ``torch.cuda.max_memory_allocated`` above what the scan
holds. The logits, the scan's per-row numbers and the chunk buffers are not counted.

Run: ``python benchmarks/ece_fit_memory.py [--sizes 100000x10,400000x10] [--device cpu] [--threads 1]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
from pathlib import Path
import torch
import tempcal
from tempcal.core.ece_fit import minimise_ece

n, c, device, threads = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(0)
z = torch.randn(n, c, generator=g)
y = torch.multinomial(torch.softmax(z.double(), 1), 1, generator=g)[:, 0]
scan = tempcal.Scan(tempcal.as_logits_data((2.0 * z).contiguous(), y), device=device)
scan.calibration([0.5], 15)  # chunk buffers exist before the baseline


def peak_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


if device.startswith("cuda"):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
else:
    Path("/proc/self/clear_refs").write_text("5")
    base = peak_kb() * 1024
passes, start = scan.passes, time.perf_counter()
temperature, ece, certified = minimise_ece(scan, 2.0, bins=15)
seconds = time.perf_counter() - start
peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else peak_kb() * 1024
print(json.dumps({"rows": n, "classes": c, "device": device, "T": temperature, "ece": ece, "certified": certified,
                  "passes": scan.passes - passes, "seconds": seconds, "bytes_per_row": (peak - base) / n}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000x10,400000x10", help="ROWSxCLASSES, comma-separated")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(f"{'rows':>9} {'classes':>7} {'bytes/row':>10} {'passes':>6} {'seconds':>8}  T")
    for size in args.sizes.split(","):
        rows, classes = (int(x) for x in size.lower().split("x"))
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", CHILD, str(rows), str(classes), args.device, str(args.threads)],
                              capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
        if done.returncode != 0:
            sys.exit(done.stderr[-2000:])
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{r['rows']:>9} {r['classes']:>7} {r['bytes_per_row']:>10.1f} {r['passes']:>6} {r['seconds']:>8.2f}"
              f"  {r['T']:.9g} (ECE {r['ece']:.6f}, certified {r['certified']}; {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
