"""``fit``'s conformal sets by subset: out of fold (``--folds K``: fold k's rows get their sets with the thresholds of
the other folds' rows, at T = 1 and at T_k; ``threshold`` is the deployed one from all rows; docs/metrics.md) and
per group of rows under the same thresholds (``--group-by``, ``report --group-by`` too), one read of the judged rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..core.scan import Scan
from ..metrics.calibration import CalibrationMetrics
from ..sources.base import OpenedSource
from ..subsets.cells import GroupResult, Subsets
from .passes import (
    FoldSetSums,
    SetSums,
    Thresholds,
    fit_thresholds,
    gathered_scores,
    grouped_results,
    score_reads,
    score_thresholds,
)
from .sets import ConformalResult

#: Reads ``fit``'s grouped sets take beyond the fit: the fitting rows' scores, then the evaluation rows' sets.
GROUP_SET_READS = 2


def group_sets(scan: Scan, taus: Sequence[float], alphas: Sequence[float], thresholds: Sequence[Thresholds],
               groups: torch.Tensor, counts: Sequence[int]
               ) -> tuple[list[list[ConformalResult]], list[list[list[ConformalResult] | None]]]:
    """The sets on ``scan``'s rows at each of ``taus`` with its ``thresholds``, in one read: per temperature, over
    every row and per group (``groups``: this process's rows' group numbers; ``counts``: each group's rows over
    every rank; None for a group without rows)."""
    sums = SetSums(thresholds, scan.device, groups=groups, num_groups=len(counts))
    scan.visit([1.0 / t for t in taus], sums)
    found = [grouped_results(alphas, thresholds[k], s, scan.num_samples, counts) for k, s in enumerate(sums.reduced())]
    return [overall for overall, _ in found], [per_group for _, per_group in found]


def place_group_sets(groups: Sequence[GroupResult], slot: int, found: Sequence[list[ConformalResult] | None]
                     ) -> None:
    """Each group's sets ``found[g]`` (None: no rows judged) into its ``before`` (slot 0: T = 1) or ``after_global``
    block (slot 1)."""
    for group, sets in zip(groups, found, strict=True):
        if sets is not None:
            block = group.before_extras if slot == 0 else group.after_global_extras
            block["conformal"] = [c.to_json() for c in sets]


def fit_group_sets(fit_scan: Scan, eval_scan: Scan, evaluated: OpenedSource, eval_index: np.ndarray,
                   subsets: Subsets, alphas: list[float], global_t: float, before: CalibrationMetrics,
                   after: CalibrationMetrics) -> tuple[CalibrationMetrics, CalibrationMetrics]:
    """``before`` and ``after`` with the sets over every evaluation row; each group's blocks with its own (in its
    ``before_extras`` and ``after_global_extras``)."""
    assert subsets.groups is not None and subsets.rows is not None
    taus = [1.0, global_t]
    thresholds = fit_thresholds(fit_scan, taus, alphas)
    start, stop = evaluated.share()
    mine = (eval_index >= start) & (eval_index < stop)  # this process's evaluation rows, in order
    local = torch.from_numpy(subsets.rows[mine].astype(np.int64))
    overall, per_group = group_sets(eval_scan, taus, alphas, thresholds, local,
                                    [group.n_eval for group in subsets.groups])
    for slot in (0, 1):
        place_group_sets(subsets.groups, slot, per_group[slot])
    return replace(before, conformal=overall[0]), replace(after, conformal=overall[1])


@dataclass
class FoldThresholds:
    """The deployed thresholds (all rows; T = 1, the deployed T) and each fold's (the other folds' rows; T = 1,
    T_k), each a :data:`Thresholds` per temperature or per fold."""

    deployed: list[Thresholds]
    before: list[Thresholds]
    after: list[Thresholds]


def fold_thresholds(scan: Scan, folds: np.ndarray, global_t: float, fold_ts: Sequence[float],
                    alphas: Sequence[float]) -> FoldThresholds:
    """Every threshold the out-of-fold sets need, from the scores of every row (``folds``: each row's fold, over all
    ranks) at T = 1, ``global_t`` and each fold's T, :func:`.passes.temperatures_per_read` a read."""
    found = FoldThresholds([], [], [])
    for i, scores in enumerate(gathered_scores(scan, [1.0, global_t, *fold_ts])):
        if i < 2:
            found.deployed.append(score_thresholds(scores, alphas))
        if i == 0:
            found.before = [score_thresholds(scores, alphas, folds != f) for f in range(len(fold_ts))]
        if i >= 2:
            found.after.append(score_thresholds(scores, alphas, folds != i - 2))
    return found


def fold_sets(scan: Scan, loaded: OpenedSource, subsets: Subsets, alphas: list[float], global_t: float,
              before: CalibrationMetrics, after: CalibrationMetrics
              ) -> tuple[CalibrationMetrics, CalibrationMetrics, int]:
    """``before`` and ``after`` with the out-of-fold sets over every row, each group's blocks with its own, and the
    reads they took."""
    assert subsets.folds is not None and subsets.fold_rows is not None
    k, fold_ts = subsets.folds["k"], list(subsets.folds["temperatures"])
    found = fold_thresholds(scan, subsets.fold_rows, global_t, fold_ts, alphas)
    start, stop = loaded.share()
    groups = None if subsets.groups is None or subsets.rows is None else torch.from_numpy(subsets.rows[start:stop])
    sets = FoldSetSums([[1.0] * k, [1.0 / t for t in fold_ts]], [found.before, found.after],
                       torch.from_numpy(subsets.fold_rows[start:stop]), scan.device, groups=groups,
                       num_groups=len(subsets.groups or [None]))
    scan.visit([1.0, 1.0], sets)  # the slots: T = 1, then each row at its fold's T_k
    sums = sets.reduced()  # per score: [slot (T = 1, T_k), group, alpha, 2]
    overall = []
    for slot, per_fold in ((0, found.before), (1, found.after)):
        every, by_group = grouped_results(alphas, found.deployed[slot], {s: v[slot] for s, v in sums.items()},
                                          scan.num_samples, [group.n_eval for group in subsets.groups or []])
        place = {alpha: a for a, alpha in enumerate(alphas)}  # each entry with every fold's threshold
        overall.append([replace(c, fold_thresholds=tuple(q[c.score][place[c.alpha]] for q in per_fold)) for c in every])
        place_group_sets(subsets.groups or [], slot, by_group)
    reads = score_reads(subsets.fold_rows.size, k + 2) + 1  # the scores at T = 1, the deployed T and each T_k
    return replace(before, conformal=overall[0]), replace(after, conformal=overall[1]), reads


__all__ = ["GROUP_SET_READS", "fit_group_sets", "fold_sets", "fold_thresholds", "group_sets"]
