"""Streaming logits from a file to the GPU: how much of the copy and the read tempcal hides behind the reduction.

Writes a float32 logits file (default 2 GB, 32,000 classes) and times, with the chunk size tempcal picks:

- ``read``: the host filling every chunk into a pinned buffer (``pread`` from the page cache), no GPU;
- ``copy``: the host-to-device copies of those bytes from pinned memory alone (CUDA events);
- ``compute``: the objective pass over the same logits already on the GPU (no copy at all);
- ``pass``: tempcal's streamed objective pass over the file (read, copy and compute together).

Run one after the other the three stages take ``serial = read + copy + compute``; perfectly overlapped,
``ideal = max(read, copy, compute)``. The overlap achieved is the share of the hideable time
``serial - ideal`` that the streamed pass hid: ``(serial - pass) / (serial - ideal)`` (1 = perfect, 0 =
none, negative = slower than serial). Each figure is the median of ``--repeats`` runs after a warm-up.
Without CUDA it prints that it skipped and exits 0.

Run: ``python benchmarks/gpu_stream.py [--size-gb 2] [--classes 32000] [--json results.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_scaling import write_logits_file

import tempcal
from tempcal.core.data import as_logits_data
from tempcal.sources.safetensors import open_sharded


def _median(fn, repeats: int, device: torch.device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()  # warm-up: page cache, kernels, allocator
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stage_times(path: Path, repeats: int, device: torch.device) -> dict[str, float]:
    """Seconds of each stage alone and of the streamed pass, and the chunk size used (on the CPU: a dry run)."""
    data = open_sharded([path])[0]
    streamed = tempcal.Scan(data, device=device)
    rows, first = streamed.chunk_rows, data.shards[0]
    pinned = torch.empty(rows * first.row_bytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    target = torch.empty_like(pinned, device=device)

    def read() -> None:
        for n, fill in data._host_fills(rows):
            fill(pinned[: n * first.row_bytes].view(first.dtype).view(n, first.width))

    def copy() -> None:
        for start in range(0, data.num_samples, rows):
            n = min(rows, data.num_samples - start) * first.row_bytes
            target[:n].copy_(pinned[:n], non_blocking=True)

    logits = torch.cat([z for _, z, _ in data.chunks(rows, device, torch.float32)])
    resident = tempcal.Scan(as_logits_data(logits, data.labels.to(device)), device=device, chunk_rows=rows,
                            dtype=streamed.compute_dtype)
    figures = {"read": _median(read, repeats, device), "copy": _median(copy, repeats, device),
               "compute": _median(lambda: resident.objective(0.4), repeats, device),
               "pass": _median(lambda: streamed.objective(0.4), repeats, device)}
    figures["chunk_rows"] = rows
    return figures


def overlap(figures: dict[str, float]) -> tuple[float, float, float]:
    """(serial, ideal, the share of the hideable time hidden) from the stage times."""
    serial = figures["read"] + figures["copy"] + figures["compute"]
    ideal = max(figures["read"], figures["copy"], figures["compute"])
    hidden = (serial - figures["pass"]) / (serial - ideal) if serial > ideal else 1.0
    return serial, ideal, hidden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--classes", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_stream: skipped (no CUDA device)")
        return
    os.environ["TEMPCAL_RESIDENT_BYTES"] = "0"  # stream from the file, as inputs above 256 MiB are
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "logits.safetensors"
        rows = int(args.size_gb * 1e9 / (args.classes * 4))
        write_logits_file(path, rows, args.classes)
        gigabytes = rows * args.classes * 4 / 1e9
        figures = stage_times(path, args.repeats, torch.device("cuda"))
    serial, ideal, hidden = overlap(figures)
    print(f"{torch.cuda.get_device_name()}: {gigabytes:.2f} GB of float32 logits, {args.classes} classes, "
          f"chunk {figures['chunk_rows']} rows, median of {args.repeats}")
    for stage in ("read", "copy", "compute", "pass"):
        print(f"  {stage:8s} {figures[stage]:.3f} s  {gigabytes / figures[stage]:6.1f} GB/s")
    print(f"  serial {serial:.3f} s, perfectly overlapped {ideal:.3f} s, streamed pass {figures['pass']:.3f} s: "
          f"overlap {hidden:.0%} of the hideable time; the pass takes {figures['pass'] / ideal:.2f}x its slowest stage")
    if args.json:
        Path(args.json).write_text(json.dumps({**figures, "gigabytes": gigabytes, "serial": serial, "ideal": ideal,
                                               "overlap": hidden, "device": torch.cuda.get_device_name()}, indent=1))


if __name__ == "__main__":
    main()
