"""Exact percentiles of values streamed in chunks: ``numpy.percentile(all_values, p)`` without holding the values
(ReAct's clip, :mod:`tempcal.sources.head`: 10^9 and more hidden-state values, only ever chunks read from a file).

Radix selection on order-preserving integer keys of the float bits (``-0.0`` keyed as ``+0.0``): pass 1 counts the
values (refusing NaN) and histograms the top 16 key bits, naming the buckets of the two order statistics numpy's
linear method needs; each later pass histograms the next 16 bits inside a bucket, or sorts the bucket's keys once it
holds at most ``max_candidates`` (float32: 2 passes; float64: 2 to 4). numpy's own interpolation formula then makes
the result bit-identical to ``numpy.percentile`` in the compute dtype (float64 for float64 values, else float32).
Counts are sums, so with ``all_reduce`` every rank gets the same result from its share (and never collects).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import DataError

DIGIT_BITS = 16
BINS = 1 << DIGIT_BITS
#: Small chunks are joined up to this many values before counting: a histogram costs BINS work per call.
BATCH_VALUES = 1 << 18
#: The most keys one open rank may collect in a pass (8 MiB of int64) before refining by another histogram.
MAX_CANDIDATES = 1 << 20

ChunksFactory = Callable[[], Iterable["torch.Tensor | np.ndarray"]]
#: ``(level, prefix)``: the keys whose top ``level`` 16-bit digits are ``prefix``.
Where = tuple[int, int]


@dataclass(frozen=True)
class PercentileResult:
    """``value`` = ``numpy.percentile(values, p)`` in ``dtype``; ``passes`` full reads of the values were made."""

    value: float
    dtype: torch.dtype
    passes: int
    count: int


@dataclass
class _Search:
    """One open rank: the key bits found so far (``prefix``, ``level`` digits) and its rank among keys with them."""

    rank: int
    level: int = 0
    prefix: int = 0
    bucket_count: int = 0
    key: int | None = None  # the full key, once found

    @property
    def where(self) -> Where:
        return self.level, self.prefix


# -- keys --------------------------------------------------------------------------------------------
def key_bits(dtype: torch.dtype) -> int:
    """Bits of the keys of a compute dtype (float32: 32, float64: 64)."""
    if dtype == torch.float32:
        return 32
    if dtype == torch.float64:
        return 64
    raise TypeError(f"percentiles are computed in float32 or float64, not {dtype}")


def float_keys(x: torch.Tensor) -> torch.Tensor:
    """Order-preserving unsigned keys of float32/float64 values, as int64 bit patterns (float64: wrapped); ``-0.0``
    and ``+0.0`` get the same key, NaN a meaningless one (callers refuse NaN)."""
    wide = key_bits(x.dtype) == 64
    bits = x.view(torch.int64) if wide else x.view(torch.int32).to(torch.int64)
    key = torch.where(bits < 0, bits ^ (0x7FFFFFFFFFFFFFFF if wide else 0x7FFFFFFF), bits)  # negative: -1 - magnitude
    key = torch.where(key == -1, 0, key)  # -0.0 -> +0.0
    # float32: [0, 2^32); float64: the sign bit flipped, unsigned order as a wrapped int64 pattern
    return key ^ -(1 << 63) if wide else key + (1 << 31)


def key_value(key: int, dtype: torch.dtype) -> np.floating:
    """The float (numpy scalar of ``dtype``) whose key is ``key`` (an unsigned Python int)."""
    bits = key_bits(dtype)
    signed = key - (1 << (bits - 1))
    pattern = signed if signed >= 0 else (1 << (bits - 1)) | (-1 - signed)
    unsigned, floating = (np.uint32, np.float32) if bits == 32 else (np.uint64, np.float64)
    return np.array([pattern], dtype=unsigned).view(floating)[0]


def _in_prefix(keys: torch.Tensor, level: int, prefix: int, bits: int) -> torch.Tensor:
    """Mask of keys whose top ``level`` digits are ``prefix``."""
    width = DIGIT_BITS * level
    return ((keys >> (bits - width)) & ((1 << width) - 1)) == prefix


# -- numpy's linear interpolation --------------------------------------------------------------------
def numpy_linear_positions(n: int, p: float) -> tuple[int, int, float]:
    """numpy's ``method='linear'`` positions for ``n`` values: (lower index, upper index, gamma), down to its gamma
    at the top (``k >= n - 1``: both indices the last, gamma = k + 1, as numpy stores the lower index as -1)."""
    virtual = (n - 1) * (p / 100.0)
    if virtual >= n - 1:
        return n - 1, n - 1, virtual + 1.0
    lower = math.floor(virtual)
    return lower, lower + 1, virtual - lower


def numpy_lerp(a: np.floating, b: np.floating, t: float) -> np.floating:
    """numpy's ``_lerp`` for a Python-float weight (weak, so computed in the values' dtype)."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff = b - a
        return b - diff * (1 - t) if t >= 0.5 else a + diff * t


# -- the selection -----------------------------------------------------------------------------------
def compute_dtype(dtype: torch.dtype, requested: torch.dtype | None = None) -> torch.dtype:
    """float64 values (or a float64 request) -> float64; float16/bfloat16/float32 -> float32."""
    if requested is not None:
        key_bits(requested)
        if dtype == torch.float64 and requested == torch.float32:
            raise TypeError("float64 values cannot be ranked exactly in float32")
        return requested
    if not dtype.is_floating_point:
        raise TypeError(f"values must be floating point, got {dtype}")
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass
class _Counter:
    """Runs passes over the chunks; each pass's counts are one int64 vector, summed over chunks (and ranks)."""

    chunks_factory: ChunksFactory
    requested: torch.dtype | None
    all_reduce: Callable[[torch.Tensor], torch.Tensor | None] | None
    device: torch.device | str | None
    dtype: torch.dtype | None = None  # the compute dtype, once a chunk was read
    passes: int = 0

    def chunks(self) -> Iterable[torch.Tensor]:
        """The values in the compute dtype, flat, small chunks joined into batches of about BATCH_VALUES."""
        pending: list[torch.Tensor] = []
        size = 0
        for chunk in self.chunks_factory():
            x = (chunk if isinstance(chunk, torch.Tensor) else torch.from_numpy(np.asarray(chunk))).reshape(-1)
            dtype = compute_dtype(x.dtype, self.requested)
            if self.dtype is None:
                self.dtype = dtype
            elif dtype != self.dtype:
                raise TypeError(f"chunks mix dtypes: {self.dtype} and {x.dtype}")
            if x.numel() >= BATCH_VALUES:
                yield x.to(dtype)
                continue
            if pending and pending[0].device != x.device:
                yield torch.cat(pending)
                pending, size = [], 0
            pending.append(x.to(dtype))
            size += x.numel()
            if size >= BATCH_VALUES:
                yield torch.cat(pending)
                pending, size = [], 0
        if pending:
            yield torch.cat(pending)

    def run(self, histograms: list[Where], collects: list[Where], *, first: bool
            ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One pass: a histogram per entry of ``histograms``, the keys collected per entry of ``collects``."""
        self.passes += 1
        counts: torch.Tensor | None = None
        collected: list[list[torch.Tensor]] = [[] for _ in collects]
        extra = 2 if first else 0  # first pass: [number of values, number of NaNs]
        for x in self.chunks():
            if counts is None:
                counts = torch.zeros(len(histograms) * BINS + extra, dtype=torch.int64, device=x.device)
            bits = key_bits(x.dtype)
            if first:
                counts[-2] += x.numel()
                counts[-1] += torch.isnan(x).sum()
            keys = float_keys(x)
            for i, (level, prefix) in enumerate(histograms):
                inside = keys if level == 0 else keys[_in_prefix(keys, level, prefix, bits)]
                digit = (inside >> (bits - DIGIT_BITS * (level + 1))) & (BINS - 1)  # the level-th from the top
                counts[i * BINS:(i + 1) * BINS] += torch.bincount(digit, minlength=BINS)
            for i, (level, prefix) in enumerate(collects):
                collected[i].append(keys[_in_prefix(keys, level, prefix, bits)].cpu())
        if counts is None:  # no chunks on this rank: still take part in the sum
            counts = torch.zeros(len(histograms) * BINS + extra, dtype=torch.int64, device=self.device)
        if self.all_reduce is not None:
            reduced = self.all_reduce(counts)
            counts = counts if reduced is None else reduced
        counts = counts.cpu()
        hists = [counts[i * BINS:(i + 1) * BINS] for i in range(len(histograms))]
        if first:
            hists.append(counts[-2:])
        keys_out = [torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64) for parts in collected]
        return hists, keys_out


def _descend(search: _Search, hist: torch.Tensor, bits: int) -> None:
    """Move ``search`` one digit down: the bucket of ``hist`` that holds its rank."""
    cumulative = torch.cumsum(hist, 0)
    bucket = int(torch.searchsorted(cumulative, torch.tensor([search.rank]), right=True)[0])
    below = int(cumulative[bucket - 1]) if bucket else 0
    search.rank -= below
    search.prefix = (search.prefix << DIGIT_BITS) | bucket
    search.level += 1
    search.bucket_count = int(hist[bucket])
    if search.level * DIGIT_BITS == bits:
        search.key = search.prefix


def streaming_percentile(chunks_factory: ChunksFactory, p: float, *, dtype: torch.dtype | None = None,
                         max_candidates: int = MAX_CANDIDATES,
                         all_reduce: Callable[[torch.Tensor], torch.Tensor | None] | None = None,
                         device: torch.device | str | None = None) -> PercentileResult:
    """``numpy.percentile(all_values, float(p))`` of the values ``chunks_factory()`` yields (the same each call, one
    call per pass), exactly. ``all_reduce`` sums the count vector over processes (in place or returning the sum);
    a process that may hold no values must then be given ``dtype`` and ``device``."""
    p = float(p)
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {p}")
    cap = 0 if all_reduce is not None else max(0, int(max_candidates))
    counter = _Counter(chunks_factory, dtype, all_reduce, device)
    (top_hist, totals), _ = counter.run([(0, 0)], [], first=True)
    count, nans = (int(v) for v in totals)
    if nans:
        raise DataError(f"{nans} NaN value{'s' if nans > 1 else ''}: a percentile of NaN is not defined")
    if count == 0:
        raise DataError("no values to take a percentile of")
    if counter.dtype is None:  # this rank read nothing; the others did
        if dtype is None:
            raise ValueError("this process read no values: pass dtype= so that it can take part in the sums")
        counter.dtype = dtype
    bits = key_bits(counter.dtype)
    lower_index, upper_index, gamma = numpy_linear_positions(count, p)
    searches = {rank: _Search(rank) for rank in {lower_index, upper_index}}
    for search in searches.values():
        _descend(search, top_hist, bits)
    while open_searches := [s for s in searches.values() if s.key is None]:
        histograms: list[Where] = []
        collects: list[Where] = []
        for s in open_searches:
            # Collect only where it saves passes: one more histogram would end the search anyway.
            collect = s.bucket_count <= cap and bits - s.level * DIGIT_BITS > DIGIT_BITS
            target = collects if collect else histograms
            if s.where not in target:
                target.append(s.where)
        hists, collected = counter.run(histograms, collects, first=False)
        for s in open_searches:
            if s.where in histograms:
                _descend(s, hists[histograms.index(s.where)], bits)
            else:
                keys = torch.sort(collected[collects.index(s.where)]).values
                s.key = int(keys[s.rank]) % (1 << bits)  # the int64 pattern as the unsigned key
    lower_key, upper_key = searches[lower_index].key, searches[upper_index].key
    assert lower_key is not None and upper_key is not None
    lower, upper = key_value(lower_key, counter.dtype), key_value(upper_key, counter.dtype)
    return PercentileResult(value=float(numpy_lerp(lower, upper, gamma)), dtype=counter.dtype, passes=counter.passes,
                            count=count)


__all__ = ["PercentileResult", "float_keys", "key_value", "numpy_lerp", "numpy_linear_positions",
           "streaming_percentile"]
