"""Streaming logits from a file to the GPU: tempcal's reduction throughput against the device's copy bandwidth.

Writes a float32 logits file (default 2 GB, 32,000 classes), measures the host-to-device copy
bandwidth of a pinned buffer (the ceiling for any streaming pass), then times tempcal's
passes over the file on CUDA (the file is in the page cache after the first pass) and prints
GB/s of both and their ratio. Without CUDA it prints that it skipped and exits 0.

Run: ``python benchmarks/gpu_stream.py [--size-gb 2] [--classes 32000]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_scaling import write_logits_file

import tempcal
from tempcal.sources.safetensors import open_sharded


def copy_bandwidth(nbytes: int, repeats: int = 5) -> float:
    """GB/s of pinned host -> device copies of ``nbytes``."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return repeats * nbytes / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--classes", type=int, default=32000)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_stream: skipped (no CUDA device)")
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "logits.safetensors"
        rows = int(args.size_gb * 1e9 / (args.classes * 4))
        write_logits_file(path, rows, args.classes)
        gigabytes = rows * args.classes * 4 / 1e9
        scan = tempcal.Scan(open_sharded([path]), device="cuda")
        scan.objective(0.5)  # warm the page cache and the kernels
        torch.cuda.synchronize()
        start = time.perf_counter()
        passes = 3
        for beta in (0.3, 0.4, 0.5):
            scan.objective(beta)
        torch.cuda.synchronize()
        stream = passes * gigabytes / (time.perf_counter() - start)
        ceiling = copy_bandwidth(scan.chunk_rows * args.classes * 4)
        result = tempcal.fit_temperature(scan)
        print(f"{torch.cuda.get_device_name()}: {gigabytes:.2f} GB of float32 logits, chunk {scan.chunk_rows} rows")
        print(f"pinned host->device copy {ceiling:.1f} GB/s; tempcal pass {stream:.1f} GB/s "
              f"({stream / ceiling:.0%} of the copy bandwidth); fit T = {result.temperature:.6f} "
              f"in {result.passes} passes")


if __name__ == "__main__":
    main()
