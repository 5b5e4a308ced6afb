"""Hidden states and an output head as SOURCE (``--head``): logits ``head(h)`` computed a block at a time, the hidden
states clipped with ReAct (``react=P``) at the exact P-th percentile of SOURCE's values, OOD files at the same one."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core import parallel
from ..core.data import CPU_CHUNK_ELEMENTS, CUDA_CHUNK_ELEMENTS
from ..core.parallel import pass_threads, resolve_device
from ..errors import DataError, TempcalError, param
from ..io.safetensors_header import read_header
from .base import OpenedSource, SourceOptions, expand_sources
from .safetensors import SafetensorsKind, ShardedLogits, open_sharded

#: Logits per block: larger than for stored logits, since each block is also a matmul that wants many rows;
#: bounded in bytes (8 MB on the CPU) so that a pass's few block-sized buffers stay small at any vocabulary.
HEAD_CHUNK_ELEMENTS = {"cpu": CPU_CHUNK_ELEMENTS * 4, "cuda": CUDA_CHUNK_ELEMENTS}
#: Fewest rows per block: a 128k vocabulary still gets a block of a few MB.
HEAD_MIN_ROWS = 8


@dataclass(frozen=True)
class ReactClip:
    """ReAct's threshold: the ``percentile``-th percentile of ``count`` hidden-state values, found in ``passes``
    reads of the hidden states."""

    percentile: float
    threshold: float
    passes: int
    count: int


class HeadLogits:
    """The logits ``head(h)`` of hidden states read in row chunks: a ``LogitsSource`` whose chunks are computed."""

    binary = False

    def __init__(self, hidden: ShardedLogits, head: Any, clip: float | None = None, react: ReactClip | None = None):
        self.hidden = hidden
        self.head = head  # models.head.OutputHead
        self.clip = clip  # ReAct: hidden values are clipped from above at this threshold
        self.react = react  # how the threshold was found, when it was
        self.labels = hidden.labels
        self.num_samples = hidden.num_samples
        self.num_classes = head.vocab
        # The logits' dtype: float64 for float64 hidden states, else float32 (never a 16-bit storage dtype).
        self.dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        self._on: dict[torch.device, Any] = {}
        self._buffer: torch.Tensor | None = None

    def numel(self) -> int:
        return self.num_samples * self.num_classes

    def original_index(self, i: int) -> int:
        return self.hidden.original_index(i)

    def select(self, rows: torch.Tensor) -> HeadLogits:
        selected = HeadLogits(self.hidden.select(rows), self.head, self.clip, self.react)
        selected._on = self._on
        return selected

    def default_chunk_rows(self, device: torch.device) -> int:
        return max(HEAD_MIN_ROWS, HEAD_CHUNK_ELEMENTS[device.type] // self.num_classes)

    def chunks(self, chunk_rows: int, device: torch.device, dtype: torch.dtype
               ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """``(position, logits, labels)`` per chunk: the logits computed in :attr:`dtype`, then given in ``dtype``."""
        head = self._on.get(device)
        if head is None:
            head = self._on[device] = self.head.to(device)
        threads = pass_threads(device, chunk_rows * self.num_classes)
        for position, h, y in self.hidden.chunks(chunk_rows, device, self.dtype):
            if self.clip is not None:
                h = h.clamp_max(self.clip)
            z = head.logits(h, self._block(h.shape[0], device), threads)
            yield position, (z if z.dtype == dtype else z.to(dtype)), y

    def _block(self, rows: int, device: torch.device) -> torch.Tensor:
        """One reused ``[rows, V]`` block (the caller is done with a chunk when it asks for the next)."""
        need = rows * self.num_classes
        if self._buffer is None or self._buffer.numel() < need or self._buffer.device != device:
            self._buffer = torch.empty(need, dtype=self.dtype, device=device)
        return self._buffer[:need].view(rows, self.num_classes)


class HeadKind(SafetensorsKind):
    """Hidden states in safetensors files with ``--head``; T goes into their metadata."""

    name = "head"
    title = "hidden states with an output head"
    logits_file = False  # the head computes the logits: probabilities are refused as a model's output is

    def open(self, paths: list[Path], options: SourceOptions, *, labels_optional: bool = False) -> OpenedSource:
        from ..models.head import load_head

        if options.probs:
            raise TempcalError(f"{param('probs')} applies to logits; with {param('head')} tempcal computes them")
        assert options.head is not None
        head = load_head(options.head, weight_key=options.head_weight_key, bias_key=options.head_bias_key,
                         softcap=options.softcap)
        opened = self._open_with(head, paths, options, labels_optional)
        if options.react is not None:
            assert isinstance(opened.data, HeadLogits)
            react = react_threshold(opened.data.hidden, options.react, options.device, opened.name)
            opened.data.clip, opened.data.react = react.threshold, react
        return opened

    def open_related(self, opened: OpenedSource, other: Any, *, labels_optional: bool = False) -> OpenedSource:
        """Another hidden-states file through the head ``opened`` already loaded."""
        assert isinstance(opened.data, HeadLogits)
        paths = expand_sources([other] if isinstance(other, (str, Path)) else list(other))
        related = self._open_with(opened.data.head, paths, opened.options, labels_optional)
        assert isinstance(related.data, HeadLogits)
        related.data.clip, related.data.react = opened.data.clip, opened.data.react  # ReAct: SOURCE's threshold
        return related

    def _open_with(self, head: Any, paths: list[Path], options: SourceOptions, labels_optional: bool) -> OpenedSource:
        hidden, has_labels = open_sharded(paths, logits_key=options.hidden_key, labels_key=options.labels_key,
                                          ignore_index=options.ignore_index, labels_optional=labels_optional)
        width = 1 if hidden.binary else hidden.shards[0].width
        if hidden.binary or width != head.width:
            raise DataError(f"{paths[0]}: '{options.hidden_key}' has width d = {width} but {head.name} maps "
                            f"d = {head.width} to {head.vocab} classes; the hidden states must be the head's input")
        if has_labels and hidden.num_samples:
            top = int(hidden.labels.max())
            if top >= head.vocab:
                first = int((hidden.labels >= head.vocab).nonzero()[0, 0])
                raise DataError(f"{paths[0]}: label {top} is outside the vocabulary of {head.name} (V = {head.vocab}); "
                                f"first at index {hidden.original_index(first)}")
        stored = read_header(paths[0]).stored_temperature()
        return OpenedSource(paths, HeadLogits(hidden, head), stored, self, options, has_labels=has_labels)


def react_threshold(hidden: ShardedLogits, percentile: float, device: str | torch.device, name: str) -> ReactClip:
    """The ``percentile``-th percentile of all values of ``hidden`` (this process's rows, counts summed across
    processes), as numpy's default ``percentile`` in the compute dtype; a non-finite one is bad input."""
    from ..core.percentile import streaming_percentile

    where = resolve_device(device)
    if parallel.active():
        start, stop = parallel.share(hidden.num_samples)
        hidden = hidden.select(torch.arange(start, stop))
    dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    rows = hidden.default_chunk_rows(where)
    try:
        result = streaming_percentile(lambda: (h for _, h, _ in hidden.chunks(rows, where, dtype)), percentile,
                                      dtype=dtype, all_reduce=parallel.all_reduce if parallel.active() else None,
                                      device=where)
    except DataError as exc:
        raise exc.prefixed(f"{name}: {param('react')}: hidden states: ") from None
    if not math.isfinite(result.value):
        raise DataError(f"{name}: {param('react')} {percentile:g}: the percentile of the hidden states is "
                        f"{result.value}; hidden states must be finite")
    return ReactClip(percentile=float(percentile), threshold=result.value, passes=result.passes, count=result.count)


__all__ = ["HeadKind", "HeadLogits", "ReactClip", "react_threshold"]
