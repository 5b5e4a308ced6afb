"""A language model's final hidden states, written once by the forward pass and read by every later pass: in memory
within :func:`memory_budget`, else in an unnamed temporary file that disappears with the process however it ends.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..core.data import default_chunk_rows, to_device
from ..core.limits import available_bytes, shown_bytes
from ..errors import TempcalError
from ..io.paths import write_atomic
from ..io.safetensors_header import dtype_code, encode_header, laid_out
from ..progress import DELAY, Progress

#: The most bytes of hidden states kept in memory by default (besides a share of the memory available).
MEMORY_CAP = 4 << 30
#: Environment variable that sets the budget in bytes (0: always spill to a file).
BUDGET_ENV = "TEMPCAL_LM_MEMORY_BYTES"
#: Bytes written to a saved file at a time.
WRITE_ROWS_BYTES = 64 << 20


def memory_budget() -> int:
    """Bytes of hidden states kept in memory: ``TEMPCAL_LM_MEMORY_BYTES``, else a quarter of the memory available,
    at most :data:`MEMORY_CAP`."""
    text = os.environ.get(BUDGET_ENV, "").strip()
    if text:
        try:
            return max(int(text), 0)
        except ValueError:
            raise TempcalError(f"{BUDGET_ENV}={text!r}: expected a whole number of bytes") from None
    free = available_bytes("cpu")
    return MEMORY_CAP if free is None else min(MEMORY_CAP, free // 4)


class HiddenStore:
    """Rows ``[lo, hi)`` of ``[N, width]`` hidden states, in memory or in an unnamed temporary file in ``folder``."""

    def __init__(self, lo: int, hi: int, width: int, dtype: torch.dtype, *, budget: int, folder: Path | None):
        self.lo, self.hi, self.width, self.dtype = lo, hi, width, dtype
        self.row_bytes = width * torch.empty((), dtype=dtype).element_size()
        self.nbytes = (hi - lo) * self.row_bytes
        self.folder = folder
        in_memory = self.nbytes <= budget
        self._tensor: torch.Tensor | None = torch.empty(hi - lo, width, dtype=dtype) if in_memory else None
        self._file = None if in_memory else _unnamed_file(folder, self.nbytes)

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def write(self, start: int, rows: torch.Tensor) -> None:
        """Store ``rows`` (on any device) as global rows ``start, start + 1, ...``."""
        rows = rows.detach().to("cpu", self.dtype).contiguous()
        first = start - self.lo
        if self._tensor is not None:
            self._tensor[first : first + rows.shape[0]] = rows
            return
        assert self._file is not None
        _write_all(self._file.fileno(), memoryview(rows.view(torch.uint8).numpy().data).cast("B"),
                   first * self.row_bytes, self.folder)

    def tensor(self) -> torch.Tensor:
        """The stored rows ``[hi - lo, width]`` (the file mapped read-only once the forward pass is done)."""
        if self._tensor is None:
            assert self._file is not None
            mapped = mmap.mmap(self._file.fileno(), self.nbytes, access=mmap.ACCESS_COPY)
            self._tensor = torch.frombuffer(mapped, dtype=self.dtype).view(self.hi - self.lo, self.width)
        return self._tensor


def _unnamed_file(folder: Path | None, nbytes: int):
    """A temporary file without a name, in ``folder`` (else the system's temporary folder), ``nbytes`` reserved."""
    where = folder if folder is not None else Path(tempfile.gettempdir())
    try:
        f = tempfile.TemporaryFile(dir=where)  # noqa: SIM115 - kept open for the store's life
    except OSError as exc:
        raise TempcalError(f"cannot create a temporary file in {where} for the hidden states ({exc.strerror or exc}); "
                           "name a writable folder with --spill-dir") from None
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(f.fileno(), 0, nbytes)
        else:  # pragma: no cover - not POSIX
            f.truncate(nbytes)
    except OSError as exc:
        f.close()
        raise TempcalError(f"{where}: cannot reserve {shown_bytes(nbytes)} for the hidden states "
                           f"({exc.strerror or exc}); free space there, name another folder with --spill-dir, "
                           "or lower --max-length") from None
    return f


def _write_all(fd: int, data: memoryview, offset: int, folder: Path | None) -> None:
    while data:
        try:
            n = os.pwrite(fd, data, offset)
        except OSError as exc:
            raise TempcalError(f"{folder or tempfile.gettempdir()}: cannot write the hidden states "
                               f"({exc.strerror or exc})") from None
        data, offset = data[n:], offset + n


class StoredHidden:
    """Rows of a :class:`HiddenStore` and their labels, read in chunks: what ``HeadLogits`` takes as hidden states;
    ``rows`` (global row indices, sorted) restricts it to a selection, every row of which must lie in the store."""

    def __init__(self, store: HiddenStore, labels: torch.Tensor, rows: torch.Tensor | None = None,
                 progress: Any = None):
        self.store = store
        self.all_labels = labels
        self.rows = rows
        self.labels = labels if rows is None else labels[rows]
        self.progress = progress  # a PassCounter: a bar for each long pass

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    @property
    def dtype(self) -> torch.dtype:
        return self.store.dtype

    def original_index(self, i: int) -> int:
        return i if self.rows is None else int(self.rows[i])

    def select(self, rows: torch.Tensor) -> StoredHidden:
        rows = torch.as_tensor(rows, dtype=torch.int64)
        return StoredHidden(self.store, self.all_labels, rows if self.rows is None else self.rows[rows], self.progress)

    def default_chunk_rows(self, device: torch.device) -> int:
        return default_chunk_rows(self.store.width, device)

    def chunks(self, chunk_rows: int, device: torch.device, dtype: torch.dtype
               ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """``(position, hidden, labels)`` per chunk of ``chunk_rows`` selected rows (or fewer), on ``device``."""
        counter = self.progress
        with counter.bar(self.num_samples) if counter is not None else DelayedBar("", 0, "", enabled=False) as bar:
            for position, block in self._blocks(max(1, int(chunk_rows))):
                labels = self.labels[position : position + block.shape[0]]
                yield position, to_device(block, device, dtype), to_device(labels, device, torch.int64)
                bar.advance(block.shape[0])

    def _blocks(self, chunk_rows: int) -> Iterator[tuple[int, torch.Tensor]]:
        """``(position, rows)`` of the store on the host, ``chunk_rows`` selected rows at a time."""
        data, lo = self.store.tensor(), self.store.lo
        gathered = None
        for position in range(0, self.num_samples, chunk_rows):
            stop = min(position + chunk_rows, self.num_samples)
            if self.rows is None:
                block = data[position - lo : stop - lo] if lo == 0 else self._outside(position)
            else:
                index = self.rows[position:stop] - lo
                if bool((index < 0).any()) or bool((index >= data.shape[0]).any()):
                    self._outside(int(self.rows[position]))
                if gathered is None:  # one buffer for every chunk: the caller is done with a chunk when it asks again
                    gathered = torch.empty(chunk_rows, data.shape[1], dtype=data.dtype)
                block = torch.index_select(data, 0, index, out=gathered[: stop - position])
            yield position, block

    def _outside(self, row: int) -> torch.Tensor:
        raise RuntimeError(f"hidden-state row {row} was not computed by this process (rows {self.store.lo}.."
                           f"{self.store.hi - 1})")


def save_hidden(path: str | os.PathLike, hidden: StoredHidden, metadata: dict[str, str]) -> Path:
    """Write every row of ``hidden`` (all rows: not a torchrun rank's share) as a safetensors file, atomically:
    ``hidden`` [N, d] in the model's dtype and ``labels`` [N] int64, with ``metadata``."""
    store = hidden.store
    rows, width = hidden.num_samples, store.width
    header = encode_header(laid_out([("hidden", dtype_code(store.dtype), (rows, width)), ("labels", "I64", (rows,))]),
                           metadata)
    per_block = max(1, WRITE_ROWS_BYTES // max(store.row_bytes, 1))

    def write(f) -> None:
        f.write(header)
        for _, block, _ in hidden.chunks(per_block, torch.device("cpu"), store.dtype):
            f.write(memoryview(block.contiguous().view(torch.uint8).numpy().data).cast("B"))
        f.write(memoryview(hidden.labels.to(torch.int64).contiguous().numpy().data).cast("B"))

    return write_atomic(path, write, what="--save-hidden")


class DelayedBar(Progress):
    """``with DelayedBar("running MODEL", total, "tokens", enabled=...) as bar: ... bar.advance(n)``."""

    def __init__(self, description: str, total: int, unit: str, *, enabled: Any = True, delay: float = DELAY):
        super().__init__(description, enabled=enabled, delay=delay, total=total, unit=unit)


class PassCounter:
    """Counts the passes over a language model's rows and shows a delayed bar for each (``enabled`` as above)."""

    def __init__(self, name: str, enabled: Any):
        self.name, self.enabled, self.passes = name, enabled, 0

    def bar(self, rows: int) -> DelayedBar:
        self.passes += 1
        return DelayedBar(f"{self.name}: pass {self.passes} over the rows", rows, "rows", enabled=self.enabled)


__all__ = ["DELAY", "DelayedBar", "HiddenStore", "PassCounter", "StoredHidden", "memory_budget", "save_hidden"]
