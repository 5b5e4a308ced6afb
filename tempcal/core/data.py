"""The in-memory form of a classifier's outputs: logits, labels, how to read them in chunks, and how chunks move
between the host and a CUDA device without reading a buffer before its copy lands.

A pass reads logits already in memory (:class:`HeldRows`: an array, a file kept resident, rows selected from
either) block by block on its threads, each gathering and converting its own block into its buffer: the copy is
shared among the threads and a pass over many blocks is one map (:func:`pass_reads`).

:func:`to_device` copies asynchronously only from pinned host memory toward CUDA (toward the host a non-blocking
copy returns before the bytes arrive). :class:`PinnedStager` fills one pinned buffer while the other is copied on a
side stream, refilling a buffer only after its copy's event has completed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch

from ..errors import IGNORE_INDEX, DataError, check_labels, param
from .parallel import BLOCKS_PER_THREAD, Scratch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: Rows of every reduction step are cut so that one chunk holds about this many logits.
CPU_CHUNK_ELEMENTS = 1 << 19
CUDA_CHUNK_ELEMENTS = 1 << 26
#: The most logits a CPU chunk grows to on data large enough (see :func:`default_chunk_rows`).
CPU_LARGE_CHUNK_ELEMENTS = 1 << 20
CPU_MIN_CHUNKS = 8
#: Fewer rows than this per chunk leave wide rows (large vocabularies) reduced inefficiently.
MIN_CHUNK_ROWS = 64


def default_chunk_rows(num_classes: int, device: torch.device, rows: int | None = None) -> int:
    """About 512K logits per chunk on CPU (cache-sized), 64M on CUDA; never fewer than MIN_CHUNK_ROWS rows.

    On CPU, with ``rows`` known, a chunk grows up to CPU_LARGE_CHUNK_ELEMENTS while the data still makes
    CPU_MIN_CHUNKS of them: each chunk is one thread's block, and at 512K logits a block's fixed costs showed
    (a fit on 50,000 x 1,000 took 0.31 s against 0.26 s at 2M; 1M fits as fast as 2M with half the buffers). It
    depends on the data alone, never on the thread count, so every thread count adds the same blocks."""
    if device.type == "cuda":
        return max(MIN_CHUNK_ROWS, CUDA_CHUNK_ELEMENTS // num_classes)
    small = CPU_CHUNK_ELEMENTS // num_classes
    if rows is not None and rows > 0:
        small = max(MIN_CHUNK_ROWS, min(CPU_LARGE_CHUNK_ELEMENTS // num_classes, max(small, rows // CPU_MIN_CHUNKS)))
        chunks = -(-rows // small)
        return max(MIN_CHUNK_ROWS, -(-rows // chunks))  # chunks of equal size, so no thread waits on a long last one
    return max(MIN_CHUNK_ROWS, small)


#: Inputs with at most this many logits, or fewer rows than FLOAT64_BELOW_ROWS, are reduced in
#: float64 whatever their dtype. Float32 rounding in the gradient averages out over many rows
#: (T within 1e-7 from about a thousand rows on); over a few dozen rows a nearly flat NLL can
#: leave T off by 1e-5, while float64 costs little there.
FLOAT64_UP_TO = 1 << 18
FLOAT64_BELOW_ROWS = 1000


def compute_dtype(dtype: torch.dtype, numel: int = 0, rows: int | None = None) -> torch.dtype:
    """float64 for float64 input and for small inputs; float32 otherwise (never half precision)."""
    small = numel <= FLOAT64_UP_TO or (rows is not None and rows < FLOAT64_BELOW_ROWS)
    return torch.float64 if dtype == torch.float64 or small else torch.float32


class LogitsSource(Protocol):
    """What a reduction needs of its data: in memory (:class:`LogitsData`) or read in chunks (``ShardedLogits``)."""

    @property
    def labels(self) -> torch.Tensor: ...

    @property
    def binary(self) -> bool: ...

    @property
    def num_samples(self) -> int: ...

    @property
    def num_classes(self) -> int: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def numel(self) -> int: ...

    def original_index(self, i: int) -> int: ...

    def select(self, rows: torch.Tensor) -> Any: ...

    def default_chunk_rows(self, device: torch.device) -> int: ...

    def chunks(self, chunk_rows: int, device: torch.device, dtype: torch.dtype
               ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]: ...


@dataclass(frozen=True)
class HeldRows:
    """Logits [N, C] in memory on the pass's device and the selected ``rows`` among them (None: every row)."""

    logits: torch.Tensor
    rows: torch.Tensor | None = None

    def copies(self, dtype: torch.dtype) -> bool:
        """Whether a block must be copied (rows to gather, or a dtype to convert) rather than viewed."""
        return self.rows is not None or self.logits.dtype != dtype

    def block(self, start: int, stop: int, dtype: torch.dtype, buffers: Scratch | None = None) -> torch.Tensor:
        """The selected rows ``start:stop`` in ``dtype``: a view, or a copy into ``buffers``' ``rows`` buffer (a
        tensor of its own when ``buffers`` is None)."""
        logits = self.logits
        if self.rows is None:
            view = logits[start:stop]
            if view.dtype == dtype:
                return view
            return view.to(dtype) if buffers is None else buffers.get("rows", tuple(view.shape), dtype,
                                                                          view.device).copy_(view)
        index = self.rows[start:stop].to(logits.device)
        if buffers is None or logits.dtype != dtype:
            return logits.index_select(0, index).to(dtype)
        out = buffers.get("rows", (index.shape[0], logits.shape[1]), dtype, logits.device)
        return torch.index_select(logits, 0, index, out=out)


@dataclass(frozen=True)
class LogitsData:
    """Logits ``[N, C]`` (or ``[N]`` for one binary logit) and integer labels ``[N]``.

    ``index`` maps each row back to its index in the file it came from, so that
    errors name the user's row, not a row of a split.
    """

    logits: torch.Tensor
    labels: torch.Tensor
    index: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # Every in-memory input passes here: logits that require grad (a notebook's model outputs) are measured,
        # never differentiated, and the in-place reductions of a scan refuse them.
        if self.logits.requires_grad:
            object.__setattr__(self, "logits", self.logits.detach())

    @property
    def binary(self) -> bool:
        return self.logits.dim() == 1

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    @property
    def dtype(self) -> torch.dtype:
        return self.logits.dtype

    def numel(self) -> int:
        return self.logits.numel()

    @property
    def num_classes(self) -> int:
        return 2 if self.binary else int(self.logits.shape[1])

    def original_index(self, i: int) -> int:
        return i if self.index is None else int(self.index[i])

    def select(self, rows: torch.Tensor) -> LogitsData:
        """A copy holding only ``rows`` (indices into this data)."""
        index = rows if self.index is None else self.index[rows]
        return LogitsData(self.logits[rows], self.labels[rows], index)

    def default_chunk_rows(self, device: torch.device) -> int:
        return default_chunk_rows(self.num_classes, device, self.num_samples)

    def held_rows(self, device: torch.device) -> HeldRows | None:
        """The logits, for a pass's threads to take their blocks from, when they are on ``device``."""
        return HeldRows(self.logits) if self.logits.device == device else None

    def chunks(self, chunk_rows: int, device: torch.device, dtype: torch.dtype
               ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """Yield ``(start, logits, labels)`` row chunks on ``device`` in ``dtype``.

        A single binary logit ``z`` becomes the two-class row ``[0, z]``, which has the
        same softmax as ``sigmoid``, so every reduction is written once.
        """
        for start in range(0, self.num_samples, chunk_rows):
            z = to_device(self.logits[start : start + chunk_rows], device, dtype)
            y = to_device(self.labels[start : start + chunk_rows], device, torch.int64)
            if self.binary:
                z = torch.stack([torch.zeros_like(z), z], dim=1)
            yield start, z, y


def as_logits_data(logits, labels, *, probs: bool | None = False, logits_name: str = "logits",
                   labels_name: str = "labels", ignore_index: int | None = IGNORE_INDEX) -> LogitsData:
    """Check shapes and dtypes of user tensors (or arrays) and wrap them; values are checked by the first scan.

    Token-level logits ``[B, L, V]`` with labels ``[B, L]`` become ``B * L`` rows; rows whose label is
    ``ignore_index`` (default -100, as in ``torch.nn.functional.cross_entropy``) are left out. ``probs``
    (True) reads probabilities as log-probabilities; False and None read logits.
    """
    logits = torch.as_tensor(logits)
    shape = tuple(logits.shape)
    if logits.dtype not in FLOAT_DTYPES:
        raise DataError(f"'{logits_name}' has dtype {str(logits.dtype).removeprefix('torch.')}; expected float16, "
                        "bfloat16, float32 or float64")
    if logits.dim() == 3:
        logits = logits.reshape(-1, logits.shape[2])
    if logits.dim() == 2 and logits.shape[1] == 1:
        logits = logits[:, 0]
    if logits.dim() not in (1, 2):
        raise DataError(f"'{logits_name}' has shape {list(shape)}; expected [N, C] or [N] for one binary logit")
    if logits.dim() == 2 and logits.shape[1] < 2:
        raise DataError(f"'{logits_name}' has shape {list(shape)}; expected at least 2 classes")
    labels = check_labels(labels, shape, name=labels_name, logits_name=logits_name)
    if probs:
        logits = probabilities_to_logits(logits, logits_name)
    data = LogitsData(logits, labels)
    if ignore_index is not None and bool((labels == ignore_index).any()):
        data = data.select((labels != ignore_index).nonzero()[:, 0])
    return data


def probabilities_to_logits(p: torch.Tensor, name: str = "logits") -> torch.Tensor:
    """Log-probabilities (log-odds for one binary column) from probabilities, after checking they are ones."""
    p64 = p.to(torch.float64)
    bad = ~((p64 >= 0) & (p64 <= 1))
    if bool(bad.any()):
        first = int(bad.reshape(bad.shape[0], -1).any(1).nonzero()[0])
        raise DataError(f"{param('probs')}: '{name}' has {int(bad.sum())} values outside [0, 1] (first in row {first})")
    if p.dim() == 1:
        with torch.no_grad():
            return (torch.log(p64) - torch.log1p(-p64)).to(compute_dtype(p.dtype, p.numel(), p.shape[0]))
    sums = p64.sum(1)
    off = (sums - 1).abs() > 1e-3
    if bool(off.any()):
        first = int(off.nonzero()[0])
        raise DataError(f"{param('probs')}: {int(off.sum())} rows of '{name}' do not sum to 1 "
                        f"(first: row {first} sums to {float(sums[first]):.6g})")
    return torch.log(p64).to(compute_dtype(p.dtype, p.numel(), p.shape[0]))


#: The number of pinned buffers a stager alternates between: one being filled, one being copied.
SLOTS = 2


def is_async_copy(source: torch.Tensor, device: torch.device) -> bool:
    """Whether copying ``source`` to ``device`` may be non-blocking: only pinned host memory toward CUDA."""
    return device.type == "cuda" and source.device.type == "cpu" and source.is_pinned()


def to_device(tensor: torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``tensor`` on ``device`` (in ``dtype``), readable at once by the host whenever ``device`` is the CPU."""
    device = torch.device(device)
    return tensor.to(device=device, dtype=dtype, non_blocking=is_async_copy(tensor, device))


class PinnedStager:
    """Host row blocks to one CUDA device through :data:`SLOTS` pinned buffers and a side stream on that device:
    the caller fills :meth:`buffers`, and :meth:`send` returns tensors the device's current stream may use at once."""

    def __init__(self, device: torch.device, logits_bytes: int, label_rows: int):
        if device.type != "cuda":
            raise ValueError(f"PinnedStager copies to a CUDA device, not {device}")
        self.device = device
        self.stream = torch.cuda.Stream(device=device)  # on the target: its events then guard that device's copies
        self.logits = [_pinned(max(logits_bytes, 1), torch.uint8) for _ in range(SLOTS)]
        self.labels = [_pinned(max(label_rows, 1), torch.int64) for _ in range(SLOTS)]
        self.copied: list = [None] * SLOTS
        self.turn = 0

    def buffers(self, rows: int, row_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next slot's logits bytes ``[rows * row_bytes]`` (uint8) and labels ``[rows]`` (int64), free to fill."""
        k = self.turn
        if self.copied[k] is not None:
            self.copied[k].synchronize()  # the host waits only for this slot's copy, issued a chunk ago
            self.copied[k] = None
        return self.logits[k][: rows * row_bytes], self.labels[k][:rows]

    def send(self, block: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy the current slot's ``block`` and ``labels`` on the side stream; the current stream waits for them on
        the GPU, converts the logits to ``dtype`` and owns the results."""
        k = self.turn
        with torch.cuda.stream(self.stream):
            z, y = _async_copy(block, self.device), _async_copy(labels, self.device)
            event = torch.cuda.Event()
            event.record(self.stream)
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        _used_on(z, current)  # allocated on the side stream, used on the current one
        _used_on(y, current)
        self.copied[k] = event
        self.turn = (k + 1) % SLOTS
        return z.to(dtype), y

    def close(self) -> None:
        """Wait for every copy in flight (the pinned buffers may then be freed)."""
        for event in self.copied:
            if event is not None:
                event.synchronize()
        self.copied = [None] * SLOTS


def _pinned(count: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(count, dtype=dtype, pin_memory=True)


def _async_copy(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A non-blocking copy of pinned ``host`` memory to ``device``, on the current stream."""
    return host.to(device=device, non_blocking=True)


def _used_on(tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
    """Tell the caching allocator that ``stream`` uses ``tensor`` (allocated on another stream)."""
    tensor.record_stream(stream)


# -- how a pass reads the data: reads of rows whose blocks the pass's threads take --------------------------------

#: A read of the data holds at most this many logits: enough blocks for every thread, a bounded buffer.
READ_ELEMENTS = 1 << 22
#: At most this many rows per read of logits held in memory (what a pass keeps per row of a read stays bounded).
HELD_READ_ROWS = 1 << 20
#: At most this many bytes of per-row results kept from one read (a pass that declares its ``row_bytes``).
KEPT_BYTES = 1 << 28


class Read(NamedTuple):
    """Rows ``start:start + rows`` of the data: their labels, and ``take(a, b, buffers)`` giving the logits of the
    read's rows ``a:b`` in the compute dtype (``buffers``: the calling thread's, or None for a tensor that may be
    kept)."""

    start: int
    rows: int
    labels: torch.Tensor
    take: Callable[[int, int, Scratch | None], torch.Tensor]


def data_reads(data: LogitsSource, rows: int, device: torch.device, dtype: torch.dtype, held: HeldRows | None
               ) -> Iterator[Read]:
    """Reads of ``rows`` rows: blocks taken from ``held`` by the threads, else chunks read by ``data``."""
    if held is None:
        for start, z, y in data.chunks(rows, device, dtype):
            def view(a: int, b: int, _: Scratch | None, z: torch.Tensor = z) -> torch.Tensor:
                return z[a:b]

            yield Read(start, int(z.shape[0]), y, view)
        return
    labels = data.labels
    for start in range(0, data.num_samples, rows):
        stop = min(start + rows, data.num_samples)

        def take(a: int, b: int, buffers: Scratch | None, start: int = start) -> torch.Tensor:
            return held.block(start + a, start + b, dtype, buffers)

        yield Read(start, stop - start, to_device(labels[start:stop], device, torch.int64), take)


def read_rows(chunk_rows: int, num_classes: int, threads: int, held_rows: int | None = None, row_bytes: int = 0
              ) -> int:
    """Rows per read of the data: ``chunk_rows`` times enough blocks for every thread, at most READ_ELEMENTS.

    ``held_rows``: the data's reads are views of this many rows already in memory (nothing copied) and the
    pass keeps a few numbers per block, so one read takes up to HELD_READ_ROWS of them and a pass is one map:
    the threads meet once per pass, not once per read (each meeting leaves a thread idle for about half a
    block on an idle machine: a tenth of the pass at eight blocks a read). The blocks stay ``chunk_rows``
    rows, so the sums are the same bits. ``row_bytes``: what the pass keeps per row until its read is done;
    a read then holds at most KEPT_BYTES of it (but one block).
    """
    if threads <= 1:
        return chunk_rows
    if held_rows is not None:
        rows = min(held_rows, HELD_READ_ROWS)
        if row_bytes:
            rows = min(rows, KEPT_BYTES // row_bytes)
        return max(chunk_rows, rows)
    blocks = min(BLOCKS_PER_THREAD * threads, READ_ELEMENTS // max(chunk_rows * num_classes, 1))
    if row_bytes:
        blocks = min(blocks, KEPT_BYTES // (chunk_rows * row_bytes))
    return chunk_rows * max(1, blocks)


def pass_reads(data: LogitsSource, device: torch.device, dtype: torch.dtype, chunk_rows: int, threads: int, *,
               few: bool = False, row_bytes: int = 0, copies_kept: bool = False) -> tuple[Iterator[Read], bool]:
    """The reads of a block pass over ``data`` (:func:`read_rows` rows each) and whether a thread may take the next
    read while the others reduce this one (a file read). Logits held in memory on the device are taken block by
    block by the threads, each copied (when it must be) into its thread's buffer; ``few`` (the pass keeps a few
    numbers per block): one read may take every row; ``copies_kept``: the caller keeps the blocks until its read
    is done, so copies are tensors of their own."""
    held_rows = getattr(data, "held_rows", None)
    held = None if held_rows is None or data.binary else held_rows(device)
    whole = held is not None and (few or (copies_kept and not held.copies(dtype)))
    rows = read_rows(chunk_rows, data.num_classes, threads, data.num_samples if whole else None, row_bytes)
    fresh = getattr(data, "fresh_chunks", None)
    ahead = held is None and bool(fresh is not None and fresh(device))
    return data_reads(data, rows, device, dtype, held), ahead
