"""``report --conformal-alpha A``: the sets at every temperature of a report (at a fixed alpha T moves the mean set
size, not the coverage). The thresholds come from the stored split's fitting rows and the sets are judged on its
held-out rows when SOURCE has such a split (so at the stored T they equal that fit's ``after.conformal``), else from a
seeded, class-stratified half and the other half; then the sets ride on the metrics pass."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..core.scan import Scan
from ..core.splitting import stratified_split
from ..errors import TempcalError
from ..sources.base import OpenedSource
from ..workflows.common import evaluation_rows, stored_split
from .folds import group_sets
from .passes import (
    ConformalPlan,
    FoldSetSums,
    ScoreRows,
    Thresholds,
    fit_thresholds,
    grouped_results,
    score_reads,
    score_thresholds,
)
from .sets import ConformalResult


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
    group (``group_index``: every counted row's group), by :func:`.folds.group_sets`."""
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

__all__ = ["OWN_GROUP_READS", "ConformalRows", "conformal_rows", "metrics_plan", "own_group_sets", "report_group_sets",
           "report_thresholds"]
