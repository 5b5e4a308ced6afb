"""How a pass reads its data: reads of rows, whose blocks the pass's threads take.

A read from a file is a chunk of logits of its own, cut into blocks. Logits already in memory (:class:`HeldRows`:
an array, a file kept resident, or rows selected from either) are not copied a read at a time on the calling
thread: each thread takes its own block's rows (a view when nothing needs copying, else gathered and converted
into that thread's buffer), so the copy is shared among the threads and a pass over many blocks is one map.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch

from .data import HeldRows, LogitsSource, to_device
from .threads import Scratch, read_rows


class Read(NamedTuple):
    """Rows ``start:start + rows`` of the data: their labels, and ``take(a, b, buffers)`` giving the logits of the
    read's rows ``a:b`` in the compute dtype (``buffers``: the calling thread's, or None for a tensor that may be
    kept)."""

    start: int
    rows: int
    labels: torch.Tensor
    take: Callable[[int, int, Scratch | None], torch.Tensor]


def held_rows(data: LogitsSource, device: torch.device) -> HeldRows | None:
    """The data's logits when they are in memory on ``device`` (its ``held_rows``), else None."""
    held = getattr(data, "held_rows", None)
    return None if held is None or data.binary else held(device)


def data_reads(data: LogitsSource, rows: int, device: torch.device, dtype: torch.dtype, held: HeldRows | None
               ) -> Iterator[Read]:
    """Reads of ``rows`` rows: blocks taken from ``held`` by the threads, else chunks read by ``data``."""
    if held is None:
        for start, z, y in data.chunks(rows, device, dtype):
            yield Read(start, int(z.shape[0]), y, _slicer(z))
        return
    labels = data.labels
    for start in range(0, data.num_samples, rows):
        stop = min(start + rows, data.num_samples)

        def take(a: int, b: int, buffers: Scratch | None, start: int = start) -> torch.Tensor:
            return held.block(start + a, start + b, dtype, buffers)

        yield Read(start, stop - start, to_device(labels[start:stop], device, torch.int64), take)


def pass_reads(data: LogitsSource, device: torch.device, dtype: torch.dtype, chunk_rows: int, threads: int, *,
               few: bool = False, row_bytes: int = 0, copies_kept: bool = False) -> tuple[Iterator[Read], bool]:
    """The reads of a block pass over ``data`` (:func:`tempcal.core.threads.read_rows` rows each) and whether a
    thread may take the next read while the others reduce this one (a file read).

    Logits in memory on the device are taken by the threads block by block, each copied (when it must be) into
    its thread's buffer; when the pass keeps a few numbers per block (``few``), one read may take every row.
    ``copies_kept``: the caller keeps the blocks until its read is done, so copies are tensors of their own.
    """
    held = held_rows(data, device)
    whole = held is not None and (few or (copies_kept and not held.copies(dtype)))
    rows = read_rows(chunk_rows, data.num_classes, threads, data.num_samples if whole else None, row_bytes)
    fresh = getattr(data, "fresh_chunks", None)
    ahead = held is None and bool(fresh is not None and fresh(device))
    return data_reads(data, rows, device, dtype, held), ahead


def _slicer(z: torch.Tensor) -> Callable[[int, int, Scratch | None], torch.Tensor]:
    def take(a: int, b: int, _: Scratch | None) -> torch.Tensor:
        return z[a:b]
    return take


__all__ = ["Read", "data_reads", "held_rows", "pass_reads"]
