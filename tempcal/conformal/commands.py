"""The sets the commands form. ``fit`` by subset: out of fold (``--folds K``: fold k's rows get their sets with the
thresholds of the other folds' rows, at T = 1 and at T_k; ``threshold`` is the deployed one from all rows;
docs/metrics.md) and per group of rows under the same thresholds (``--group-by``, ``report --group-by`` too), one read
of the judged rows. ``report --conformal-alpha A``: the sets at every temperature of a report (at a fixed alpha T moves
the mean set size, not the coverage); the thresholds come from the stored split's fitting rows and the sets are judged
on its held-out rows when SOURCE has such a split (so at the stored T they equal that fit's ``after.conformal``), else
from a seeded, class-stratified half and the other half; then the sets ride on the metrics pass."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..core.scan import Scan
from ..core.splitting import stratified_split
from ..errors import TempcalError
from ..metrics.calibration import CalibrationMetrics
from ..sources.base import OpenedSource
from ..subsets.cells import GroupResult, Subsets
from ..workflows.common import evaluation_rows, stored_split
from .passes import (
    ConformalPlan,
    FoldSetSums,
    ScoreRows,
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



@dataclass(frozen=True)
class ConformalRows:
    """Which rows give the thresholds (``calibration``) and which are judged (``evaluation``); ``stored``: they are
    the stored split's fitting and held-out rows, else a seeded half split."""

    calibration: np.ndarray
    evaluation: np.ndarray
    stored: bool
    seed: int

    def to_json(self) -> dict:
        return {"calibration": int(self.calibration.size), "evaluation": int(self.evaluation.size),
                "split": "stored" if self.stored else "seeded", **({} if self.stored else {"seed": self.seed})}

    def describe(self) -> str:
        where = "the stored split's fitting rows" if self.stored else f"a seeded half of SOURCE (seed {self.seed})"
        return (f"thresholds from the {self.calibration.size} rows of {where}; coverage and mean size on the "
                f"{self.evaluation.size} other rows")


def conformal_rows(opened: OpenedSource, seed: int, warnings: list[str]) -> ConformalRows:
    """The stored split's rows when SOURCE has one that held rows out, else a seeded, class-stratified half (with a
    warning when a stored split no longer matches SOURCE)."""
    try:
        split = stored_split(opened)
        held_out = evaluation_rows(opened, split) if split is not None and split.held_out else None
    except TempcalError as exc:
        warnings.append(f"{exc}; the conformal thresholds come from a seeded half of SOURCE instead")
        split, held_out = None, None
    if split is not None and held_out is not None:
        mask = np.ones(opened.data.num_samples, dtype=bool)
        mask[held_out] = False
        return ConformalRows(np.flatnonzero(mask), np.sort(held_out), True, int(split.seed))
    calibration, evaluation = stratified_split(opened.data.labels.numpy(), 0.5, seed)
    if calibration.size == 0 or evaluation.size == 0:
        raise TempcalError(f"{opened.name}: conformal sets need rows that set the thresholds and rows that judge "
                           f"them; its {opened.data.num_samples} row(s) cannot be split")
    return ConformalRows(np.sort(calibration), np.sort(evaluation), False, seed)


@dataclass(frozen=True)
class ReportSets:
    """The thresholds at each of ``taus`` and the rows they came from; ``reads``: the reads they took."""

    alphas: list[float]
    taus: list[float]
    thresholds: list[Thresholds]
    rows: ConformalRows
    reads: int


def report_thresholds(full: Scan, opened: OpenedSource, taus: Sequence[float], alphas: list[float], seed: int,
                      warnings: list[str]) -> ReportSets:
    """Each temperature's thresholds from the calibration rows of :func:`conformal_rows` (``full``: the scan of
    every row of SOURCE), as many temperatures a read as the score budget allows."""
    rows = conformal_rows(opened, seed, warnings)
    taus = [float(t) for t in taus]
    found = fit_thresholds(full.select(opened.local_rows(rows.calibration)), taus, alphas)
    return ReportSets(alphas, taus, found, rows, score_reads(int(rows.calibration.size), len(taus)))


def metrics_plan(sets: ReportSets, opened: OpenedSource, scored_all: bool) -> ConformalPlan:
    """The sets to form on the metrics pass: over the evaluation rows alone (the rows ``judged``, when every row is
    scored)."""
    judged = None
    if scored_all:
        start, stop = opened.share()
        mask = np.zeros(opened.data.num_samples, dtype=bool)
        mask[sets.rows.evaluation] = True
        judged = torch.from_numpy(mask[start:stop])
    return ConformalPlan(sets.alphas, sets.thresholds, judged=judged, rows=int(sets.rows.evaluation.size))


def report_group_sets(full: Scan, opened: OpenedSource, sets: ReportSets, group_index: np.ndarray, num_groups: int
                      ) -> tuple[list[list[ConformalResult]], list[list[list[ConformalResult] | None]]]:
    """``report --group-by``: the sets on the evaluation rows in one more read, per temperature overall and per
    group (``group_index``: every counted row's group), by :func:`group_sets`."""
    evaluation = sets.rows.evaluation
    local = torch.from_numpy(_share_groups(opened, evaluation, group_index))
    counts = np.bincount(group_index[evaluation], minlength=num_groups)
    return group_sets(full.select(opened.local_rows(evaluation)), sets.taus, sets.alphas, sets.thresholds, local,
                      [int(n) for n in counts])


def _share_groups(opened: OpenedSource, rows: np.ndarray, group_index: np.ndarray) -> np.ndarray:
    """The group (int64) of each of the sorted global ``rows`` that lie in this process's share, in order."""
    start, stop = opened.share()
    return group_index[rows[np.searchsorted(rows, start):np.searchsorted(rows, stop)]].astype(np.int64)


def own_group_sets(full: Scan, opened: OpenedSource, rows: ConformalRows, alphas: list[float],
                   group_taus: Sequence[float], group_index: np.ndarray
                   ) -> tuple[list[ConformalResult], list[list[ConformalResult] | None]]:
    """``report --group-by`` at the stored per-group temperatures: every row's scores and sets at its own group's T
    (``group_taus``, by group number; ``group_index``: every counted row's group): the thresholds from the
    calibration rows' scores at their own T (one read), the sets on the evaluation rows at theirs (one more), overall
    and per group, as a deployment that applies T_g row by row would form them."""
    betas = 1.0 / np.asarray(group_taus, dtype=np.float64)
    scan = full.select(opened.local_rows(rows.calibration))
    scores = ScoreRows(1, scan.data.num_samples, scan.device,
                       row_betas=torch.from_numpy(betas[_share_groups(opened, rows.calibration, group_index)]))
    scan.visit([1.0], scores)
    q = score_thresholds(next(scores.each_gathered()), alphas)
    evaluation, count = rows.evaluation, len(betas)
    local = torch.from_numpy(_share_groups(opened, evaluation, group_index))
    sums = FoldSetSums([betas.tolist()], [[q] * count], local, scan.device, groups=local, num_groups=count)
    full.select(opened.local_rows(evaluation)).visit([1.0], sums)  # one slot: each row at its group's T
    reduced = {score: values[0] for score, values in sums.reduced().items()}  # [groups, alphas, 2]
    counts = np.bincount(group_index[evaluation], minlength=count)
    return grouped_results(alphas, q, reduced, int(evaluation.size), counts.tolist())


#: Reads :func:`own_group_sets` takes: the calibration rows' scores, then the evaluation rows' sets.
OWN_GROUP_READS = 2

__all__ = ["GROUP_SET_READS", "OWN_GROUP_READS", "ConformalRows", "conformal_rows", "fit_group_sets", "fold_sets",
           "fold_thresholds", "group_sets", "metrics_plan", "own_group_sets", "report_group_sets", "report_thresholds"]
