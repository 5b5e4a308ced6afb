"""Reductions over row chunks of the logits: every figure tempcal reports is a sum over samples.

A :class:`Scan` reads the data once to validate it and keep a few temperature-free
numbers per row (the row maximum, the true class's gap to it, whether the arg-max is
right). Every later *pass* reads the logits chunk by chunk at one inverse temperature
``beta = 1/T`` and returns float64 sums, so the same code serves in-memory tensors,
memory-mapped files and, by all-reducing the sums, many processes.

Per row, with ``d = z - max(z)``, ``e = exp(beta * d)`` and ``s0 = sum(e)``:

* confidence ``= 1 / s0`` (the largest probability, since ``max(e) = 1``);
* NLL ``= log(s0) - beta * d_y``;
* dNLL/dbeta ``= E_p[d] - d_y``;
* entropy ``= log(s0) - beta * E_p[d]``;
* Brier ``= sum(e^2) / s0^2 - 2 p_y + 1``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch

from ..errors import DataError
from .certified import FitStart
from .data import LogitsSource, Read, compute_dtype, pass_reads
from .first_scan import ChunkRows, Problems, Reductions, StartScan, probability_like, row_reductions
from .kernels import (
    FIELDS,
    KEPT,
    RAW_FIELDS,
    CalibrationSums,
    CalibrationTerms,
    ChunkVisitor,
    NllDerivatives,
    bin_edges,
    bin_index,
    finished_sums,
    row_cumulants,
    row_raw_sums,
    scaled_exp,
)
from .limits import bounded_chunk_rows
from .parallel import (
    Scratch,
    all_gather_rows,
    all_reduce,
    block_bounds,
    configure_threads,
    mapped_reads,
    pass_threads,
    resolve_device,
    single_threaded,
)

R = TypeVar("R")
#: Every row of the scanned data (``Scan(fit_rows=ALL_ROWS)``).
ALL_ROWS: Literal["all"] = "all"
FitRows = torch.Tensor | Literal["all"] | None


@dataclass(frozen=True)
class RowStats:
    """Temperature-free per-row numbers kept after the first scan (a few floats per row)."""

    row_max: torch.Tensor  # max_c z
    true_gap: torch.Tensor  # z_y - max_c z  (<= 0)
    correct: torch.Tensor  # arg-max == label (binary: (z >= 0) == label)
    uniform_mean: torch.Tensor  # mean over finite classes of d
    uniform_var: torch.Tensor  # variance over finite classes of d
    has_neginf: torch.Tensor  # row holds a -inf logit

    def select(self, rows: torch.Tensor) -> RowStats:
        return RowStats(*(getattr(self, f)[rows] for f in self.__dataclass_fields__))


@dataclass(frozen=True)
class RowBlock:
    """One block of :meth:`Scan.block_pass`: ``chunk_rows`` rows (fewer at the end) and their kept statistics.
    ``z`` may be the thread's buffer, refilled for its next block: a pass returns figures computed from it."""

    z: torch.Tensor  # logits on the device, compute dtype (a binary logit as two classes)
    y: torch.Tensor
    row_max: torch.Tensor
    true_gap: torch.Tensor
    correct: torch.Tensor
    has_neginf: bool
    start: int  # position of the block's first row among this process's rows


@dataclass(frozen=True)
class ClasswiseSums:
    """Per class and equal-width bin of that class's probability: count, probability sum, true-class hits."""

    count: torch.Tensor  # [C, bins] float64
    probability: torch.Tensor  # [C, bins]
    hits: torch.Tensor  # [C, bins]
    total: int  # samples


class Scan:
    """Validated logits ready for passes at any temperature.

    Creating one is one pass over the data; it raises :class:`DataError` on bad values
    (NaN, +inf, all--inf rows, a true class at -inf, labels out of range). ``fit_rows`` names the
    rows a temperature fit will use, so that the same pass prepares its start
    (:mod:`tempcal.core.first_scan`, about 0.15 of a pass): ``"all"``, or sorted indices into ``data``
    (one side of a split: ``select(fit_rows)`` keeps the start); None (the default) prepares none.
    """

    def __init__(self, data: LogitsSource, *, device: str | torch.device = "auto",
                 chunk_rows: int | None = None, dtype: torch.dtype | None = None, labelled: bool = True,
                 fit_rows: FitRows = None, _stats: RowStats | None = None, _start: FitStart | None = None):
        configure_threads()  # once per process: TEMPCAL_THREADS, or the cores this process may use
        self.data = data
        self.labelled = labelled  # False: the labels are placeholders (OOD scores) and are not checked
        self.device = resolve_device(device)
        self._total: int | None = None  # samples over all ranks, once known
        if dtype is None:  # from the sizes over all ranks, so every rank rounds beta the same way
            sizes = torch.tensor([data.numel(), data.num_samples], dtype=torch.int64, device=self.device)
            numel, self._total = all_reduce(sizes).tolist()
            dtype = compute_dtype(data.dtype, numel, self._total)
        self.compute_dtype = dtype
        self.chunk_rows = int(chunk_rows) if chunk_rows else data.default_chunk_rows(self.device)
        if self.chunk_rows < 1:
            raise DataError(f"chunk size must be at least 1 row, got {chunk_rows}")
        if chunk_rows and _stats is None:  # the user's size: cut to the rows there are, refused beyond memory
            self.chunk_rows = bounded_chunk_rows(self.chunk_rows, data.num_samples, data.num_classes, self.device)
        self.passes = 0
        self.scratch = Scratch.borrow()  # kept across passes: freed megabyte buffers go back to the OS, and faulting
        # them in again costs as much as the arithmetic
        self._scratches = [self.scratch]  # one per thread of a block pass (:mod:`tempcal.core.parallel`)
        self.looks_like_probabilities = False
        self.fit_start = _start  # what a fit on every row of this scan starts from (None: a start without a grid)
        if fit_rows is not None and not (isinstance(fit_rows, str) and fit_rows == ALL_ROWS):
            fit_rows = torch.as_tensor(fit_rows, dtype=torch.int64)
        self._fit_rows = fit_rows if _stats is None else ALL_ROWS
        self.stats = _stats if _stats is not None else self._first_scan()

    @property
    def num_samples(self) -> int:
        """Samples over all ranks (this process's alone outside torch.distributed)."""
        if self._total is None:
            self._total = int(all_reduce(torch.tensor([self.data.num_samples], dtype=torch.int64,
                                                      device=self.device)).item())
        return self._total

    @property
    def num_classes(self) -> int:
        return self.data.num_classes

    def select(self, rows: torch.Tensor) -> Scan:
        """The same scan restricted to ``rows``, without reading the data again (with the fit's start when
        ``rows`` are the scan's ``fit_rows``)."""
        rows = torch.as_tensor(rows, dtype=torch.int64)
        start = self.fit_start if self._is_fit_rows(rows) else None
        return Scan(self.data.select(rows), device=self.device, chunk_rows=self.chunk_rows,
                    dtype=self.compute_dtype, labelled=self.labelled,
                    _stats=self.stats.select(rows.to(self.stats.row_max.device)), _start=start)

    def _is_fit_rows(self, rows: torch.Tensor) -> bool:
        if self.fit_start is None:
            return False
        if isinstance(self._fit_rows, torch.Tensor):
            return torch.equal(rows.cpu(), self._fit_rows.cpu())
        n = self.data.num_samples
        return rows.numel() == n and torch.equal(rows.cpu(), torch.arange(n))

    # -- the first scan -------------------------------------------------------------
    def _first_scan(self) -> RowStats:
        data = self.data
        problems = Problems(data)
        # Filled in place: small per-chunk tensors kept alive between large temporaries fragment the heap.
        n, real = data.num_samples, self.compute_dtype
        columns = [torch.empty(n, dtype=dt, device=self.device)
                   for dt in (real, real, torch.bool, real, real, torch.bool)]
        threads = pass_threads(self.device, self.data.numel())
        fit_rows = self._fit_rows  # the fit's start is gathered when fit_rows asks for one
        start = None if fit_rows is None or not self.labelled else StartScan(
            fit_rows if isinstance(fit_rows, torch.Tensor) else None, n, self.num_classes, self.device, threads,
            self.scratch_for)
        self.passes += 1
        probability, block = data.num_samples > 0, self.chunk_rows
        def plan(read: Read) -> tuple[Callable[[int, int], tuple[torch.Tensor, Reductions]], int]:
            bounds = block_bounds(read.rows, block)

            def reduce(i: int, _: int) -> tuple[torch.Tensor, Reductions]:
                z = read.take(*bounds[i], None)  # kept: the checks below run on it in row order
                return z, row_reductions(z, low=start is not None)
            # The reductions over every logit, shared among the threads; the rest, per row, in order.
            return reduce, len(bounds)

        reads, ahead = pass_reads(self.data, self.device, real, block, threads, copies_kept=True)
        for read, reduced in mapped_reads(reads, plan, threads, ahead):
            with single_threaded():
                for (a, b), (z, rows) in zip(block_bounds(read.rows, block), reduced, strict=True):
                    at = slice(read.start + a, read.start + b)  # the block: checked, stored, handed to the start
                    y, values = problems.check(at.start, z, read.labels[a:b], rows, self.labelled)
                    if values is None:
                        if start is not None:
                            start.plan_empty(real)  # a chunk with bad values: the scan fails on every process
                        continue
                    if probability:
                        probability = probability_like(z[:, 1] if data.binary else z, rows.row_max, rows.row_sum)
                    for column, value in zip(columns, values, strict=True):
                        column[at] = value
                    if start is not None:
                        row_max, true_gap, _, mean, var, has_neginf = values
                        start.add_chunk(at.start, ChunkRows(z, y, row_max, true_gap, mean, var, has_neginf), rows.low)
        with single_threaded():  # the sample's last block (its grid betas shared among the pass's threads)
            if start is not None:
                start.plan_empty(real)  # a process without rows
            problems.raise_first(self.device)
            flag = torch.tensor([1 if probability else 0], device=self.device)
            self.looks_like_probabilities = bool(all_reduce(flag, "min").item())
            if start is not None:
                self.fit_start = start.finish()
        return RowStats(*columns)

    # -- passes at one temperature ---------------------------------------------------
    def scratch_for(self, worker: int) -> Scratch:
        """The reused buffers of thread ``worker`` of a block pass (0: the caller's, :attr:`scratch`)."""
        while len(self._scratches) <= worker:
            self._scratches.append(Scratch.borrow())
        return self._scratches[worker]

    def release_buffers(self) -> None:
        """Hand this scan's buffers to the next scan of the process; only for a scan whose results hold none of them
        (a fit's, which returns numbers). A later pass on it takes fresh ones."""
        Scratch.give_back(self._scratches)
        self.scratch = Scratch()
        self._scratches = [self.scratch]

    def block_pass(self, fn: Callable[[RowBlock, Scratch], R], *, few: bool = False, row_bytes: int = 0
                   ) -> Iterator[R]:
        """One pass: ``fn(block, buffers)`` on every block of ``chunk_rows`` rows, each read's blocks shared among the
        pass's threads (torch single-threaded on each), the results yielded in row order so that sums add up as on
        one thread; the caller's work between the yields runs single-threaded on the CPU too. ``few``: each result is
        a few numbers (longer reads: fewer maps); ``row_bytes``: what each result keeps per row (shorter reads when it
        is large)."""
        self.passes += 1
        threads = pass_threads(self.device, self.data.numel())
        stats, block = self.stats, self.chunk_rows
        neginf = stats.has_neginf.cpu()
        def plan(read: Read) -> tuple[Callable[[int, int], R], int]:
            bounds = block_bounds(read.rows, block)

            def run(i: int, worker: int) -> R:
                a, b = bounds[i]
                s, e = read.start + a, read.start + b
                buffers = self.scratch_for(worker)
                rows = RowBlock(read.take(a, b, buffers), read.labels[a:b], stats.row_max[s:e], stats.true_gap[s:e],
                                stats.correct[s:e], bool(neginf[s:e].any()), s)
                return fn(rows, buffers)
            return run, len(bounds)

        reads, ahead = pass_reads(self.data, self.device, self.compute_dtype, block, threads, few=few,
                                  row_bytes=row_bytes)
        for _, results in mapped_reads(reads, plan, threads, ahead):
            # torch's threads would meet at a barrier after every op of the row-order work, and wait there whenever
            # another process holds one of their cores
            with single_threaded() if self.device.type == "cpu" else contextlib.nullcontext():
                yield from results

    def objective(self, beta: float) -> NllDerivatives:
        """Mean NLL and its first four derivatives in ``beta`` (with the fit's bound terms) in one pass, one exp per
        logit (:func:`tempcal.core.kernels.row_raw_sums`)."""
        acc, count = torch.zeros(RAW_FIELDS, dtype=torch.float64, device=self.device), 0
        for rows, sums in self.block_pass(lambda b, scratch: (b.z.shape[0], row_raw_sums(
                b.z, b.y, beta, scratch, top=b.row_max, impossible=b.has_neginf)), few=True):
            acc += sums
            count += rows
        return NllDerivatives.from_sums(beta, all_reduce(finished_sums(acc, count, beta)))

    def calibration(self, betas: Sequence[float], bins: int, *, keep_scores: bool = False, keep: Sequence[str] = (),
                    visitor: ChunkVisitor | None = None
                    ) -> list[tuple[CalibrationSums, dict[str, torch.Tensor] | None]]:
        """Sums for NLL, Brier, entropy, accuracy and equal-width confidence bins at each ``beta``, in one pass.

        ``keep`` names per-row figures of this process's rows returned too (float64 on the scan's device, 8 bytes per
        row and temperature): ``confidence`` (max softmax, what rankings need), ``energy`` (``T * logsumexp(z /
        T)``); ``keep_scores`` keeps both. A ``visitor`` sees every block at every temperature in the same read, on the
        pass's threads."""
        terms = CalibrationTerms(betas, bins, self.device, self.data.num_samples,
                                 KEPT if keep_scores else keep, visitor)
        for block in self.block_pass(lambda b, scratch: terms.block_sums(
                b.z, b.y, b.row_max, b.true_gap, b.correct, b.has_neginf, scratch, b.start),
                few=True, row_bytes=16 * len(terms.betas) + 8):  # each row's bin, confidence, correctness
            terms.add_sums(block)
        return terms.results(all_reduce(terms.acc).cpu(), all_reduce(terms.per_bin).cpu(), self.num_samples)

    def visit(self, betas: Sequence[float], visitor: ChunkVisitor) -> None:
        """One pass handing each block's ``z - max z`` at ``betas`` to ``visitor`` (its own figures per row:
        conformal scores, say) on the pass's threads; the visitor reduces or gathers them across ranks itself."""
        betas = [float(beta) for beta in betas]

        def block(b: RowBlock, scratch: Scratch) -> None:
            visitor.add(betas, torch.sub(b.z, b.row_max[:, None], out=scratch.like("d", b.z)), b.y, b.start)
        for _ in self.block_pass(block, few=True):
            pass

    def per_sample(self, beta: float) -> dict[str, torch.Tensor]:
        """Per-sample ``confidence`` (max softmax, float64, as :meth:`calibration` computes it), ``correct`` (bool) and
        ``nll`` (float64) of every row of every rank (gathered in rank order), on the scan's device, in one pass."""
        def figures(b: RowBlock, scratch: Scratch) -> torch.Tensor:
            d = torch.sub(b.z, b.row_max[:, None], out=scratch.like("d", b.z))
            s0 = scaled_exp(d, beta, scratch, b.has_neginf).sum(1)
            return torch.stack([s0.reciprocal().to(torch.float64), (torch.log(s0) - beta * b.true_gap).to(
                torch.float64), b.correct.to(torch.float64)], 1)

        parts = list(self.block_pass(figures, few=True, row_bytes=24))  # per row, in row order
        mine = torch.cat(parts) if parts else torch.empty(0, 3, dtype=torch.float64, device=self.device)
        rows = all_gather_rows(mine)
        return {"confidence": rows[:, 0], "correct": rows[:, 2] > 0.5, "nll": rows[:, 1]}

    def classwise(self, beta: float, bins: int) -> ClasswiseSums:
        """Every class's probability binned in equal-width bins at ``beta``, in one pass (a binary logit counts as two
        classes, as the contract's Brier score does); the blocks' sums are added in row order."""
        classes, device = self.num_classes, self.device
        edges = bin_edges(bins, device)
        offset = torch.arange(classes, device=device) * bins

        def sums(b: RowBlock, _: Scratch) -> torch.Tensor:
            e = torch.mul(b.z - b.row_max[:, None], beta).exp_()
            p = (e / e.sum(1, keepdim=True)).to(torch.float64)
            slot = bin_index(p, edges).add_(offset)
            out = torch.zeros(3, classes * bins, dtype=torch.float64, device=device)
            out[0] = torch.bincount(slot.view(-1), minlength=classes * bins).to(torch.float64)
            out[1].index_add_(0, slot.view(-1), p.view(-1))
            true_slot = slot.gather(1, b.y[:, None])[:, 0]
            out[2].index_add_(0, true_slot, torch.ones_like(true_slot, dtype=torch.float64))
            return out

        acc = torch.zeros(3, classes * bins, dtype=torch.float64, device=device)
        for block in self.block_pass(sums):  # in row order: the sums add up as on one thread
            acc += block
        shape = (classes, bins)
        reduced = all_reduce(acc).cpu()
        return ClasswiseSums(reduced[0].view(shape), reduced[1].view(shape), reduced[2].view(shape),
                             self.num_samples)

    def initial_beta(self) -> float:
        """A scale-aware start for the fit: the minimiser of the NLL's quadratic expansion at T = infinity."""
        slope = self.slope_at_infinity()
        spread = self._mean(self.stats.uniform_var)
        if slope >= 0 or spread <= 0:
            return 1.0
        return -slope / spread

    def all_top(self) -> bool:
        """True when no row has a class above its true class (ties too): the NLL never rises as T falls."""
        flag = torch.tensor([1 if bool((self.stats.true_gap == 0).all()) else 0], device=self.device)
        return bool(all_reduce(flag, "min").item())

    def top_ties(self, beta: float) -> tuple[int, int, float]:
        """One pass: the rows whose largest logit is shared by another class, the rows whose finite logits are
        all equal (their NLL is the same at every T), and the mean NLL at ``beta``, over all ranks."""
        def block(b: RowBlock, scratch: Scratch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            at_top = b.z == b.row_max[:, None]
            flat = (at_top | torch.isinf(b.z) if b.has_neginf else at_top).all(1).sum()
            return (at_top.sum(1) > 1).sum(), flat, row_cumulants(b.z, b.y, beta, scratch, top=b.row_max,
                                                                   impossible=b.has_neginf)

        acc = torch.zeros(len(FIELDS) + 2, dtype=torch.float64, device=self.device)
        for tied, flat, sums in self.block_pass(block, few=True):  # in row order: the sums of one thread
            acc[-2] += tied
            acc[-1] += flat
            acc[:-2] += sums
        acc = all_reduce(acc)
        return int(acc[-2]), int(acc[-1]), NllDerivatives.from_sums(beta, acc[:-2]).nll

    def slope_at_infinity(self) -> float:
        """d NLL / d beta at beta = 0 (uniform probabilities); >= 0 means no finite T beats T = infinity."""
        return self._mean(self.stats.uniform_mean - self.stats.true_gap)

    def distinct_labels(self) -> int:
        return int((self._label_counts() > 0).sum())

    def only_label(self) -> int:
        """The smallest label over every rank's rows (the label, when :meth:`distinct_labels` is 1)."""
        return int((self._label_counts() > 0).nonzero()[0, 0])

    def _label_counts(self) -> torch.Tensor:
        counts = torch.bincount(self.data.labels.to(self.device), minlength=self.num_classes)
        return all_reduce(counts[: self.num_classes])

    def sum(self, values: torch.Tensor) -> float:
        """The sum of per-row values over all ranks."""
        return float(all_reduce(values.to(torch.float64).sum().reshape(1)).item())

    def _mean(self, values: torch.Tensor) -> float:
        return self.sum(values) / max(self.num_samples, 1)


__all__ = ["CalibrationSums", "ClasswiseSums", "RowStats", "Scan", "Scratch", "bin_edges", "bin_index"]
