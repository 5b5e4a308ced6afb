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
"""

from __future__ import annotations

import itertools
import math

import torch

from .scan import Scan, bin_edges, bin_index

#: The searched range is T* / SPAN .. T* * SPAN around the NLL optimum T*.
SPAN = 100.0
INITIAL_POINTS = 65
MAX_ROUNDS = 40


def _bin_index(confidence: torch.Tensor, bins: int) -> torch.Tensor:
    return bin_index(confidence, bin_edges(bins, confidence.device))


def minimise_ece(scan: Scan, centre: float, *, bins: int, tol: float = 1e-4, span: float = SPAN
                 ) -> tuple[float, float, bool]:
    """Search log T in [log(centre / span), log(centre * span)]; returns ``(T, ECE, certified)``.

    ``certified`` is False only when ``MAX_ROUNDS`` rounds of splitting were not enough.
    Per-sample confidences are kept only for the ends of intervals still open.
    """
    correct = scan.stats.correct.to(torch.float64)
    n = max(scan.num_samples, 1)
    ece: dict[float, float] = {}
    samples: dict[float, tuple[torch.Tensor, torch.Tensor]] = {}

    def evaluate(thetas: list[float]) -> None:
        results = scan.calibration([math.exp(-t) for t in thetas], bins, keep_scores=True)
        for theta, (sums, scores) in zip(thetas, results, strict=True):
            ece[theta] = float((sums.bin_correct - sums.bin_confidence).abs().sum()) / n
            assert scores is not None
            confidence = scores["confidence"]
            samples[theta] = (confidence, _bin_index(confidence, bins))

    def lower_bound(a: float, b: float) -> float:
        (conf_a, bin_a), (conf_b, bin_b) = samples[a], samples[b]
        slack = torch.maximum((correct - conf_a).abs(), (correct - conf_b).abs())
        drift = scan.sum((conf_b - conf_a).abs() + 2 * (bin_b - bin_a).abs() * slack) / n
        return max(ece[a], ece[b]) - drift

    low, high = math.log(centre / span), math.log(centre * span)
    grid = [low + (high - low) * k / (INITIAL_POINTS - 1) for k in range(INITIAL_POINTS)]
    evaluate(grid)
    open_intervals = list(itertools.pairwise(grid))
    certified = False
    for _ in range(MAX_ROUNDS):
        best = min(ece.values())
        open_intervals = [(a, b) for a, b in open_intervals if lower_bound(a, b) < best - tol and b - a > 1e-12]
        keep = {t for interval in open_intervals for t in interval}
        for theta in [t for t in samples if t not in keep]:
            del samples[theta]
        if not open_intervals:
            certified = True
            break
        middles = [(a + b) / 2 for a, b in open_intervals]
        evaluate(middles)
        open_intervals = [half for (a, b), m in zip(open_intervals, middles, strict=True) for half in ((a, m), (m, b))]
    best_theta = min(ece, key=lambda t: ece[t])
    return math.exp(best_theta), ece[best_theta], certified
