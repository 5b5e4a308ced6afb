"""Split-conformal prediction sets of the contract, LAC and APS, not randomised (docs/metrics.md defines the scores,
the threshold rank and the sets): the maths of one chunk's rows, and the results from sums that reduce over chunks
and ranks like every other figure."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction

import numpy as np
import torch

SCORES = ("lac", "aps")


@dataclass(frozen=True)
class ConformalResult:
    """One score's sets at one ``alpha``: the threshold, the coverage and the mean set size on evaluation rows."""

    alpha: float
    score: str
    threshold: float
    coverage: float
    mean_size: float
    fold_thresholds: tuple[float, ...] | None = None  # out of fold: each fold's threshold, from the other folds

    def to_json(self) -> dict:
        out = asdict(self)
        out["threshold"] = _finite(self.threshold)
        if self.fold_thresholds is None:
            out.pop("fold_thresholds")
        else:
            out["fold_thresholds"] = [_finite(q) for q in self.fold_thresholds]
        return out


#: A group's coverage counts as short of 1 - alpha when a one-sided binomial test gives p below this.
SHORT_P = 0.05


def under_covered(coverage: float, n: int, alpha: float, p: float = SHORT_P) -> bool:
    """Whether ``coverage`` over ``n`` rows falls short of ``1 - alpha`` by more than chance: the probability of so
    few covered rows when each is covered with probability ``1 - alpha`` (binomial, one-sided) is below ``p``."""
    from scipy.stats import binom

    return n > 0 and bool(binom.cdf(round(coverage * n), n, 1.0 - alpha) < p)


def _finite(q: float) -> float | None:
    """JSON has no infinity: +inf (every class) is written as null."""
    return None if math.isinf(q) else q


def row_scores(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """The LAC and APS scores (float64) of each row of ``probs`` ``[rows, C]`` (float64) for its label."""
    p_y = probs.gather(1, labels[:, None].long())
    above = torch.where(probs > p_y, probs, torch.zeros((), dtype=probs.dtype, device=probs.device)).sum(1)
    return {"lac": 1.0 - p_y[:, 0], "aps": above + p_y[:, 0]}


def rank(n: int, alpha: float) -> int:
    """``ceil((n + 1)(1 - alpha))``, exactly: alpha as the decimal the user wrote (0.1 is 1/10)."""
    exact = (n + 1) * (1 - Fraction(repr(alpha)))
    return -(-exact.numerator // exact.denominator)


def thresholds(scores: np.ndarray, alphas: Sequence[float]) -> list[float]:
    """At every alpha, the ``ceil((n + 1)(1 - alpha))``-th smallest score (``+inf`` when that rank exceeds n), from
    one partition of ``scores``."""
    values = np.asarray(scores, dtype=np.float64)
    ranks = [rank(values.size, alpha) for alpha in alphas]
    inside = sorted({r - 1 for r in ranks if r <= values.size})
    ordered = np.partition(values, inside) if inside else values
    return [float(ordered[r - 1]) if r <= values.size else math.inf for r in ranks]


def set_rows(probs: torch.Tensor, labels: torch.Tensor, thresholds: Mapping[str, Sequence[float]],
             ordered: torch.Tensor | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per score, each row's sets at every threshold: ``(covered, size)``, both ``[len(thresholds), rows]``
    (whether the set holds the label; its number of classes, float64). ``ordered``: each row's probabilities
    sorted in decreasing order, when the caller has them (see :func:`row_sets`)."""
    q = {score: torch.tensor(list(values), dtype=probs.dtype, device=probs.device)[:, None]
         for score, values in thresholds.items()}
    return row_sets(probs, labels, q, ordered)


def row_sets(probs: torch.Tensor, labels: torch.Tensor, thresholds: Mapping[str, torch.Tensor],
             ordered: torch.Tensor | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`set_rows` with the thresholds as tensors ``[Q, rows]`` (each row its own, e.g. its fold's) or
    ``[Q, 1]`` (the same for every row), in ``probs``' dtype: binary searches over each row's sorted probabilities
    (class by class where rounding broke the running sums' order). ``ordered`` saves the sort."""
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    y = labels[:, None].long()
    if ordered is None:
        ordered = torch.sort(probs, dim=1, descending=True, stable=True).values
    rows = probs.shape[0]
    p_y = probs.gather(1, y)
    if "lac" in thresholds:
        q = thresholds["lac"].expand(-1, rows)  # [Q, rows]
        covered = (1.0 - p_y[:, 0])[None] <= q
        # 1 - p is non-decreasing along the decreasing p (subtraction rounds monotonically)
        sizes = torch.searchsorted(1.0 - ordered, q.T.contiguous(), right=True).T
        out["lac"] = covered, sizes.to(torch.float64)
    if "aps" in thresholds:
        q = thresholds["aps"].expand(-1, rows)
        running = ordered.cumsum(1)
        classes = probs.shape[1]
        # Classes before the first whose running sum reaches q, plus that one (all of them if none does).
        before = torch.searchsorted(running, q.T.contiguous()).T  # [Q, rows]: running sums below q
        broken = (running[:, 1:] < running[:, :-1]).any(1)
        if bool(broken.any()):
            before[:, broken] = (running[broken][None] < q[:, broken, None]).sum(2)
        sizes = (before + 1).clamp(max=classes)
        index = torch.arange(classes, device=probs.device)[None]
        position = (probs > p_y).sum(1) + ((probs == p_y) & (index < y)).sum(1)  # the label's place in the order
        out["aps"] = position[None] < sizes, sizes.to(torch.float64)
    return out


def descending(probs: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``probs`` sorted in decreasing order along each row, by the order of their logits (a softmax keeps it at any
    temperature): a gather, and a sort only of the rows where rounding broke the order."""
    ordered = probs.gather(1, order.long())
    broken = (ordered[:, 1:] > ordered[:, :-1]).any(1)
    if bool(broken.any()):
        ordered[broken] = torch.sort(probs[broken], dim=1, descending=True, stable=True).values
    return ordered


def logit_order(d: torch.Tensor) -> torch.Tensor:
    """Each row's classes in decreasing logit, as int32 (ties: lower index first)."""
    return torch.sort(d, dim=1, descending=True, stable=True).indices.to(torch.int32)


def results(alphas: Sequence[float], thresholds: Mapping[str, Sequence[float]], sums: dict[str, torch.Tensor],
            rows: int) -> list[ConformalResult]:
    """The contract's list: every alpha, LAC then APS, from the thresholds and the summed set figures."""
    out = []
    for a, alpha in enumerate(alphas):
        for score in SCORES:
            if score not in sums:
                continue
            covered, size = (float(v) for v in sums[score][a])
            out.append(ConformalResult(alpha=alpha, score=score, threshold=float(thresholds[score][a]),
                                       coverage=covered / rows if rows else math.nan,
                                       mean_size=size / rows if rows else math.nan))
    return out
