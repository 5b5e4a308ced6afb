"""The temperature that minimises the binned ECE, by a branch-and-bound search with a certified tolerance.

ECE(T) is piecewise smooth in T and jumps where a confidence crosses a bin edge, so a
local optimiser can stall on a step. The search instead bounds ECE from below on every
interval [T_a, T_b] between evaluated temperatures and keeps splitting the intervals
whose bound could still beat the best value found, until none can by more than ``tol``.

The bound: every confidence ``conf_i(T)`` (the max softmax) decreases monotonically in T.
Moving T from one end of the interval changes ECE = sum_b |sum_{i in b} (c_i - conf_i)| / N
by at most ``D = (1/N) sum_i (|conf_i(T_b) - conf_i(T_a)| + 2 k_i m_i)``, where ``k_i`` is
the number of bin edges sample i crosses between the ends and ``m_i`` the larger of
``|c_i - conf_i|`` at the two ends: a change of confidence inside a bin moves one bin's
sum by that much, and a crossing moves ``c_i - conf_i`` from one bin's sum to another's.
So ``min ECE on [T_a, T_b] >= max(ECE(T_a), ECE(T_b)) - D``, and once every interval's
bound is at least ``best - tol``, no temperature in the searched range has an ECE lower
than the returned one by more than ``tol``. Each round of splits is one pass.

Memory: both terms are sums over rows, so each pass computes, chunk by chunk, the confidences at every
temperature it needs (the new midpoints and the ends of their intervals) and keeps only per-bin sums and
one drift per interval (:mod:`tempcal.core.ece_terms`): nothing per row between chunks or passes, and the
sums all-reduce across processes like every other pass.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch

from .scan import Scan

#: The searched range is T* / SPAN .. T* * SPAN around the NLL optimum T*.
SPAN = 100.0
INITIAL_POINTS = 65
MAX_ROUNDS = 40


Terms = Callable[[list[float], int], tuple[torch.Tensor, torch.Tensor]]


def minimise_ece(scan: Scan, centre: float, *, bins: int, tol: float = 1e-4, span: float = SPAN,
                 terms: Terms | None = None) -> tuple[float, float, bool]:
    """Search log T in [log(centre / span), log(centre * span)]; returns ``(T, ECE, certified)``.

    ``certified`` is False only when ``MAX_ROUNDS`` rounds of splitting were not enough. Each pass evaluates
    the new midpoints and the bound of every half interval at once, keeping nothing per row. ``terms``
    (default: :meth:`Scan.ece_terms`) is the pass, for searches that ride on this one's reads.
    """
    n = max(scan.num_samples, 1)
    terms = terms or scan.ece_terms
    search = EceSearch(centre, tol=tol, span=span)
    while thetas := search.wanted:
        per_bin, between = terms([math.exp(-t) for t in thetas], bins)
        search.take([float((sums[2] - sums[1]).abs().sum()) / n for sums in per_bin],
                    [value / n for value in between.tolist()])
    return search.result()


class EceSearch:
    """One branch-and-bound search, a round at a time: :attr:`wanted` the sorted log-temperatures to evaluate
    next (empty once done), :meth:`take` their ECE and the drift between each two neighbours.

    A ``penalty`` ``(weight, theta0)`` adds ``weight * (theta - theta0)^2`` to the ECE (a group's search drawn
    toward a global T); the bound on an interval adds the penalty's minimum over it.
    """

    def __init__(self, centre: float, *, tol: float = 1e-4, span: float = SPAN,
                 penalty: tuple[float, float] | None = None):
        self.tol, self.penalty = tol, penalty
        low, high = math.log(centre / span), math.log(centre * span)
        self.wanted = [low + (high - low) * k / (INITIAL_POINTS - 1) for k in range(INITIAL_POINTS)]
        self.ece: dict[float, float] = {}
        self.drift: dict[tuple[float, float], float] = {}
        self.open_intervals = list(itertools.pairwise(self.wanted))
        self.rounds = 0
        self.certified = False

    def value(self, theta: float) -> float:
        """The searched objective at an evaluated ``theta``: the ECE, plus the penalty."""
        return self.ece[theta] + self._penalty(theta, theta)

    def _penalty(self, a: float, b: float) -> float:
        """The penalty's minimum on ``[a, b]`` (0 without one)."""
        if self.penalty is None:
            return 0.0
        weight, centre = self.penalty
        nearest = min(max(centre, a), b)
        return weight * (nearest - centre) ** 2

    def take(self, ece: list[float], drift: list[float]) -> None:
        """The ECE at each of :attr:`wanted` and the drift between each two neighbours; then the next round."""
        thetas = self.wanted
        self.ece.update(zip(thetas, ece, strict=True))
        self.drift.update(zip(itertools.pairwise(thetas), drift, strict=True))
        self.wanted = []
        if self.rounds >= MAX_ROUNDS:
            return
        self.rounds += 1
        best = min(self.value(t) for t in self.ece)
        self.open_intervals = [(a, b) for a, b in self.open_intervals
                               if self._lower_bound(a, b) < best - self.tol and b - a > 1e-12]
        self.drift.clear()  # every bound still needed is recomputed with its halves
        if not self.open_intervals:
            self.certified = True
            return
        middles = [(a + b) / 2 for a, b in self.open_intervals]
        self.wanted = sorted({t for (a, b), m in zip(self.open_intervals, middles, strict=True) for t in (a, m, b)})
        self.open_intervals = [half for (a, b), m in zip(self.open_intervals, middles, strict=True)
                               for half in ((a, m), (m, b))]

    def _lower_bound(self, a: float, b: float) -> float:
        return max(self.ece[a], self.ece[b]) - self.drift[a, b] + self._penalty(a, b)

    def result(self) -> tuple[float, float, bool]:
        """``(T, ECE, certified)`` at the best evaluated temperature."""
        best_theta = min(self.ece, key=self.value)
        return math.exp(best_theta), self.ece[best_theta], self.certified
