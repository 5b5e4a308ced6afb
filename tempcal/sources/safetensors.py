"""The default SOURCE kind: logits in safetensors files (one, shards, or a glob), read in row chunks with ``pread`` into
a reused buffer, or read once and kept within ``RESIDENT_BYTES``; labels read whole, ``ignore_index`` rows skipped."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..core.data import HeldRows, PinnedStager, default_chunk_rows, to_device
from ..errors import TEMPERATURE_KEY, DataError, TempcalError, check_labels, param, shown
from ..io import safetensors_header
from ..io.safetensors_header import (
    FLOAT_DTYPES,
    Header,
    check_unchanged,
    dtype_name,
    read_header,
    read_tensor,
)
from .base import OpenedSource, SourceKind, SourceOptions, checked

if TYPE_CHECKING:
    from .described import Findings

#: Logits of at most this many bytes (all shards together; about what importing torch takes) are read once and kept;
#: larger inputs are read again, a chunk at a time, by every pass. TEMPCAL_RESIDENT_BYTES overrides it (0: none kept).
RESIDENT_BYTES = 256 << 20


def resident_limit() -> int:
    """The largest input kept in memory, in bytes: TEMPCAL_RESIDENT_BYTES, else RESIDENT_BYTES."""
    text = os.environ.get("TEMPCAL_RESIDENT_BYTES", "").strip()
    if not text:
        return RESIDENT_BYTES
    try:
        return int(text)
    except ValueError:
        raise TempcalError(f"TEMPCAL_RESIDENT_BYTES={text!r}: expected a whole number of bytes") from None
@dataclass(frozen=True)
class Shard:
    """Where one file's logits lie: ``rows`` rows of ``width`` values of ``dtype`` from byte ``offset``."""

    header: Header
    offset: int
    rows: int
    width: int
    dtype: torch.dtype

    @property
    def row_bytes(self) -> int:
        return self.width * self.dtype.itemsize


class ShardedLogits:
    """Logits and labels of one or more safetensors files, read a chunk at a time; ``rows`` (sorted global indices)
    restricts them to a subset (a split, a rank's share, the rows not ``ignore_index``)."""

    def __init__(self, shards: list[Shard], labels: torch.Tensor, *, binary: bool, num_classes: int,
                 rows: torch.Tensor | None = None, resident: _Resident | None = None):
        self.shards = shards
        if resident is None and sum(s.rows * s.row_bytes for s in shards) <= resident_limit():
            resident = _Resident(shards)
        self.resident = resident  # shared with every selection of these rows
        self.all_labels = labels
        self.binary = binary
        self._num_classes = num_classes
        self.rows = rows
        self.labels = labels if rows is None else labels[rows]
        self.dtype = shards[0].dtype
        self.starts = list(itertools.accumulate((shard.rows for shard in shards), initial=0))

    # -- the interface Scan uses (shared with LogitsData) --------------------------------
    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_classes(self) -> int:
        return self._num_classes

    def numel(self) -> int:
        return self.num_samples * self.shards[0].width

    def original_index(self, i: int) -> int:
        return i if self.rows is None else int(self.rows[i])

    def select(self, rows: torch.Tensor) -> ShardedLogits:
        rows = torch.as_tensor(rows, dtype=torch.int64)
        chosen = rows if self.rows is None else self.rows[rows]
        return ShardedLogits(self.shards, self.all_labels, binary=self.binary, num_classes=self._num_classes,
                             rows=chosen, resident=self.resident)

    def default_chunk_rows(self, device: torch.device) -> int:
        return default_chunk_rows(self.num_classes, device, self.num_samples)

    def held_rows(self, device: torch.device) -> HeldRows | None:
        """The resident logits and the selected rows, for a pass's threads to take their blocks from (on the CPU)."""
        return HeldRows(self.resident.load(), self.rows) if device.type == "cpu" and self.resident is not None else None

    def fresh_chunks(self, device: torch.device) -> bool:
        """Whether :meth:`chunks` on ``device`` yields tensors of their own (read from the files on the CPU, never a
        reused buffer): a pass may then read the next chunk while it works on this one."""
        return device.type == "cpu" and self.resident is None

    def chunks(self, chunk_rows: int, device: torch.device, dtype: torch.dtype
               ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """Yield ``(position, logits, labels)``, ``position`` counting the selected rows before the chunk; on CUDA
        through pinned buffers, so reading the next chunk overlaps the copy and the reduction of this one."""
        chunk_rows = max(1, min(int(chunk_rows), self.starts[-1]))  # buffers never larger than the files
        if device.type == "cuda":
            yield from self._staged_chunks(chunk_rows, device, dtype)
        elif self.resident is not None:
            yield from self._resident_chunks(chunk_rows, device, dtype)
        else:
            yield from self._read_chunks(chunk_rows, dtype)

    def _two_class(self, z: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.zeros_like(z[:, 0]), z[:, 0]], dim=1) if self.binary else z

    def _file_blocks(self, chunk_rows: int) -> Iterator[tuple[object, Shard, int, int, torch.Tensor | None]]:
        """``(open file, shard, first, stop, pick)`` per block of at most ``chunk_rows`` file rows holding selected
        rows; ``pick`` (None: all) are the selected rows relative to ``first``. Each file is checked unchanged."""
        for k, shard in enumerate(self.shards):
            first, last = self.starts[k], self.starts[k + 1]
            if self.rows is None:
                wanted = None
            else:
                lo, hi = torch.searchsorted(self.rows, torch.tensor([first, last])).tolist()
                if lo == hi:
                    continue
                wanted = self.rows[lo:hi] - first
            with open(shard.header.path, "rb") as f:
                for block_start in range(0, shard.rows, chunk_rows):
                    block_stop = min(block_start + chunk_rows, shard.rows)
                    pick = None
                    if wanted is not None:
                        a, b = torch.searchsorted(wanted, torch.tensor([block_start, block_stop])).tolist()
                        if a == b:
                            continue
                        pick = wanted[a:b] - block_start
                    yield f, shard, block_start, block_stop, pick
            check_unchanged(shard.header.path, shard.header.stamp)

    def _read_chunks(self, chunk_rows: int, dtype: torch.dtype) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """CPU chunks read from the files into one reused buffer."""
        reader = _BlockReader(chunk_rows * self.shards[0].row_bytes)
        position = 0
        for f, shard, block_start, block_stop, pick in self._file_blocks(chunk_rows):
            own = pick is None and shard.dtype == dtype  # read straight into a tensor of its own: no second copy
            block = reader.read(f, shard, block_start, block_stop, own=own)
            if pick is not None:
                block = block.index_select(0, pick)
            n = block.shape[0]
            z = block.to(dtype=dtype)
            z = z.clone() if not own and z.data_ptr() == block.data_ptr() else z  # never a view of the reused buffer
            yield position, self._two_class(z), self.labels[position : position + n]
            position += n

    def _resident_chunks(self, chunk_rows: int, device: torch.device, dtype: torch.dtype
                         ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        assert self.resident is not None
        logits = self.resident.load()
        rows = self.rows
        gathered = None if rows is None else torch.empty(chunk_rows, logits.shape[1], dtype=logits.dtype)
        for position in range(0, self.num_samples, chunk_rows):
            stop = min(position + chunk_rows, self.num_samples)
            if rows is None or gathered is None:
                block = logits[position:stop]
            else:  # one buffer for every chunk: the caller is done with a chunk when it asks for the next
                block = torch.index_select(logits, 0, rows[position:stop], out=gathered[:stop - position])
            z = to_device(block, device, dtype)
            y = to_device(self.labels[position:stop], device, torch.int64)
            yield position, self._two_class(z), y

    def _host_fills(self, chunk_rows: int) -> Iterator[tuple[int, Callable[[torch.Tensor], None]]]:
        """``(rows, fill)`` per chunk: ``fill(out)`` writes the chunk's logits into ``out`` (pinned), whole blocks read
        straight into it, selected rows gathered."""
        if self.resident is not None:
            logits, rows = self.resident.load(), self.rows
            for position in range(0, self.num_samples, chunk_rows):
                stop = min(position + chunk_rows, self.num_samples)
                if rows is None:
                    yield stop - position, partial(_copy_rows, logits[position:stop])
                else:
                    yield stop - position, partial(_gather_rows, logits, rows[position:stop])
            return
        reader = _BlockReader(chunk_rows * self.shards[0].row_bytes)
        for f, shard, block_start, block_stop, pick in self._file_blocks(chunk_rows):
            if pick is None:
                def fill(out: torch.Tensor, f=f, shard=shard, a=block_start) -> None:
                    memory = memoryview(out.view(torch.uint8).numpy().data).cast("B")
                    _read_exactly(f, memory, shard.offset + a * shard.row_bytes, shard.header.path)

                yield block_stop - block_start, fill
            else:
                block = reader.read(f, shard, block_start, block_stop)
                yield pick.numel(), partial(_gather_rows, block, pick)

    def _staged_chunks(self, chunk_rows: int, device: torch.device, dtype: torch.dtype
                       ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """CUDA chunks: each filled into a pinned slot and copied on the stager's side stream."""
        first = self.shards[0]
        stager = PinnedStager(device, chunk_rows * first.row_bytes, chunk_rows)
        position = 0
        try:
            for n, fill in self._host_fills(chunk_rows):
                raw, labels = stager.buffers(n, first.row_bytes)
                block = raw.view(first.dtype).view(n, first.width)
                fill(block)
                labels.copy_(self.labels[position : position + n])
                z, y = stager.send(block, labels, dtype)
                yield position, self._two_class(z), y
                position += n
        finally:
            stager.close()


def _copy_rows(rows: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(rows)


def _gather_rows(source: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
    torch.index_select(source, 0, index, out=out)


class _Resident:
    """Every shard's logits in one tensor, read on first use by two threads (``pread`` releases the GIL, and one thread
    copies from the page cache at about half the speed of two)."""

    SLICE_BYTES = 8 << 20
    THREADS = 2

    def __init__(self, shards: list[Shard]):
        self.shards = shards
        self.logits: torch.Tensor | None = None

    def load(self) -> torch.Tensor:
        if self.logits is None:
            first = self.shards[0]
            rows = sum(s.rows for s in self.shards)
            buffer = torch.empty(max(rows * first.row_bytes, 1), dtype=torch.uint8)
            memory = memoryview(buffer.numpy().data).cast("B")
            slices, at = [], 0
            for shard in self.shards:
                nbytes = shard.rows * shard.row_bytes
                slices += [(shard.header.path, memory[at + a:at + min(a + self.SLICE_BYTES, nbytes)], shard.offset + a)
                           for a in range(0, nbytes, self.SLICE_BYTES)]
                at += nbytes
            with ThreadPoolExecutor(self.THREADS, thread_name_prefix="tempcal-read") as pool:
                for read in [pool.submit(_read_slice, *args) for args in slices]:
                    read.result()
            for shard in self.shards:
                check_unchanged(shard.header.path, shard.header.stamp)
            self.logits = buffer[:rows * first.row_bytes].view(first.dtype).view(rows, first.width)
        return self.logits


def _read_slice(path, memory: memoryview, offset: int) -> None:
    with open(path, "rb") as f:
        _read_exactly(f, memory, offset, path)


def _read_exactly(f, memory: memoryview, offset: int, path) -> None:
    """Fill ``memory`` from byte ``offset`` of the open file ``f``."""
    done = 0
    while done < len(memory):
        got = os.preadv(f.fileno(), [memory[done:]], offset + done)
        if got <= 0:
            raise TempcalError(f"{path}: file ended early (truncated while reading?)")
        done += got


class _BlockReader:
    """Reads row blocks with ``os.preadv`` into one reused (pageable) buffer."""

    def __init__(self, capacity: int):
        self.buffer = torch.empty(max(capacity, 1), dtype=torch.uint8)

    def read(self, f, shard: Shard, start: int, stop: int, own: bool = False) -> torch.Tensor:
        """Rows ``[start, stop)`` of ``shard``, a view of the buffer valid until the next read (``own``: a new
        tensor instead)."""
        size = (stop - start) * shard.row_bytes
        view = torch.empty(size, dtype=torch.uint8) if own else self.buffer[:size]
        offset = shard.offset + start * shard.row_bytes
        _read_exactly(f, memoryview(view.numpy().data).cast("B"), offset, shard.header.path)
        return view.view(shard.dtype).view(stop - start, shard.width)


class SafetensorsKind(SourceKind):
    """``.safetensors`` logits files: one, several shards, or a glob; T goes into each file's metadata."""

    name = "safetensors"
    shards = True
    remembered = ("probs",)  # tensor names are not kept: a file's header lists them
    title = "safetensors logits file"
    logits_file = True

    def open(self, paths: list[Path], options: SourceOptions, *, labels_optional: bool = False) -> OpenedSource:
        tensors = read_header(paths[0]).tensors
        if options.logits_key not in tensors and options.hidden_key in tensors:  # hidden states: --head reads them
            raise TempcalError(f"{paths[0]}: holds hidden states {shown(options.hidden_key)} "
                               f"{list(tensors[options.hidden_key].shape)} and no logits {shown(options.logits_key)}: "
                               f"pass {param('head')} HEAD (the output layer: a .safetensors file with 'weight', or a "
                               f"Hugging Face model folder) to compute the logits from them, or name the logits "
                               f"tensor with {param('logits_key')}")
        if options.probs:
            data, has_labels = _read_whole(paths, options, labels_optional)
        else:
            data, has_labels = open_sharded(paths, logits_key=options.logits_key, labels_key=options.labels_key,
                                            ignore_index=options.ignore_index, labels_optional=labels_optional)
        stored = read_header(paths[0]).stored_temperature()
        return OpenedSource(paths, data, stored, self, options, has_labels=has_labels)

    def tensor_names(self, opened: OpenedSource) -> set[str]:
        return set(read_header(opened.paths[0]).tensors)

    def group_values(self, opened: OpenedSource, key: str, option: str) -> np.ndarray:
        """``key`` in every shard, each checked against its labels' shape."""
        labels_key = opened.options.labels_key
        return np.concatenate([safetensors_values(path, key, labels_key, option) for path in opened.paths])

    def describe_tensors(self, paths: list[Path], options: SourceOptions) -> list[dict[str, Any]]:
        from .described import tensor_entry

        return [tensor_entry(path, name, info.shape, dtype_name(info.dtype), options)
                for path in paths for name, info in read_header(path).tensors.items()]

    def describe_sidecar(self, path: Path) -> dict[str, Any] | None:
        return None  # T is in the file's own metadata

    def describe_stored(self, path: Path, opened: OpenedSource | None, sidecar: dict[str, Any] | None,
                        findings: Findings) -> dict[str, Any]:
        """The stored T from the file's metadata."""
        from .described import stored_block

        metadata = findings.attempt(lambda: dict(read_header(path).metadata)) or {}
        return stored_block("metadata", metadata, f"{path}:", f"{path}: metadata", opened, findings.problems)

    def read_temperature(self, path: Path) -> tuple[float | None, list[str]]:
        return read_header(path).stored_temperature(), []

    def temperature_place(self, path: Path) -> str:
        return f"metadata '{TEMPERATURE_KEY}'; run tempcal fit first"

    def stored_metadata(self, path: Path) -> dict[str, str]:
        """The file's own metadata (where T is stored)."""
        return dict(read_header(path).metadata)

    def write_reading(self, path: Path, temperature: float, output: str | Path | None,
                      metadata: Mapping[str, str | None]) -> Path:
        return safetensors_header.write_temperature(path, temperature, output, metadata=metadata)


def _read_whole(paths: list[Path], options: SourceOptions, labels_optional: bool):
    """``--probs``: one file read whole, its probabilities turned into log-probabilities."""
    from .memory import in_memory_data

    if len(paths) > 1:
        raise TempcalError(f"{param('probs')} takes a single file, not shards")
    header = read_header(paths[0])
    logits = read_tensor(header, options.logits_key, option=param("logits_key"))
    has_labels = options.labels_key in header.tensors or not labels_optional
    labels = read_tensor(header, options.labels_key, option=param("labels_key")) if has_labels else None
    return in_memory_data(paths[0], logits, labels, options, logits_name=options.logits_key,
                          labels_name=options.labels_key)


def open_sharded(paths: list[Path], *, logits_key: str = "logits", labels_key: str = "labels",
                 ignore_index: int | None = None, labels_optional: bool = False) -> tuple[ShardedLogits, bool]:
    """Check every shard's header and read the labels: the logits (``[N, C]``, ``[N]`` / ``[N, 1]``, or ``[B, L, V]``)
    as a chunked source, and whether every shard had labels (placeholders when optional and absent)."""
    shards, labels, kinds = [], [], set()
    has_labels = True
    for path in paths:
        header = read_header(path)
        if logits_key not in header.tensors:
            read_tensor(header, logits_key, option=param("logits_key"))  # raises the standard missing-key error
        info = header.tensors[logits_key]
        if info.dtype not in FLOAT_DTYPES:
            raise DataError(f"{path}: '{logits_key}' has dtype {dtype_name(info.dtype)}; expected float16, bfloat16, "
                            "float32 or float64")
        shape = info.shape
        if len(shape) == 1 or (len(shape) == 2 and shape[1] == 1):
            rows, width, binary = shape[0], 1, True
        elif len(shape) == 2:
            rows, width, binary = shape[0], shape[1], False
        elif len(shape) == 3:
            rows, width, binary = shape[0] * shape[1], shape[2], False
        else:
            raise DataError(f"{path}: '{logits_key}' has shape {list(shape)}; expected [N, C], [N] or [B, L, V]")
        if not binary and width < 2:
            raise DataError(f"{path}: '{logits_key}' has shape {list(shape)}; expected at least 2 classes")
        dtype = header.torch_dtype(logits_key)
        kinds.add((width, binary, dtype))
        if len(kinds) > 1:
            raise DataError(f"{path}: '{logits_key}' has {width} classes of {info.dtype}, unlike the shards before it")
        if labels_key in header.tensors or not labels_optional:
            y = read_tensor(header, labels_key, option=param("labels_key"))
            labels.append(check_labels(y, shape, f"{path}: ", labels_key, logits_key))
        else:
            has_labels = False
            labels.append(torch.zeros(rows, dtype=torch.int64))
        shards.append(Shard(header, header.data_start + info.begin, rows, width, dtype))
    width, binary, _ = kinds.pop()
    all_labels = torch.cat(labels)
    keep = None if ignore_index is None else all_labels != ignore_index
    kept = None if keep is None or bool(keep.all()) else keep.nonzero()[:, 0]
    return ShardedLogits(shards, all_labels, binary=binary, num_classes=2 if binary else width, rows=kept), has_labels


def safetensors_values(path: Path, key: str, labels_key: str, option: str) -> np.ndarray:
    """The flat integer values of ``key`` in one safetensors file, checked against its labels' shape."""
    header = read_header(path)
    shape = header.tensors[labels_key].shape if labels_key in header.tensors else None
    return checked(path, key, read_tensor(header, key, option=option), shape, option)


__all__ = ["RESIDENT_BYTES", "SafetensorsKind", "Shard", "ShardedLogits", "open_sharded", "safetensors_values"]
