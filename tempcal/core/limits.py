"""Bounds on the sizes users choose, checked before anything is allocated: bad input, not an allocator's failure.

Each size-like option (``--bins``, ``--bootstrap``, ``--chunk-rows``, ``--batch-size``) is cut to the row count and
refused by :func:`check_fits` when it would not fit the memory free (CUDA: the driver's figure plus torch's unused
cache; CPU: ``MemAvailable`` within the control group's limit, shared by this node's torchrun processes).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..errors import TempcalError, param

#: Bytes a reduction holds per logit of a chunk: the chunk in the compute dtype and about three temporaries
#: (exponentials, a scaled copy, the source block), in float64 at worst.
CHUNK_BYTES_PER_LOGIT = 4 * 8
#: Bytes a model batch holds per input value before the model's own activations: the slice read and its copy.
BATCH_BYTES_PER_VALUE = 2 * 8


def available_bytes(device: torch.device | str) -> int | None:
    """Bytes this process may still allocate on ``device``; None when it cannot be told."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + max(cached, 0))
    found = [n for n in (_meminfo_available(), _cgroup_available()) if n is not None]
    return min(found) // max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1) if found else None


def shown_bytes(n: float) -> str:
    """A byte count for messages: ``512 MB``, ``3.2 GB``."""
    if n >= 1e9:
        return f"{n / 1e9:.1f} GB"
    if n >= 1e6:
        return f"{n / 1e6:.0f} MB"
    return f"{n / 1e3:.0f} kB"


def check_fits(option: str, value: int, unit_bytes: int, device: torch.device | str, what: str) -> None:
    """Refuse ``option value`` when ``value * unit_bytes`` exceed the memory free on ``device``; the message names
    the need, what is free, and the largest value that fits."""
    free = available_bytes(device)
    need = value * unit_bytes
    if free is None or need <= free:
        return
    largest = free // max(unit_bytes, 1)
    raise TempcalError(f"{param(option)} {value}: {what} needs about {shown_bytes(need)} on {torch.device(device)}, "
                       f"more than the {shown_bytes(free)} free; at most {largest} fits")


def bounded_chunk_rows(chunk_rows: int, num_samples: int, num_classes: int, device: torch.device) -> int:
    """``--chunk-rows`` cut to the rows there are, and refused when one chunk would not fit in memory."""
    rows = max(1, min(int(chunk_rows), int(num_samples)))
    check_fits("chunk_rows", rows, num_classes * CHUNK_BYTES_PER_LOGIT, device,
               f"a chunk of {rows} rows of {num_classes} logits")
    return rows


def bounded_batch_size(batch_size: int, num_samples: int, row_values: int, device: torch.device | str) -> int:
    """``--batch-size`` cut to the rows there are, and refused when one batch's inputs would not fit."""
    rows = max(1, min(int(batch_size), int(num_samples)))
    check_fits("batch_size", rows, max(row_values, 1) * BATCH_BYTES_PER_VALUE, device,
               f"a model batch of {rows} rows of {row_values} input values (before the model's own memory)")
    return rows


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _cgroup_available() -> int | None:
    """The control group's memory limit minus its usage (cgroup v2, then v1), when a limit is set."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit_text = Path(limit_file).read_text().strip()
            if limit_text == "max":
                return None
            limit, usage = int(limit_text), int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit >= 1 << 60:  # cgroup v1 writes "no limit" as a huge number
            return None
        return max(limit - usage, 0)
    return None


__all__ = ["available_bytes", "bounded_batch_size", "bounded_chunk_rows", "check_fits", "shown_bytes"]
