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

from .scan import Scan

#: The searched range is T* / SPAN .. T* * SPAN around the NLL optimum T*.
SPAN = 100.0
INITIAL_POINTS = 65
MAX_ROUNDS = 40


def minimise_ece(scan: Scan, centre: float, *, bins: int, tol: float = 1e-4, span: float = SPAN
                 ) -> tuple[float, float, bool]:
    """Search log T in [log(centre / span), log(centre * span)]; returns ``(T, ECE, certified)``.

    ``certified`` is False only when ``MAX_ROUNDS`` rounds of splitting were not enough. Each pass evaluates
    the new midpoints and the bound of every half interval at once, keeping nothing per row.
    """
    n = max(scan.num_samples, 1)
    ece: dict[float, float] = {}
    drift: dict[tuple[float, float], float] = {}

    def evaluate(thetas: list[float]) -> None:
        """The ECE at each of the sorted ``thetas`` and the drift between each two neighbours, in one pass."""
        per_bin, between = scan.ece_terms([math.exp(-t) for t in thetas], bins)
        for theta, sums in zip(thetas, per_bin, strict=True):
            ece[theta] = float((sums[2] - sums[1]).abs().sum()) / n
        for pair, value in zip(itertools.pairwise(thetas), between.tolist(), strict=True):
            drift[pair] = value / n

    def lower_bound(a: float, b: float) -> float:
        return max(ece[a], ece[b]) - drift[a, b]

    low, high = math.log(centre / span), math.log(centre * span)
    grid = [low + (high - low) * k / (INITIAL_POINTS - 1) for k in range(INITIAL_POINTS)]
    evaluate(grid)
    open_intervals = list(itertools.pairwise(grid))
    certified = False
    for _ in range(MAX_ROUNDS):
        best = min(ece.values())
        open_intervals = [(a, b) for a, b in open_intervals if lower_bound(a, b) < best - tol and b - a > 1e-12]
        drift.clear()  # every bound still needed is recomputed with its halves
        if not open_intervals:
            certified = True
            break
        middles = [(a + b) / 2 for a, b in open_intervals]
        evaluate(sorted({t for (a, b), m in zip(open_intervals, middles, strict=True) for t in (a, m, b)}))
        open_intervals = [half for (a, b), m in zip(open_intervals, middles, strict=True) for half in ((a, m), (m, b))]
    best_theta = min(ece, key=lambda t: ece[t])
    return math.exp(best_theta), ece[best_theta], certified
