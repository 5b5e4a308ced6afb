"""Cells of rows (a group, a fold, a group within a fold): the passes whose sums are kept per cell, and the figures.

Every subset that folds and groups fit a T on is a union of cells (group g in fold k: cell ``g * K + k``), and every
figure is a sum over rows, so one read serves all the fits: each block's rows are evaluated at one beta per *slot*
(``betas[slot, cell]``) and added into their cell in row order (the figures of one thread, bit for bit); a fit
outside fold k reads ``total - fold k``. Figures that rank a subset's own rows (risk-coverage, smooth ECE) come from
the rows the pass kept (:func:`~tempcal.metrics.decisions.subset_decisions`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..core.certified import CertifiedFit
from ..core.fitting import FitResult
from ..core.kernels import FIELDS, bin_edges, bin_index, row_calibration, row_moments, row_terms
from ..core.parallel import (
    Scratch,
    all_gather_rows,
    all_reduce,
    block_bounds,
    map_blocks,
    pass_threads,
    single_threaded,
)
from ..core.scan import CalibrationSums, RowBlock, Scan
from .options import Asked, check_folds

if TYPE_CHECKING:  # the figures' modules load when figures are made: a plain fit with groups needs none
    from ..metrics.calibration import CalibrationMetrics


@dataclass(frozen=True)
class CellLayout:
    """Each of this process's rows' cell (``group * folds + fold``), and the numbers of groups and folds."""

    cells: torch.Tensor  # [n] int64 on the scan's device
    groups: int = 1
    folds: int = 1

    @property
    def count(self) -> int:
        return self.groups * self.folds

    @classmethod
    def of(cls, groups: torch.Tensor | None, count: int, folds: np.ndarray | None, k: int, device: torch.device
           ) -> CellLayout:
        """The layout of rows in these groups (``0..count-1``; None: one group) and folds (``0..k-1``; None: one)."""
        g = 0 if groups is None else groups.to(torch.int64) * k
        return cls(torch.as_tensor(g + (0 if folds is None else torch.from_numpy(folds))).to(device), count, k)


def subset_keys(layout: CellLayout, groups: bool) -> list[tuple[int | None, int | None]]:
    """``(group, fold left out)`` of every subset fit, in order: each fold's (group None; with folds), then each
    group's (with ``groups``): on every row of the group, then less each fold."""
    k = layout.folds
    left_out: list[int | None] = [None, *range(k)] if k > 1 else [None]
    folds: list[tuple[int | None, int | None]] = [(None, f) for f in range(k)] if k > 1 else []
    return folds + [(g, f) for g in range(layout.groups) for f in left_out] if groups else folds


@dataclass(frozen=True)
class SubsetTemperatures:
    """The fitted temperatures: per fold, per group, per group and fold (None where not asked)."""

    folds: list[CertifiedFit] | None
    groups: list[CertifiedFit] | None
    group_folds: list[list[CertifiedFit]] | None
    warnings: list[str]

    @classmethod
    def of(cls, fits: Sequence[tuple[int | None, int | None, CertifiedFit]], layout: CellLayout,
           warnings: list[str]) -> SubsetTemperatures:
        """From each subset fit's ``(group, fold, result)``, in :func:`subset_keys` order."""
        k = layout.folds
        folds = [r for g, _, r in fits if g is None]
        groups = [r for g, f, r in fits if g is not None and f is None]
        in_folds = [r for g, f, r in fits if g is not None and f is not None]  # group by group, fold by fold
        group_folds = [in_folds[g * k:(g + 1) * k] for g in range(layout.groups)] if in_folds else None
        return cls(folds or None, groups or None, group_folds, warnings)


@dataclass(frozen=True)
class SubsetFits:
    """The global fit, and the subset temperatures fitted beside it."""

    fit: FitResult
    subsets: SubsetTemperatures

    @property
    def fold_temperatures(self) -> list[float]:
        return [1.0 / r.beta for r in self.subsets.folds or []]

    @property
    def group_temperatures(self) -> list[float]:
        return [1.0 / r.beta for r in self.subsets.groups or []]

    @property
    def group_fold_temperatures(self) -> list[list[float]]:
        return [[1.0 / r.beta for r in row] for row in self.subsets.group_folds or []]


def _slot_betas(betas: torch.Tensor) -> list[float | None]:
    """Per slot, its one beta when every cell shares it (the fast kernel), else None."""
    first = betas[:, :1]
    return [float(first[s, 0]) if bool((betas[s] == first[s]).all()) else None for s in range(betas.shape[0])]


def cell_objective(scan: Scan, betas: torch.Tensor, cells: torch.Tensor, rows: Any = None) -> torch.Tensor:
    """One pass at ``betas`` ``[slots, cells]``: float64 sums of :data:`FIELDS` ``[slots, cells, FIELDS]`` (all ranks);
    ``cells``: each of this process's rows' cell; ``rows``: every row, kept by the validating scan (then no read)."""
    betas = betas.to(torch.float64).cpu()
    slots, count = betas.shape
    one = _slot_betas(betas)
    on_device = betas.to(scan.device)
    acc = torch.zeros(slots, count, len(FIELDS), dtype=torch.float64, device=scan.device)

    def terms(z: torch.Tensor, y: torch.Tensor, row_max: torch.Tensor, has_neginf: bool, cell: torch.Tensor,
              scratch: Scratch) -> torch.Tensor:
        """``[slots, rows, FIELDS]``: each row's terms at its cell's beta of each slot."""
        y = y.to(torch.int64)
        z_true = z.gather(1, y[:, None])[:, 0]
        out = []
        for s in range(slots):
            fixed = one[s]
            beta: float | torch.Tensor = fixed if fixed is not None else on_device[s][cell]
            m = row_moments(z, beta, y, scratch, top=row_max, impossible=has_neginf)
            out.append(row_terms(m, z_true, beta).T)
        return torch.stack(out)

    def block(b: RowBlock, scratch: Scratch) -> tuple[torch.Tensor, torch.Tensor]:
        cell = cells[b.start:b.start + b.z.shape[0]]
        return cell, terms(b.z, b.y, b.row_max, b.has_neginf, cell, scratch)

    def kept(i: int, worker: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = bounds[i]
        return cells[a:b], terms(rows.z[a:b], rows.y[a:b], rows.row_max[a:b], bool(rows.has_neginf[a:b].any()),
                                 cells[a:b], scan.scratch_for(worker))

    if rows is None:
        parts: Iterable[tuple[torch.Tensor, torch.Tensor]] = scan.block_pass(block)
    else:  # the kept rows in blocks of a chunk, shared among threads as a pass's blocks are
        bounds = block_bounds(rows.z.shape[0], scan.chunk_rows)
        parts = map_blocks(kept, len(bounds), pass_threads(scan.device, rows.z.numel()))
    # the blocks' C-wide work ran on the pass's threads; their rows are added into their cells here, in row order
    for cell, values in parts:
        for s in range(slots):
            acc[s].index_add_(0, cell, values[s])
    return all_reduce(acc)


@dataclass(frozen=True)
class CellCalibration:
    """A calibration pass's sums: ``[slots, groups, 5]`` (NLL, Brier, entropy, correct, confidence), the bins
    ``[slots, groups, 3, bins]`` (count, confidence, correct), the rows per group; and every row's confidence and
    NLL ``[slots, rows]`` and correctness ``[rows]`` (every rank's rows, in order)."""

    sums: torch.Tensor
    bins: torch.Tensor
    counts: torch.Tensor  # [groups] int64
    confidence: torch.Tensor
    correct: torch.Tensor
    nll: torch.Tensor

    def group(self, slot: int, group: int | None) -> CalibrationSums:
        """One slot's sums over one group's rows (None: every row)."""
        if group is None:
            sums, bins, rows = self.sums[slot].sum(0), self.bins[slot].sum(0), self.counts.sum()
        else:
            sums, bins, rows = self.sums[slot, group], self.bins[slot, group], self.counts[group]
        return CalibrationSums(int(rows), *sums.tolist(), *bins)


def cell_calibration(scan: Scan, betas: torch.Tensor, cells: torch.Tensor, groups: torch.Tensor,
                     num_groups: int, bins: int) -> CellCalibration:
    """One pass: :meth:`Scan.calibration`'s sums per slot and report group (``groups``, each row's) with each row at
    its cell's beta of each slot (``betas`` ``[slots, cells]``), and every row's confidence, NLL and correctness."""
    betas = betas.to(torch.float64).cpu()
    slots = betas.shape[0]
    one = _slot_betas(betas)
    device = scan.device
    on_device = betas.to(device)
    edges = bin_edges(bins, device)
    sums = torch.zeros(slots, num_groups, 5, dtype=torch.float64, device=device)
    per_bin = torch.zeros(slots, 3, num_groups * bins, dtype=torch.float64, device=device)
    kept: list[list[torch.Tensor]] = [[] for _ in range(2 * slots)]
    hits: list[torch.Tensor] = []

    def block(b: RowBlock, scratch: Scratch) -> tuple[int, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """A block's C-wide work: its rows' correctness and, per slot, their confidence and ``[rows, 5]`` values."""
        d = torch.sub(b.z, b.row_max[:, None], out=scratch.like("d", b.z))
        d_finite = d.nan_to_num(neginf=0.0) if b.has_neginf else d
        hit = b.correct.to(torch.float64)
        cell = cells[b.start:b.start + b.z.shape[0]]
        per_slot = []
        for s in range(slots):
            fixed = one[s]
            beta = fixed if fixed is not None else on_device[s][cell].to(b.z.dtype)
            nll, brier, entropy, confidence, _ = row_calibration(scratch, d, d_finite, b.true_gap, beta)
            values = [v.to(torch.float64) for v in (nll, brier, entropy)]  # as Scan.calibration sums them
            per_slot.append((confidence, torch.stack([*values, hit, confidence], 1)))
        return b.start, hit, per_slot

    for start, hit, per_slot in scan.block_pass(block):  # added into the groups here, in row order
        group = groups[start:start + hit.shape[0]]
        hits.append(hit)
        for s, (confidence, values) in enumerate(per_slot):
            sums[s].index_add_(0, group, values)
            slot = bin_index(confidence, edges) + group * bins
            per_bin[s, 0].index_add_(0, slot, torch.ones_like(confidence))
            per_bin[s, 1].index_add_(0, slot, confidence)
            per_bin[s, 2].index_add_(0, slot, hit)
            kept[2 * s].append(confidence)
            kept[2 * s + 1].append(values[:, 0])
    counts = all_reduce(torch.bincount(groups, minlength=num_groups)[:num_groups].to(torch.int64)).cpu()
    sums, per_bin = all_reduce(sums).cpu(), all_reduce(per_bin).cpu()
    empty = torch.empty(0, dtype=torch.float64, device=device)
    rows = torch.stack([torch.cat(parts) if parts else empty for parts in kept], 1)
    gathered = all_gather_rows(rows).T.reshape(slots, 2, -1)
    right = all_gather_rows(torch.cat(hits) if hits else empty) > 0.5
    return CellCalibration(sums, per_bin.view(slots, 3, num_groups, bins).transpose(1, 2), counts,
                           gathered[:, 0].contiguous(), right, gathered[:, 1].contiguous())


class GroupRows:
    """The rows the pass kept (confidence, NLL, correctness) sorted by group once (``rows``: every row's group, all
    ranks, in order): each group's rows are then one slice, as a mask per group would select them."""

    def __init__(self, calibration: CellCalibration, rows: torch.Tensor | np.ndarray, count: int):
        device = calibration.confidence.device
        index = torch.as_tensor(rows).to(torch.int64)
        with single_threaded():  # a few long operations; torch's threads would only add barriers to wait at
            order = torch.argsort(index, stable=True).to(device)
            self.bounds = [0, *torch.bincount(index, minlength=count)[:count].cumsum(0).tolist()]
            self.confidence = calibration.confidence[:, order]
            self.correct = calibration.correct[order]
            self.nll = calibration.nll[:, order]

    @classmethod
    def kept(cls, calibration: CellCalibration, rows: torch.Tensor | np.ndarray, count: int) -> GroupRows | None:
        """The kept rows sorted by group, or None when there are too many groups for their row figures
        (:data:`~tempcal.metrics.decisions.MAX_GROUPS`)."""
        from ..metrics.decisions import MAX_GROUPS

        return None if count > MAX_GROUPS else cls(calibration, rows, count)

    def of(self, values: torch.Tensor, group: int) -> torch.Tensor:
        """One group's rows of ``values`` (one of this object's sorted tensors, rows on the last axis)."""
        return values[..., self.bounds[group]:self.bounds[group + 1]]


def subset_metrics(calibration: CellCalibration, slot: int, tau: float, group: int | None = None,
                   rows: GroupRows | None = None) -> CalibrationMetrics | None:
    """The metrics of one slot over one subset (``group``; None: every row), or None for an empty subset; a group's
    decision figures come from ``rows`` (:meth:`GroupRows.kept`; None: none, as when there are too many groups)."""
    from ..metrics.calibration import from_sums
    from ..metrics.decisions import subset_decisions

    sums = calibration.group(slot, group)
    if sums.count == 0:
        return None
    metrics = from_sums(tau, sums)
    if group is None:
        return subset_decisions(metrics, calibration.confidence[slot], calibration.correct)
    if rows is not None:
        metrics = subset_decisions(metrics, rows.of(rows.confidence[slot], group), rows.of(rows.correct, group))
    return metrics


def metrics_block(m: CalibrationMetrics, full: bool = False) -> dict:
    """Figures as the JSON shows them: ``full`` (fit's before and after) with the reliability bins and the
    risk-coverage curve; else with the row count and neither (a group list stays compact)."""
    out: dict = {**m.summary(), "entropy": m.entropy, "mean_confidence": m.mean_confidence, "tau": m.tau,
                 **({"bins": [b.__dict__ for b in m.bins]} if full else {"n": m.count})}
    return {**out, **{k: v for k, v in m.decisions().items() if full or k != "risk_coverage"}}


@dataclass
class GroupResult:
    """One group's temperature and its figures on its evaluation rows at T = 1, T_g and the global T."""

    group: str
    n_fit: int
    n_eval: int
    temperature: float
    before: CalibrationMetrics | None
    after: CalibrationMetrics | None
    after_global: CalibrationMetrics | None
    converged: bool = True
    bound: str | None = None
    before_extras: dict = field(default_factory=dict)  # estimators and bootstrap intervals, when asked for
    after_extras: dict = field(default_factory=dict)
    after_global_extras: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        blocks = {name: None if m is None else {**metrics_block(m), **extra} for name, m, extra in (
            ("before", self.before, self.before_extras), ("after", self.after, self.after_extras),
            ("after_global", self.after_global, self.after_global_extras))}
        return {"group": self.group, "n_fit": self.n_fit, "n_eval": self.n_eval, "temperature": self.temperature,
                **blocks, "converged": self.converged, "bound": self.bound}


@dataclass
class Subsets:
    """What ``--folds`` and ``--group-by`` add to a fit's report."""

    folds: dict | None = None
    groups: list[GroupResult] | None = None
    group_key: str | None = None
    group_prior: float | None = None
    calibration: CellCalibration | None = field(default=None, repr=False)
    rows: np.ndarray | None = field(default=None, repr=False)  # the group of every evaluation row, in order
    fold_rows: np.ndarray | None = field(default=None, repr=False)  # with folds: the fold of every row, in order

    def group_temperatures(self) -> dict[str, float] | None:
        """Name -> T_g of the groups that had fitting rows (what write-back stores)."""
        if self.groups is None:
            return None
        return {g.group: g.temperature for g in self.groups if g.n_fit > 0}

    def to_json(self, bases: Callable[[int], dict[str, dict]]) -> dict[str, Any]:
        """The fit JSON's ``folds`` and ``group_key``, ``group_prior``, ``groups`` (those asked for); ``bases(n)``:
        the ``basis`` of each block of a group with ``n`` evaluation rows, by block name."""
        out: dict[str, Any] = {} if self.folds is None else {"folds": self.folds}
        if self.groups is not None:
            out.update(group_key=self.group_key, group_prior=self.group_prior, groups=[])
            for group in self.groups:
                block = group.to_json()
                for name, basis in bases(group.n_eval).items():
                    if block.get(name) is not None:
                        block[name]["basis"] = basis
                out["groups"].append(block)
        return out


def row_extras(calibration: CellCalibration, slot: int, asked: Asked, rows: tuple[GroupRows, int] | None = None
               ) -> dict:
    """The per-row estimators and bootstrap intervals of one slot (over every row, or with ``rows`` the rows of one
    group), from the confidences the pass kept; not the classwise ECE (it needs every class's probability)."""
    from ..metrics.bootstrap import bootstrap_intervals
    from ..metrics.calibration import debiased_l2_calibration_error, ece_equal_mass, rms_calibration_error

    confidence, correct, nll = calibration.confidence[slot], calibration.correct, calibration.nll[slot]
    if rows is not None:
        grouped, g = rows
        confidence, correct = grouped.of(grouped.confidence[slot], g), grouped.of(grouped.correct, g)
        nll = grouped.of(grouped.nll[slot], g)
    out: dict = {}
    if not confidence.numel():
        return out
    per_row = {"ece_equal_mass": ece_equal_mass, "l2_ce_debiased": debiased_l2_calibration_error,
               "rms_ce": rms_calibration_error}
    out.update({name: per_row[name](confidence, correct, asked.bins) for name in asked.estimators if name in per_row})
    if asked.bootstrap:
        out.update(asked.interval_fields(bootstrap_intervals(confidence, correct, nll, asked.bootstrap, asked.seed,
                                                             asked.bins)))
    return out


def subset_extras(subsets: Subsets, asked: Asked, warnings: list[str], overall: bool = True) -> list[dict]:
    """``before`` and ``after`` estimators and intervals over every evaluation row (out of fold with folds; only
    when ``overall``), and each group's, in its blocks."""
    calibration = subsets.calibration
    if not (asked.estimators or asked.bootstrap) or calibration is None:
        return []
    if "ece_classwise" in asked.estimators:
        warnings.append("ece_classwise is left out where rows have their own T (it needs every class's probability "
                        "at each row's T); the other estimators are reported")
    extras = [row_extras(calibration, 0, asked), row_extras(calibration, 1, asked)] if overall else []
    if subsets.groups:
        assert subsets.rows is not None
        grouped = GroupRows(calibration, subsets.rows, len(subsets.groups))  # each group's rows: one slice
        for g, group in enumerate(subsets.groups):
            for block, slot in ((group.before_extras, 0), (group.after_extras, 2), (group.after_global_extras, 1)):
                block.update(row_extras(calibration, slot, asked, (grouped, g)))
    return extras


def fit_group_results(names: Sequence[str], n_fit: Sequence[int], n_eval: Sequence[int], fits: SubsetFits,
                      calibration: CellCalibration, global_t: float, rows: np.ndarray) -> list[GroupResult]:
    """Each group's T and its figures: slot 0 (T = 1), 2 (T_g, out of fold with folds), 1 (global T)."""
    index = GroupRows.kept(calibration, rows, len(names))
    return [GroupResult(name, int(n_fit[g]), int(n_eval[g]), 1.0 / fitted.beta,
                        subset_metrics(calibration, 0, 1.0, g, index),
                        subset_metrics(calibration, 2, 1.0 / fitted.beta, g, index),
                        subset_metrics(calibration, 1, global_t, g, index), fitted.converged, fitted.bound)
            for g, (name, fitted) in enumerate(zip(names, fits.subsets.groups or [], strict=True))]


def cell_stats(scan: Scan, layout: CellLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per cell, from the validating scan's row numbers (no read): rows, the sum of the slope at beta = 0, and
    the rows with a class above their true class (all ranks)."""
    stats, cells, n = scan.stats, layout.cells, layout.count
    f64 = torch.float64
    slope = torch.zeros(n, dtype=f64, device=cells.device).index_add_(
        0, cells, (stats.uniform_mean.to(f64) - stats.true_gap.to(f64)).to(cells.device))
    count = torch.bincount(cells, minlength=n).to(f64)
    above = torch.bincount(cells[(stats.true_gap < 0).to(cells.device)], minlength=n).to(f64)
    reduced = all_reduce(torch.stack([count, slope, above])).cpu()
    return reduced[0].to(torch.int64), reduced[1], reduced[2].to(torch.int64)


def assign_folds(labels, k: int, seed: int = 0) -> np.ndarray:
    """The fold (0..k-1, int64) of every row of ``labels``: each class's rows shuffled with ``seed`` and dealt in
    turn, so every fold holds about ``1/k`` of each class and fold sizes differ by at most one (``k`` = rows: row i
    is fold i, leave-one-out)."""
    labels = np.asarray(labels)
    n = int(labels.shape[0])
    k = check_folds(k, n)
    if k == n:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    order = np.argsort(labels, kind="stable")
    _, starts = np.unique(labels[order], return_index=True)
    bounds = [*starts.tolist(), n]
    dealt = np.concatenate([rng.permutation(order[a:b]) for a, b in itertools.pairwise(bounds)])
    folds = np.empty(n, dtype=np.int64)
    folds[dealt] = np.arange(n, dtype=np.int64) % k
    return folds


__all__ = ["CellCalibration", "CellLayout", "GroupResult", "GroupRows", "SubsetFits",
           "SubsetTemperatures", "Subsets", "assign_folds", "cell_calibration", "cell_objective",
           "cell_stats", "fit_group_results", "metrics_block", "row_extras", "subset_extras",
           "subset_keys", "subset_metrics"]
