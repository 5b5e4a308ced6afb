"""The validating scan's work on each block besides storing it: the checks of its values, its reductions over every
logit, and the fit's start, gathered at no extra read (:class:`StartScan`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch

from ..errors import DataError
from .certified import BETA_MAX, BETA_MIN, TOL, FitStart, certified_fit
from .data import LogitsSource
from .kernels import FIELDS, NllDerivatives, row_cumulants, row_moments, row_range, row_terms
from .parallel import Scratch, active, all_gather_rows, all_reduce, map_blocks, rank

# -- the checks of a block ---------------------------------------------------------------------------------------------

class Reductions(NamedTuple):
    """A block's reductions over every logit, for the first scan: computed on the pass's threads."""

    row_sum: torch.Tensor
    row_max: torch.Tensor
    arg_max: torch.Tensor
    squares: torch.Tensor  # sum of z^2 per row
    low: torch.Tensor | None  # min z per row (the fit's start needs the rows' ranges)


def row_reductions(z: torch.Tensor, low: bool = False) -> Reductions:
    """The reductions over every logit of ``z``'s rows (``low``: their minima too)."""
    row_sum = z.sum(1)  # first, as the validating scan did before its blocks
    row_max, arg_max = torch.max(z, 1)
    # Each row's sum of squares as its norm squared: one sweep with no temporary (2-3x faster than a product and a
    # sum or ``vecdot``), within a few float32 ulps, which is enough for the start's spread.
    squares = torch.linalg.vector_norm(z, dim=1).square_()
    return Reductions(row_sum, row_max, arg_max, squares, z.amin(1) if low else None)


def uniform_moments(z: torch.Tensor, reduced: Reductions, has_neginf: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of ``z - max z`` over each row's finite entries (the fit's view at T = infinity)."""
    row_sum, row_max, squares = reduced.row_sum, reduced.row_max, reduced.squares
    mean = row_sum / z.shape[1] - row_max
    # Only the fit's starting point uses the spread, so the one-read E[z^2] - E[z]^2 form is enough.
    var = (squares / z.shape[1] - (row_sum / z.shape[1]) ** 2).clamp_min(0)
    if bool(has_neginf.any()):
        rows = z[has_neginf]
        finite = torch.isfinite(rows)
        d = torch.where(finite, rows - row_max[has_neginf, None], torch.zeros((), dtype=z.dtype, device=z.device))
        count = finite.sum(1)
        mean[has_neginf] = d.sum(1) / count
        var[has_neginf] = ((d * d).sum(1) / count - mean[has_neginf] ** 2).clamp_min(0)
    return mean, var


def probability_like(z: torch.Tensor, row_max: torch.Tensor, row_sum: torch.Tensor) -> bool:
    """Every value in [0, 1] and (for several classes) every row summing to 1 within 1e-3."""
    if z.dim() == 1:
        return bool(((z >= 0) & (z <= 1)).all())
    return bool((row_max <= 1).all() and ((row_sum - 1).abs() <= 1e-3).all() and (z >= 0).all())


class Problems:
    """Counts each kind of bad value over the whole scan, so the error says how many and where first."""

    MESSAGES: ClassVar[dict[str, str]] = {
        "label": "label{s} outside {labels}",
        "nan": "row{s} with NaN logits",
        "posinf": "row{s} with +inf logits",
        "all-neginf": "row{s} whose logits are all -inf",
        "true-neginf": "row{s} whose true class has logit -inf (infinite NLL)",
    }

    def __init__(self, data: LogitsSource):
        self.data = data
        self.found: dict[str, list] = {}

    def add(self, kind: str, start: int, mask: torch.Tensor, detail=None) -> None:
        count = int(mask.sum())
        if not count:
            return
        if kind not in self.found:
            first = int(mask.nonzero()[0, 0])
            extra = f" ({detail(first)})" if detail else ""
            index = self.data.original_index(start + first)
            self.found[kind] = [0, f"{index}{extra}", index]
        self.found[kind][0] += count

    def check(self, start: int, z: torch.Tensor, y: torch.Tensor, reduced: Reductions, labelled: bool
              ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """Check one chunk of the scan, its rows from ``start`` on (what is wrong is counted here); the clamped
        labels and, when nothing was found wrong so far, the chunk's ``RowStats`` columns. ``reduced``: its rows'
        reductions; ``labelled`` False: placeholder labels, not checked."""
        data = self.data
        bad_label = (y < 0) | (y >= data.num_classes)
        if not labelled:
            bad_label = torch.ones_like(bad_label)  # placeholder labels: no label check applies
        else:
            self.add("label", start, bad_label, lambda i, y=y: f"label {int(y[i])}")
        y = y.clamp(0, data.num_classes - 1)
        # A non-finite row sum flags every row holding NaN or +/-inf; only those rows are looked at closely.
        odd = ~torch.isfinite(reduced.row_sum)
        has_neginf = odd
        if bool(odd.any()):
            rows = z[odd]
            nan = torch.zeros_like(odd)
            nan[odd] = torch.isnan(rows).any(1)
            posinf = torch.zeros_like(odd)
            posinf[odd] = (rows == math.inf).any(1)
            self.add("nan", start, nan)
            self.add("posinf", start, posinf)
        row_max, arg_max = reduced.row_max, reduced.arg_max
        self.add("all-neginf", start, row_max == -math.inf)
        z_true = z.gather(1, y[:, None])[:, 0]
        self.add("true-neginf", start, (z_true == -math.inf) & ~bad_label)
        if self.found:
            return y, None
        correct = (z[:, 1] >= 0) == (y == 1) if data.binary else arg_max == y
        mean, var = uniform_moments(z, reduced, has_neginf)
        return y, (row_max, z_true - row_max, correct, mean, var, has_neginf)

    def raise_first(self, device: torch.device) -> None:
        """Raise for the first kind of problem found on any rank, with the count over all ranks."""
        kinds = list(self.MESSAGES)
        counts = torch.tensor([self.found.get(k, [0])[0] for k in kinds], dtype=torch.int64, device=device)
        firsts = torch.tensor([self.found[k][2] if k in self.found else 2**62 for k in kinds], dtype=torch.int64,
                              device=device)
        all_reduce(counts)
        all_reduce(firsts, "min")
        for kind, message, count, first_index in zip(kinds, self.MESSAGES.values(), counts.tolist(), firsts.tolist(),
                                                     strict=True):
            if count:
                mine = kind in self.found and self.found[kind][2] == first_index
                first = self.found[kind][1] if mine else str(first_index)
                labels = "0..1 (binary)" if self.data.binary else f"0..{self.data.num_classes - 1}"
                raise DataError(f"{count} {message.format(labels=labels, s='' if count == 1 else 's')}; "
                               f"first at index {first}")


# -- the fit's start ---------------------------------------------------------------------------------------------------
# For the fitting rows of each chunk the scan has in memory, it keeps the largest row range (for the fit's error
# bound) and two per-row controls known exactly (``d1`` at ``beta = 0`` and as ``beta -> inf``); after the first chunk
# it fixes a geometric grid of ``GRID_POINTS`` betas centred on a short fit of a few of that chunk's rows (all-reduced,
# so every rank takes the same grid; exact, and the whole fit, when those rows are every fitting row); and it evaluates
# the NLL's derivatives at every grid beta on a deterministic row sample (a hash of the row's position, misclassified
# rows ``ERROR_WEIGHT`` times denser, about ``SAMPLE_SHARE`` of a pass), its mean ``d1`` corrected by regression on the
# controls. ``certified.py`` starts from the sign change of ``d1`` on the grid.

GRID_POINTS = 7
GRID_RATIO = 4.0
#: The grid's work on the sample, as a share of one pass over every fitting row.
SAMPLE_SHARE = 0.15
#: Below this many logit evaluations (rows x classes x grid points) the grid runs on every row.
SMALL_WORK = 1 << 21
MIN_SAMPLE_ROWS = 256
#: Misclassified rows are sampled this many times more densely than correct ones.
ERROR_WEIGHT = 8.0
#: The centring fit on a few of the first chunk's rows: its tolerance (the final one when those rows
#: are all the fitting rows) and its most evaluations (+1).
CHUNK_TOL = 1e-2
CHUNK_PASSES = 10
#: The centring fit reads about this many logits, rows evenly spread over the chunk (at least
#: MIN_CHUNK_FIT_ROWS rows), or the whole chunk when it holds at most WHOLE_CHUNK_ELEMENTS.
CHUNK_FIT_ELEMENTS = 1 << 14
MIN_CHUNK_FIT_ROWS = 64
WHOLE_CHUNK_ELEMENTS = 1 << 16
#: Sampled rows are buffered and evaluated in blocks of about this many logits; blocks this small
#: are evaluated at every grid beta in one call.
FLUSH_ELEMENTS = 1 << 19
BATCH_ELEMENTS = 1 << 19


@dataclass(frozen=True)
class ChunkRows:
    """A chunk's fitting rows as the validating scan sees them (compute dtype; a binary logit as ``[0, z]``)."""

    z: torch.Tensor  # [n, C]
    y: torch.Tensor  # [n] int64
    row_max: torch.Tensor
    true_gap: torch.Tensor  # z_y - max z
    uniform_mean: torch.Tensor  # mean over finite classes of z - max z
    uniform_var: torch.Tensor
    has_neginf: torch.Tensor  # [n] bool

    def select(self, index: torch.Tensor | slice) -> ChunkRows:
        return ChunkRows(*(getattr(self, f.name)[index] for f in dataclasses.fields(self)))

    @property
    def count(self) -> int:
        return int(self.y.shape[0])

    def controls(self) -> torch.Tensor:
        """Per-row d1 at beta = 0 and as beta -> infinity ([2, n] float64)."""
        f64 = torch.float64
        return torch.stack([self.uniform_mean.to(f64) - self.true_gap.to(f64), -self.true_gap.to(f64)])


class StartScan:
    """Accumulates, chunk by chunk of the validating scan, the :class:`FitStart` a fit begins from. Every process must
    call :meth:`add_chunk` (or :meth:`plan_empty`) and :meth:`finish`: both all-reduce, as this constructor does."""

    def __init__(self, fit_rows: torch.Tensor | None, num_rows: int, num_classes: int, device: torch.device,
                 threads: int, buffers_for: Callable[[int], Scratch]):
        self.mask: torch.Tensor | None = None
        self.local_rows = num_rows
        if fit_rows is not None:
            self.mask = torch.zeros(num_rows, dtype=torch.bool, device=device)
            self.mask[fit_rows.to(device)] = True
            self.local_rows = int(self.mask.sum())
        self.num_classes, self.device = num_classes, device
        self.offset = rank_offset(num_rows, device)  # this process's first row over all processes
        self.threads = threads  # the grid's betas are shared among them (each thread's buffers: buffers_for)
        self.buffers_for, self.buffers = buffers_for, buffers_for(0)
        self.total_rows = 0
        self.planned = False
        self.betas: list[float] = []
        self.exact_points: list[NllDerivatives] = []  # the centring fit's passes, when its rows are every row
        self.rates = (1.0, 1.0)  # sampling rate of correct rows, of misclassified rows
        self.reference_beta = 1.0
        f64 = torch.float64
        self.grid_sums = torch.zeros(GRID_POINTS, len(FIELDS), dtype=f64, device=device)
        # Regression of the sample's per-row d1 on the two controls x1, x2:
        # [sum w, w x1, w x2, w x1^2, w x1 x2, w x2^2] and per grid point [w d1, w d1 x1, w d1 x2].
        self.moments = torch.zeros(6, dtype=f64, device=device)
        self.cross = torch.zeros(GRID_POINTS, 3, dtype=f64, device=device)
        self.control_sums = torch.zeros(2, dtype=f64, device=device)  # over every fitting row
        self.span = torch.zeros((), dtype=f64, device=device)
        self.resident: ChunkRows | None = None  # every fitting row, when the first chunk held them all
        self._buffer: list[tuple[ChunkRows, torch.Tensor]] = []
        self._buffered = 0

    # -- per chunk -----------------------------------------------------------------------
    def add_chunk(self, position: int, rows: ChunkRows, low: torch.Tensor | None = None) -> None:
        """One validated chunk: its rows from ``position`` on (among this process's rows); ``low``: their
        minima, when known."""
        n = rows.count
        keep = None if self.mask is None else self.mask[position : position + n]
        spread = row_range(rows.z, rows.row_max, low)
        if not self.planned:
            self._plan(rows if keep is None else rows.select(keep), spread if keep is None else spread[keep])
        x = rows.controls()
        if keep is not None:
            spread, x = spread[keep], x[:, keep]
        if spread.numel():
            self.span = torch.maximum(self.span, spread.max().to(torch.float64))
        self.control_sums += x.sum(1)
        positions = torch.arange(position, position + n, device=rows.z.device) + self.offset
        index, weights = self._sample(positions, rows.true_gap == 0, keep)
        if index.numel():
            self._buffer.append((rows.select(index), weights))
            self._buffered += int(index.numel()) * self.num_classes
            if self._buffered >= FLUSH_ELEMENTS:
                self._flush()

    def plan_empty(self, dtype: torch.dtype) -> None:
        """Plan with no rows (a process without rows, or a first chunk with bad values): the all-reduces match."""
        if not self.planned:
            real = torch.zeros(0, dtype=dtype, device=self.device)
            self._plan(ChunkRows(torch.zeros(0, self.num_classes, dtype=dtype, device=self.device),
                                 torch.zeros(0, dtype=torch.int64, device=self.device), real, real, real, real,
                                 torch.zeros(0, dtype=torch.bool, device=self.device)), real)

    def _sample(self, positions: torch.Tensor, on_top: torch.Tensor, keep: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Indices (within the chunk) of the sampled fitting rows and their float64 weights (inverse rates)."""
        rate_correct, rate_wrong = self.rates
        device = on_top.device
        if rate_correct <= 0 and rate_wrong <= 0:  # the two fast paths save small data ~30 us a chunk
            return torch.zeros(0, dtype=torch.int64, device=device), torch.zeros(0, dtype=torch.float64, device=device)
        if rate_correct >= 1 and rate_wrong >= 1:
            index = torch.arange(on_top.shape[0], device=device) if keep is None else keep.nonzero()[:, 0]
            return index, torch.ones(index.shape[0], dtype=torch.float64, device=device)
        u = ((positions * 2654435761) & 0xFFFFFFFF).to(torch.float64) / 2.0 ** 32
        rate = torch.where(on_top, rate_correct, rate_wrong).to(torch.float64)
        chosen = u < rate
        index = (chosen if keep is None else chosen & keep).nonzero()[:, 0]
        return index, 1.0 / rate[index]

    # -- planning ------------------------------------------------------------------------
    def _plan(self, rows: ChunkRows, spread: torch.Tensor) -> None:
        """Grid and sampling rates from the first chunk; all-reduced, so every process plans alike."""
        f64 = torch.float64
        few = chunk_fit_rows(rows.count, self.num_classes)
        counts = torch.tensor([rows.count, len(range(rows.count)[few]), self.local_rows], dtype=f64, device=self.device)
        local = torch.stack([rows.controls()[0].sum(), rows.uniform_var.to(f64).sum(),
                             (rows.true_gap == 0).sum().to(f64)])
        slope, curvature, on_top, n, few_rows, total = all_reduce(torch.cat([local, counts])).tolist()
        self.planned, self.total_rows = True, int(total)
        centre = 1.0
        if curvature > 0:
            centre = -slope / curvature if slope < 0 else math.sqrt(n / curvature)
        everything = few_rows == total  # the centring fit reads every fitting row: it is the fit itself
        if slope < 0 and on_top < n:
            largest = spread.max().to(f64) if rows.count else torch.zeros((), dtype=f64, device=self.device)
            span = float(all_reduce(largest.reshape(1), "max")[0])
            centre = self._centring_fit(rows.select(few), FitStart(int(n), self.num_classes, span,
                                                                   reference_beta=centre), everything)
        self.reference_beta = centre
        if self.exact_points:
            self.rates = (0.0, 0.0)  # no grid: the centring fit's passes over every row replace it
            return
        half = GRID_POINTS // 2
        self.betas = [min(max(centre * GRID_RATIO ** (j - half), BETA_MIN), BETA_MAX) for j in range(GRID_POINTS)]
        self.rates = self._rates(on_top / max(n, 1.0))

    def _centring_fit(self, rows: ChunkRows, start: FitStart, everything: bool) -> float:
        """A short fit on a few rows (each evaluation all-reduced); the grid's centre, or start's reference."""
        z = rows.z.contiguous()
        impossible = bool(rows.has_neginf.any())
        points: list[NllDerivatives] = []

        def evaluate(beta: float) -> NllDerivatives:
            sums = row_cumulants(z, rows.y, beta, self.buffers, top=rows.row_max, impossible=impossible)
            points.append(NllDerivatives.from_sums(beta, all_reduce(sums)))
            return points[-1]

        result = certified_fit(start, evaluate, tol=TOL if everything else CHUNK_TOL, max_passes=CHUNK_PASSES)
        if everything:
            self.resident = rows  # every fitting row is in memory: subset fits evaluate them without a read
        if result.bound is None and (result.converged or everything):
            if everything:
                self.exact_points = sorted(points, key=lambda p: p.beta)
            return result.beta
        return start.reference_beta

    def _rates(self, accuracy: float) -> tuple[float, float]:
        """Sampling rates (correct rows, misclassified rows) for the grid's budget."""
        n, c = self.total_rows, self.num_classes
        if n * c * GRID_POINTS <= SMALL_WORK or n <= 0:
            return 1.0, 1.0
        target = min(float(n), max(float(MIN_SAMPLE_ROWS), SAMPLE_SHARE * n / GRID_POINTS)) / n
        rate_correct = target / (accuracy + ERROR_WEIGHT * (1 - accuracy))
        rate_wrong = ERROR_WEIGHT * rate_correct
        if rate_wrong > 1:  # every misclassified row; the rest of the budget goes to correct ones
            rate_wrong = 1.0
            rate_correct = (target - (1 - accuracy)) / accuracy if accuracy > 0 else 1.0
        return min(max(rate_correct, 1.0 / n), 1.0), rate_wrong

    # -- the grid and the end ----------------------------------------------------------------
    def _flush(self) -> None:
        """Evaluate the buffered sample at every grid beta and add its weighted sums and regression moments."""
        if not self._buffer:
            return
        rows = ChunkRows(*(torch.cat([getattr(r, f.name) for r, _ in self._buffer])
                           for f in dataclasses.fields(ChunkRows)))
        w = torch.cat([weights for _, weights in self._buffer])
        self._buffer, self._buffered = [], 0
        x = rows.controls()
        self.moments += torch.stack([w, w * x[0], w * x[1], w * x[0] ** 2, w * x[0] * x[1], w * x[1] ** 2]).sum(1)
        terms = self._grid_terms(rows)
        self.grid_sums += terms @ w
        self.cross += terms[:, 2] @ torch.stack([w, w * x[0], w * x[1]]).T

    def _grid_terms(self, rows: ChunkRows) -> torch.Tensor:
        """Per grid beta and row, the float64 terms of :func:`row_terms`: [grid, FIELDS, rows]."""
        z, y, k, n = rows.z, rows.y, len(self.betas), rows.count
        z_true = z.gather(1, y[:, None])[:, 0]
        impossible = bool(rows.has_neginf.any())
        if z.numel() * k <= BATCH_ELEMENTS:  # small blocks: every grid beta in one call
            betas = torch.tensor(self.betas, dtype=torch.float64, device=z.device).repeat_interleave(n)
            moments = row_moments(z.repeat(k, 1), betas, y.repeat(k), self.buffers, top=rows.row_max.repeat(k),
                                  impossible=impossible)
            return row_terms(moments, z_true.repeat(k), betas).view(len(FIELDS), k, n).transpose(0, 1)
        def terms(k: int, worker: int) -> torch.Tensor:
            beta = self.betas[k]
            moments = row_moments(z, beta, y, self.buffers_for(worker), top=rows.row_max, impossible=impossible)
            return row_terms(moments, z_true, beta)

        return torch.stack(map_blocks(terms, len(self.betas), self.threads))

    def finish(self) -> FitStart:
        """The all-reduced summary (every process calls it)."""
        self._flush()
        parts = [self.control_sums, self.grid_sums.flatten(), self.moments, self.cross.flatten()]
        flat = all_reduce(torch.cat(parts)).cpu()
        control_sums, grid_sums, moments, cross = torch.split(flat, [part.numel() for part in parts])
        span = float(all_reduce(self.span.reshape(1).clone(), "max")[0])
        rows = self.total_rows
        if self.exact_points:
            return FitStart(rows, self.num_classes, span, tuple(self.exact_points), True, self.reference_beta,
                            self.resident)
        grid_sums, cross = grid_sums.view(GRID_POINTS, len(FIELDS)), cross.view(GRID_POINTS, 3)
        grid = [NllDerivatives.from_sums(beta, grid_sums[k]) for k, beta in enumerate(self.betas)]
        exact = self.rates == (1.0, 1.0)
        if not grid or float(moments[0]) <= 0 or rows <= 0:
            return FitStart(rows, self.num_classes, span, reference_beta=self.reference_beta, rows=self.resident)
        if not exact:
            d1 = regression_estimates(moments, cross, control_sums / rows)
            grid = [dataclasses.replace(g, d1=float(v)) for g, v in zip(grid, d1.tolist(), strict=True)]
        return FitStart(rows, self.num_classes, span, tuple(grid), exact, self.reference_beta, self.resident)


def rank_offset(num_rows: int, device: torch.device) -> int:
    """The position of this process's first row in the data over all processes (rows are shared out in rank
    order), so that a row is sampled alike however many processes read the data."""
    if not active():
        return 0
    sizes = all_gather_rows(torch.tensor([num_rows], dtype=torch.int64, device=device))
    return int(sizes[: rank()].sum())


def chunk_fit_rows(num_rows: int, num_classes: int) -> slice:
    """The first chunk's rows the centring fit reads: all of a small chunk, else about CHUNK_FIT_ELEMENTS
    logits' worth of rows evenly spread."""
    if num_rows * num_classes <= WHOLE_CHUNK_ELEMENTS:
        return slice(0, num_rows)
    few = max(MIN_CHUNK_FIT_ROWS, CHUNK_FIT_ELEMENTS // num_classes)
    step = max(1, num_rows // few)
    return slice(0, step * few, step)


def regression_estimates(moments: torch.Tensor, cross: torch.Tensor, exact_means: torch.Tensor) -> torch.Tensor:
    """Mean d1 at each grid beta by the regression estimator: ``mean_w(d1) + b . (mean_full(x) - mean_w(x))``, ``b``
    the weighted least-squares slope of per-row d1 on the exactly known controls ``x``."""
    w, wx1, wx2, wx11, wx12, wx22 = moments.tolist()
    mx = torch.tensor([wx1, wx2], dtype=torch.float64) / w
    cov = torch.tensor([[wx11, wx12], [wx12, wx22]], dtype=torch.float64) / w - torch.outer(mx, mx)
    my = cross[:, 0] / w
    cxy = cross[:, 1:] / w - my[:, None] * mx[None, :]
    # A tiny ridge keeps a degenerate control (e.g. every sampled row correct: x2 = 0) harmless.
    ridge = 1e-12 * float(cov.diagonal().abs().max()) + 1e-300
    slopes = torch.linalg.solve(cov + ridge * torch.eye(2, dtype=torch.float64), cxy.T).T
    return my + slopes @ (exact_means - mx)


__all__ = ["GRID_POINTS", "ChunkRows", "Problems", "Reductions", "StartScan", "chunk_fit_rows", "probability_like",
           "rank_offset", "regression_estimates", "row_reductions", "uniform_moments"]
