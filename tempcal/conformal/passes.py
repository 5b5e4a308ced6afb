"""Conformal sets over a scan's chunks: the fitting rows' scores in one read (:class:`ScoreRows`), the sets' sums riding
on a pass (:class:`SetSums`, :class:`ConformalPlan` on the metrics pass, :class:`FoldSetSums` out of fold). Float64
probabilities :data:`SLICE_VALUES` at a time keep the sorted copies APS needs small whatever the chunk."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..core.parallel import all_gather_rows, all_reduce
from ..core.scan import Scan
from ..metrics.calibration import CalibrationMetrics, Finish
from .sets import (
    SCORES,
    ConformalResult,
    descending,
    logit_order,
    results,
    row_scores,
    row_sets,
    set_rows,
    thresholds,
)

#: Probabilities (rows x classes) formed at a time: 32 MB of float64, and the sorted copy beside them.
SLICE_VALUES = 1 << 22

Thresholds = dict[str, list[float]]

#: The scores one read may hold (every rank's rows, the gathered host copy of one temperature aside): 256 MiB.
SCORE_BYTES = 1 << 28
#: Bytes of scores per row and temperature: LAC and APS, float64.
ROW_BYTES = 16


def temperatures_per_read(rows: int) -> int:
    """How many temperatures' scores of ``rows`` rows (every rank's) one read holds, at least two: the one memory
    policy of every conformal path, :data:`SCORE_BYTES` by the row count alone, so every rank batches alike."""
    return max(2, SCORE_BYTES // (ROW_BYTES * max(rows, 1)))


def score_reads(rows: int, temperatures: int) -> int:
    """Reads of the scores of ``rows`` rows at ``temperatures`` temperatures (:func:`temperatures_per_read` a read)."""
    return -(-temperatures // temperatures_per_read(rows))


def probabilities(d: torch.Tensor, beta: float | torch.Tensor) -> torch.Tensor:
    """The float64 softmax at ``beta`` (a number, or float64 ``[rows, 1]``: a beta per row) of rows given as
    ``d = z - max z`` (``-inf`` entries are probability 0)."""
    p = torch.exp(d.to(torch.float64) * beta)
    return p / p.sum(1, keepdim=True)


def _slices(rows: int, classes: int) -> Iterator[tuple[int, int]]:
    step = max(1, SLICE_VALUES // max(classes, 1))
    for first in range(0, rows, step):
        yield first, min(first + step, rows)


def chunk_order(d: torch.Tensor) -> torch.Tensor:
    """Every row's classes in decreasing logit (int32), sorted a slice at a time."""
    order = torch.empty(d.shape, dtype=torch.int32, device=d.device)
    for first, stop in _slices(d.shape[0], d.shape[1]):
        order[first:stop] = logit_order(d[first:stop])
    return order


class ScoreRows:
    """Visitor keeping the LAC and APS scores of every row at each of ``count`` temperatures: ``[count, 2, rows]``
    float64, preallocated. ``row_betas`` (float64 ``[rows]``, this process's rows): each row's own beta, in place of
    the visit's (per-group temperatures)."""

    def __init__(self, count: int, rows: int, device: torch.device, row_betas: torch.Tensor | None = None):
        self.scores = torch.empty(count, len(SCORES), rows, dtype=torch.float64, device=device)
        self.row_betas = None if row_betas is None else row_betas.to(device=device, dtype=torch.float64)

    def add(self, betas: Sequence[float], d: torch.Tensor, labels: torch.Tensor, start: int) -> None:
        for k, beta in enumerate(betas):
            for first, stop in _slices(d.shape[0], d.shape[1]):
                at = beta if self.row_betas is None else self.row_betas[start + first:start + stop, None]
                found = row_scores(probabilities(d[first:stop], at), labels[first:stop])
                for j, name in enumerate(SCORES):
                    self.scores[k, j, start + first:start + stop] = found[name]

    def each_gathered(self) -> Iterator[dict[str, np.ndarray]]:
        """Per temperature, every rank's scores in rank order as numpy on the host, one temperature's copy at a time."""
        for k in range(self.scores.shape[0]):
            every = all_gather_rows(self.scores[k].T.contiguous()).cpu().numpy()  # [rows, scores]
            yield {name: every[:, j] for j, name in enumerate(SCORES)}


def gathered_scores(scan: Scan, taus: Sequence[float]) -> Iterator[dict[str, np.ndarray]]:
    """Every row's scores at each of ``taus`` (every rank's rows, on the host): one read of them per
    :func:`temperatures_per_read` temperatures (their scores held at once)."""
    step = temperatures_per_read(scan.num_samples)
    for first in range(0, len(taus), step):
        rows = ScoreRows(len(taus[first:first + step]), scan.data.num_samples, scan.device)
        scan.visit([1.0 / t for t in taus[first:first + step]], rows)
        yield from rows.each_gathered()
        del rows


def score_thresholds(scores: dict[str, np.ndarray], alphas: Sequence[float], rows: np.ndarray | None = None
                     ) -> Thresholds:
    """Each score's threshold at every ``alpha`` from the ``rows`` (a mask; None: every row) of ``scores``."""
    return {name: thresholds(values if rows is None else values[rows], alphas) for name, values in scores.items()}


def fit_thresholds(scan: Scan, taus: Sequence[float], alphas: Sequence[float]) -> list[Thresholds]:
    """Per temperature, each score's threshold at every ``alpha`` from ``scan``'s rows (the fitting rows)."""
    return [score_thresholds(scores, alphas) for scores in gathered_scores(scan, taus)]


class SetSums:
    """Visitor summing, at the ``k``-th temperature and its ``thresholds[k]``, the rows covered and the classes in
    the sets; per group when ``groups`` (this process's rows' group numbers, ``0 <= g < num_groups``) is given;
    over the rows ``judged`` marks alone (this process's rows, bool) when it is given."""

    def __init__(self, thresholds: Sequence[Thresholds], device: torch.device, *,
                 groups: torch.Tensor | None = None, num_groups: int = 1, judged: torch.Tensor | None = None):
        self.thresholds = list(thresholds)
        self.lock = threading.Lock()
        self.groups = None if groups is None else groups.to(device=device, dtype=torch.int64)
        self.judged = None if judged is None else judged.to(device=device, dtype=torch.bool)
        self.sums = [{score: torch.zeros(num_groups, len(qs), 2, dtype=torch.float64, device=device)
                      for score, qs in t.items()} for t in self.thresholds]

    def _judged(self, d: torch.Tensor, labels: torch.Tensor, start: int) -> tuple:
        """The chunk's judged rows: ``d``, labels, groups and the classes' order."""
        groups = None if self.groups is None else self.groups[start:start + d.shape[0]]
        if self.judged is not None:
            rows = self.judged[start:start + d.shape[0]].nonzero()[:, 0]
            d, labels = d.index_select(0, rows), labels.index_select(0, rows)
            groups = None if groups is None else groups.index_select(0, rows)
        return d, labels, groups, chunk_order(d)

    def add(self, betas: Sequence[float], d: torch.Tensor, labels: torch.Tensor, start: int) -> None:
        d, labels, groups, order = self._judged(d, labels, start)
        for k, beta in enumerate(betas):
            for first, stop in _slices(d.shape[0], d.shape[1]):
                probs = probabilities(d[first:stop], beta)
                found = set_rows(probs, labels[first:stop], self.thresholds[k], descending(probs, order[first:stop]))
                _add_sets(self.sums[k], found, None if groups is None else groups[first:stop], self.lock)

    def reduced(self) -> list[dict[str, torch.Tensor]]:
        """Per temperature and score, the sums ``[groups, thresholds, 2]`` over every rank, on the host."""
        return [{score: all_reduce(values).cpu() for score, values in sums.items()} for sums in self.sums]


@dataclass(frozen=True)
class ConformalPlan:
    """Conformal sets to form in the metrics pass: the ``alphas`` and, per temperature, each score's thresholds; with
    ``judged``, only over the rows it marks, ``rows`` of them over every rank."""

    alphas: list[float]
    thresholds: list[Thresholds]
    judged: torch.Tensor | None = None  # this process's rows whose sets count (bool); None: every row
    rows: int | None = None

    def check(self, temperatures: int) -> None:
        if len(self.thresholds) != temperatures:
            raise ValueError(f"{len(self.thresholds)} sets of conformal thresholds for {temperatures} temperatures")

    def visitor(self, first: int, stop: int, device: torch.device) -> PlanSums:
        return PlanSums(replace(self, thresholds=self.thresholds[first:stop]), device)


class PlanSums(SetSums):
    """One read's :class:`SetSums` of a :class:`ConformalPlan`, which then adds each temperature's sets over every
    summed row to its result."""

    def __init__(self, plan: ConformalPlan, device: torch.device):
        super().__init__(plan.thresholds, device, judged=plan.judged)
        self.plan = plan

    def settle(self) -> Finish:
        reduced = self.reduced()

        def finish(k: int, tau: float, metrics: CalibrationMetrics, rows: int) -> CalibrationMetrics:
            n = rows if self.plan.rows is None else self.plan.rows
            sums = {score: values[0] for score, values in reduced[k].items()}
            return replace(metrics, conformal=results(self.plan.alphas, self.plan.thresholds[k], sums, n))

        return finish


class FoldSetSums:
    """Visitor forming every row's sets out of fold, nothing kept per row: in slot ``k``, row i's probabilities at
    ``betas[k][f]`` and its sets with ``thresholds[k][f]``, f its fold (``folds``: this process's rows' folds);
    summed per slot, per group when ``groups`` is given. Every fold's rows take their own temperature in the same
    softmax, so a slot is one visit whatever K: :meth:`Scan.visit`'s betas only number the slots."""

    def __init__(self, betas: Sequence[Sequence[float]], thresholds: Sequence[Sequence[Thresholds]],
                 folds: torch.Tensor, device: torch.device, *, groups: torch.Tensor | None = None,
                 num_groups: int = 1):
        f64 = torch.float64
        self.betas = [torch.tensor(list(b), dtype=f64, device=device) for b in betas]  # [K] per slot
        self.q = [{score: torch.tensor([list(t[score]) for t in per_fold], dtype=f64, device=device).T
                   for score in per_fold[0]} for per_fold in thresholds]  # per slot and score: [Q, K]
        self.folds = folds.to(device=device, dtype=torch.int64)
        self.lock = threading.Lock()
        self.groups = None if groups is None else groups.to(device=device, dtype=torch.int64)
        self.sums = {score: torch.zeros(len(self.q), num_groups, q.shape[0], 2, dtype=f64, device=device)
                     for score, q in (self.q[0].items() if self.q else ())}

    def add(self, betas: Sequence[float], d: torch.Tensor, labels: torch.Tensor, start: int) -> None:
        order = chunk_order(d)
        for k in range(len(betas)):
            for first, stop in _slices(d.shape[0], d.shape[1]):
                folds = self.folds[start + first:start + stop]
                probs = probabilities(d[first:stop], self.betas[k][folds][:, None])
                found = row_sets(probs, labels[first:stop], {s: q[:, folds] for s, q in self.q[k].items()},
                                 descending(probs, order[first:stop]))
                groups = None if self.groups is None else self.groups[start + first:start + stop]
                _add_sets({score: sums[k] for score, sums in self.sums.items()}, found, groups, self.lock)

    def reduced(self) -> dict[str, torch.Tensor]:
        """Per score, the sums ``[slots, groups, thresholds, 2]`` over every rank, on the host."""
        return {score: all_reduce(values).cpu() for score, values in self.sums.items()}


def _add_sets(sums: dict[str, torch.Tensor], found: dict[str, tuple[torch.Tensor, torch.Tensor]],
              groups: torch.Tensor | None, lock: threading.Lock) -> None:
    """Each score's rows covered and set sizes (``found``) added into its sums ``[groups, Q, 2]``: into group 0, or
    each row into its group (``groups``). The sums are counts, exact in float64, so the blocks of a pass's threads
    may add them in any order: ``lock`` only keeps two from adding at once."""
    for score, (covered, size) in found.items():
        figures = torch.stack([covered.to(torch.float64), size], -1)  # [Q, rows, 2]
        with lock:
            if groups is None:
                sums[score][0] += figures.sum(1)
            else:
                sums[score].index_add_(0, groups, figures.transpose(0, 1))


def grouped_results(alphas: Sequence[float], thresholds: Thresholds, sums: dict[str, torch.Tensor], rows: int,
                    counts: Sequence[int]) -> tuple[list[ConformalResult], list[list[ConformalResult] | None]]:
    """The sets over all ``rows`` rows and per group (None for a group without rows; ``counts``: each group's rows)
    from each score's sums ``[groups, alphas, 2]``."""
    overall = results(alphas, thresholds, {score: values.sum(0) for score, values in sums.items()}, rows)
    return overall, [results(alphas, thresholds, {score: values[g] for score, values in sums.items()}, int(n))
                     if n else None for g, n in enumerate(counts)]


__all__ = ["ROW_BYTES", "SCORE_BYTES", "ConformalPlan", "FoldSetSums", "ScoreRows", "SetSums",
           "fit_thresholds", "gathered_scores", "grouped_results", "probabilities", "score_reads", "score_thresholds",
           "temperatures_per_read"]
