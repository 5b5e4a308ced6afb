"""The temperature that minimises the binned ECE, by a branch-and-bound search with a certified tolerance.

ECE(T) is piecewise smooth in T and jumps where a confidence crosses a bin edge, so a local optimiser can
stall on a step. The search instead bounds ECE from below on every interval [T_a, T_b] between evaluated
temperatures and splits the intervals whose bound could still beat the best value found, until none can by
more than ``tol``.

The bound: every confidence ``conf_i(T)`` (the max softmax) falls monotonically as T grows. Along the way
from T_a to T, ECE = sum_b |sum_{i in b} (c_i - conf_i)| / N moves by at most the confidence lost,
``sum_i |conf_i(T) - conf_i(T_a)|``, plus ``2 |c_i - e|`` each time a sample crosses a bin edge ``e`` (the
crossing moves ``c_i - e`` from one bin's sum to the next). Both are known from the per-bin sums alone,
because everything is monotone: the confidence lost is the fall of the confidence sum, and the correct
(and wrong) samples crossing edge ``e_j`` are the fall of the correct (wrong) count above it. So
``D(a, b) = F(a) - F(b)`` for a potential ``F`` of each temperature's sums, and ``D`` splits exactly
between the two sides of any inner T: ``ECE(T) >= max(ECE(a) - s, ECE(b) - (D - s))`` for some
``s in [0, D]``, whose least value is ``(ECE(a) + ECE(b) - D) / 2``. When exactly one crossing lies in the
interval, ECE on each side of it is within the confidence drift of that side's end, which bounds it by
about ``min(ECE(a), ECE(b))`` however near it is. Once every interval's bound is at least ``best - tol``,
no temperature in the searched range has an ECE lower than the returned one by more than ``tol``.

Each temperature is evaluated once, in one pass with all the others of its round (:func:`_pieces` says how
many), and only its per-bin sums are kept: nothing per row between chunks or passes, and the sums all-reduce
across processes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .kernels import EceTerms, confidence_bins
from .parallel import Scratch, all_reduce
from .scan import RowBlock, Scan

#: The searched range is T* / SPAN .. T* * SPAN around the NLL optimum T*.
SPAN = 100.0
INITIAL_POINTS = 17
MAX_PIECES = 16
MAX_ROUNDS = 40
#: Intervals narrower than this in log T are closed unsplit (two samples crossing edges at the same T).
MIN_WIDTH = 1e-12
#: An interval holding more than this share of its parent's crossing drift is cut into ``MAX_PIECES``.
CLUSTERED = 0.9

#: ``on_pass(passes, open_intervals)``: after each pass of the search, how many passes it has made and how
#: many intervals are still open (0 once certified).
PassCallback = Callable[[int, int], None]


def bin_sums(scan: Scan, betas: Sequence[float], bins: int) -> torch.Tensor:
    """One pass of ``scan``: the per-bin count, confidence and correct sums ``[betas, 3, bins]`` at each beta,
    all-reduced across processes, on the CPU. The blocks' confidences are computed on the pass's threads and
    binned in row order (the sums of one thread, bit for bit)."""
    terms = EceTerms(betas, bins, scan.device)

    def block(b: RowBlock, scratch: Scratch) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        d = torch.sub(b.z, b.row_max[:, None], out=scratch.like("d", b.z))
        return confidence_bins(d, terms.betas, terms.edges, scratch, b.has_neginf), b.correct

    # Per row and beta an int64 bin and a float64 confidence, and its correctness: one map over rows in memory.
    for binned, correct in scan.block_pass(block, few=True, row_bytes=16 * len(terms.betas) + 8):
        terms.add_block(binned, correct)
    return all_reduce(terms.per_bin).cpu()


@dataclass(frozen=True)
class _Point:
    """One temperature's figures, per sample: ECE, the potential ``F`` and the sum of bin indices."""

    ece: float
    confidence: float  # mean confidence: its fall is the confidence drift
    crossing: float  # the crossing potential 2/N sum_j (hits above e_j (1 - e_j) + misses above e_j e_j)
    index_sum: float  # sum of every sample's bin index: its fall counts the edges crossed


def _point(sums: torch.Tensor, n: int) -> _Point:
    """The figures of one temperature from its per-bin ``[count, confidence, correct]`` sums."""
    count, confidence, hits = sums[0], sums[1], sums[2]
    bins = count.numel()
    edges = torch.arange(1, bins, dtype=torch.float64, device=sums.device) / bins  # e_j between bin j and j + 1
    hits_above = hits.flip(0).cumsum(0).flip(0)[1:]  # correct samples in bins j + 1 and up
    misses_above = (count - hits).flip(0).cumsum(0).flip(0)[1:]
    crossing = 2 * float((hits_above * (1 - edges) + misses_above * edges).sum()) / n
    index_sum = float((count * torch.arange(bins, dtype=torch.float64, device=sums.device)).sum())
    return _Point(float((hits - confidence).abs().sum()) / n, float(confidence.sum()) / n, crossing, index_sum)


def _pair(u: float, v: float, w: float) -> float:
    """The least ``max(u - s, v - (w - s))`` over ``s in [0, w]``: the bound from two ends sharing a drift ``w``."""
    return max((u + v - w) / 2, u - w, v - w)


def lower_bound(a: _Point, b: _Point, rounding: float) -> float:
    """A lower bound of the ECE between the temperatures of ``a`` and ``b`` (``a`` the lower)."""
    drift = max(a.confidence - b.confidence, 0.0) + rounding
    crossing = max(a.crossing - b.crossing, 0.0)
    bound = _pair(a.ece, b.ece, drift + crossing)
    if round(a.index_sum - b.index_sum) == 1:  # one crossing: each side stays near its own end
        bound = max(bound, min(_pair(a.ece, b.ece - crossing, drift), _pair(a.ece - crossing, b.ece, drift)))
    return bound


def _pieces(a: _Point, b: _Point, best: float, tol: float, rounding: float, max_pieces: int, parent: float) -> int:
    """How many pieces to cut an open interval into: enough that each piece's drift fits the room its ends
    leave above ``best - tol``, were the ECE flat (2 to ``max_pieces``); ``max_pieces`` when nearly all the
    crossings of its ``parent`` interval (their drift) fell in it, as when several rows cross at one T."""
    crossing = a.crossing - b.crossing
    if crossing > CLUSTERED * parent and round(a.index_sum - b.index_sum) > 1:
        return max_pieces
    drift = a.confidence - b.confidence + crossing + rounding
    room = a.ece + b.ece - 2 * (best - tol)
    return max(2, min(max_pieces, math.ceil(drift / max(room, 1e-300))))


#: ``terms(betas, bins)``: the per-bin ``[betas, 3, bins]`` sums at ``betas``, for a search riding on other reads.
Terms = Callable[[list[float], int], torch.Tensor]


class EceSearch:
    """One branch-and-bound search over log T in [log(centre / SPAN), log(centre * SPAN)], a round at a time:
    :attr:`wanted` the sorted log-temperatures to evaluate next (empty once done), :meth:`take` their per-bin
    sums. A ``penalty`` ``(weight, theta0)`` adds ``weight * (theta - theta0)^2`` to the ECE (a group's search drawn
    toward a global T), and its minimum over an interval to the interval's bound."""

    def __init__(self, centre: float, rows: int, *, rounding: float, tol: float = 1e-4,
                 initial_points: int = INITIAL_POINTS, max_pieces: int = MAX_PIECES,
                 penalty: tuple[float, float] | None = None):
        self.n, self.rounding, self.tol = max(rows, 1), rounding, tol
        self.max_pieces, self.penalty = max_pieces, penalty
        low, high = math.log(centre / SPAN), math.log(centre * SPAN)
        self.wanted = [low + (high - low) * k / (initial_points - 1) for k in range(initial_points)]
        self.points: dict[float, _Point] = {}
        #: The intervals still open after the last round, each with its parent's crossing drift.
        self.open_intervals = [(a, b, math.inf) for a, b in itertools.pairwise(self.wanted)]
        self.rounds = 0

    @property
    def certified(self) -> bool:
        return not self.open_intervals

    def value(self, theta: float) -> float:
        """The searched objective at an evaluated ``theta``: the ECE, plus the penalty."""
        return self.points[theta].ece + self._penalty(theta, theta)

    def _penalty(self, a: float, b: float) -> float:
        """The penalty's minimum on ``[a, b]`` (0 without one)."""
        if self.penalty is None:
            return 0.0
        weight, centre = self.penalty
        return weight * (min(max(centre, a), b) - centre) ** 2

    def take(self, sums: Sequence[torch.Tensor] | torch.Tensor) -> None:
        """The per-bin ``[3, bins]`` sums at each of :attr:`wanted`; then the intervals that stay open and the
        temperatures of the next round (none once certified, or after ``MAX_ROUNDS`` rounds)."""
        for theta, one in zip(self.wanted, sums, strict=True):
            self.points[theta] = _point(one, self.n)
        self.rounds += 1
        points, tol = self.points, self.tol
        best = min(self.value(t) for t in points)
        self.open_intervals = [(a, b, parent) for a, b, parent in self.open_intervals if b - a > MIN_WIDTH
                               and lower_bound(points[a], points[b], self.rounding) + self._penalty(a, b) < best - tol]
        self.wanted = []
        if not self.open_intervals or self.rounds > MAX_ROUNDS:
            return
        cuts = [_pieces(points[a], points[b], best - self._penalty(a, b), tol, self.rounding, self.max_pieces, parent)
                for a, b, parent in self.open_intervals]
        inner = [[a + (b - a) * k / m for k in range(1, m)]
                 for (a, b, _), m in zip(self.open_intervals, cuts, strict=True)]
        self.wanted = sorted(t for ts in inner for t in ts)
        self.open_intervals = [(*piece, points[a].crossing - points[b].crossing)
                               for (a, b, _), ts in zip(self.open_intervals, inner, strict=True)
                               for piece in itertools.pairwise([a, *ts, b])]

    def result(self) -> tuple[float, float, bool]:
        """``(T, ECE, certified)`` at the best evaluated temperature."""
        theta = min(self.points, key=self.value)
        return math.exp(theta), self.points[theta].ece, self.certified


def minimise_ece(scan: Scan, centre: float, *, bins: int, tol: float = 1e-4, initial_points: int = INITIAL_POINTS,
                 max_pieces: int = MAX_PIECES, on_pass: PassCallback | None = None,
                 terms: Terms | None = None) -> tuple[float, float, bool]:
    """Search log T in [log(centre / SPAN), log(centre * SPAN)], one pass per round; returns ``(T, ECE, certified)``
    (False only when ``MAX_ROUNDS`` rounds were not enough). ``terms`` replaces the pass."""
    search = EceSearch(centre, scan.num_samples, rounding=rounding_of(scan), tol=tol, initial_points=initial_points,
                       max_pieces=max_pieces)
    while search.wanted:
        betas = [math.exp(-t) for t in search.wanted]
        search.take(bin_sums(scan, betas, bins) if terms is None else terms(betas, bins).cpu())
        if on_pass is not None:
            on_pass(search.rounds, len(search.open_intervals))
    return search.result()


def rounding_of(scan: Scan) -> float:
    """A few ulps of confidence per row in the scan's compute dtype, counted as drift."""
    return 16 * torch.finfo(scan.compute_dtype).eps


__all__ = ["EceSearch", "PassCallback", "Terms", "bin_sums", "lower_bound", "minimise_ece"]
