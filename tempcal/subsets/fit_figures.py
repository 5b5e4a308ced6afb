"""``fit --folds K`` and ``fit --group-by KEY``: the subset fits and their metrics, each from shared reads.

* Cross-fitting: the global T on every row; T_k on the rows outside fold k; ``after`` over every row, each
  at its own fold's T_k (out of fold); one calibration pass gives ``before``, ``after`` and every group's
  figures.
* Groups: T_g on a group's fitting rows, drawn toward the global T by ``group_prior`` (toward T_k within
  fold k); each group's evaluation rows at T = 1, T_g and the global T, all in one calibration pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..core.scan import Scan
from ..errors import Info
from ..metrics.calibration import CalibrationMetrics
from ..sources.base import OpenedSource
from .cells import CellCalibration, GroupRows, cell_calibration, metrics_block, subset_metrics
from .fits import SubsetFits, assign_folds, cell_index, fit_with_subsets, fold_sizes
from .groups import RowGroups
from .nll_fits import CellLayout
from .options import Plan


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
        blocks = {}
        for name, m, extra in (("before", self.before, self.before_extras), ("after", self.after, self.after_extras),
                               ("after_global", self.after_global, self.after_global_extras)):
            block = metrics_block(m)
            blocks[name] = None if block is None else {**block, **extra}
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
        out: dict[str, Any] = {}
        if self.folds is not None:
            out["folds"] = self.folds
        if self.groups is not None:
            out.update(group_key=self.group_key, group_prior=self.group_prior, groups=[])
            for group in self.groups:
                block = group.to_json()
                for name, basis in bases(group.n_eval).items():
                    if block.get(name) is not None:
                        block[name]["basis"] = basis
                out["groups"].append(block)
        return out


#: Groups named in the line about groups without fitting rows.
FIRST_SHOWN = 5
def crossfit(loaded: OpenedSource, scan: Scan, plan: Plan, *, seed: int, objective: str, bins: int,
             warnings: list[str]) -> tuple[SubsetFits, CalibrationMetrics, CalibrationMetrics, Subsets]:
    """Fold fits on ``scan`` (every row of ``loaded``, this process's share) and the out-of-fold metrics."""
    k = plan.folds
    assert k is not None
    labels = loaded.data.labels.numpy()
    folds = assign_folds(labels, k, seed)
    start, stop = loaded.share()
    groups = None if plan.groups is None else torch.from_numpy(plan.groups.index[start:stop])
    count = plan.groups.count if plan.groups is not None else 1
    layout = CellLayout(cell_index(groups, torch.from_numpy(folds[start:stop]), k, scan.device), count, k)
    fits = _fit(scan, layout, plan, objective, bins, plan.groups.names if plan.groups is not None else None)
    fold_betas = 1.0 / torch.tensor(fits.fold_temperatures, dtype=torch.float64)
    betas = [torch.ones(count * k, dtype=torch.float64), fold_betas.repeat(count)]
    if plan.groups is not None:
        betas.append(1.0 / torch.tensor(fits.group_fold_temperatures, dtype=torch.float64).reshape(-1))
    report = torch.zeros_like(layout.cells) if groups is None else groups.to(scan.device)
    calibration = cell_calibration(scan, torch.stack(betas), layout.cells, report, count, bins)
    global_t = fits.fit.temperature
    before, after = subset_metrics(calibration, 0, 1.0), subset_metrics(calibration, 1, global_t)
    assert before is not None and after is not None
    subsets = Subsets(folds={"k": k, "temperatures": fits.fold_temperatures, "sizes": fold_sizes(folds, k)},
                      group_prior=plan.lam if plan.groups is not None else None, calibration=calibration,
                      rows=None if plan.groups is None else plan.groups.index, fold_rows=folds)
    if plan.groups is not None:
        sizes = plan.groups.sizes()
        subsets.groups = _group_results(plan.groups.names, sizes, sizes, fits, calibration, global_t,
                                        plan.groups.index)
        subsets.group_key = plan.groups.key
    warnings.extend(fits.subsets.warnings)
    return fits, before, after, subsets


def grouped(loaded: OpenedSource, evaluated: OpenedSource, fit_scan: Scan, eval_scan: Scan, plan: Plan,
            fit_index: np.ndarray, eval_groups: RowGroups, eval_index: np.ndarray, *, objective: str, bins: int,
            warnings: list[str]) -> tuple[SubsetFits, CalibrationMetrics, CalibrationMetrics, Subsets]:
    """Group fits on ``fit_scan`` (rows ``fit_index`` of ``loaded``) and metrics on ``eval_scan`` (rows
    ``eval_index`` of ``evaluated``, grouped by ``eval_groups``); the indices are global and sorted."""
    assert plan.groups is not None
    names, fit_of, eval_of = _joined(plan.groups, eval_groups)
    count = len(names)
    fit_g = torch.from_numpy(fit_of[_share(loaded, fit_index)])
    layout = CellLayout(fit_g.to(fit_scan.device), count, 1)
    fits = _fit(fit_scan, layout, plan, objective, bins, names)
    eval_g = torch.from_numpy(eval_of[_share(evaluated, eval_index)]).to(eval_scan.device)
    global_t = fits.fit.temperature
    f64 = torch.float64
    betas = torch.stack([torch.ones(count, dtype=f64), torch.full((count,), 1.0 / global_t, dtype=f64),
                         1.0 / torch.tensor(fits.group_temperatures, dtype=f64)])
    calibration = cell_calibration(eval_scan, betas, eval_g, eval_g, count, bins)
    before, after = subset_metrics(calibration, 0, 1.0), subset_metrics(calibration, 1, global_t)
    assert before is not None and after is not None
    n_fit = _counts(fit_g, count, fit_scan)
    rows = eval_of[eval_index]
    results = _group_results(names, n_fit, calibration.counts.tolist(), fits, calibration, global_t, rows)
    empty = [g.group for g in results if g.n_fit == 0]
    if empty:  # one line however many groups (thousands, with many small groups)
        shown = ", ".join(empty[:FIRST_SHOWN]) + (", ..." if len(empty) > FIRST_SHOWN else "")
        warnings.append(Info(f"{len(empty)} group(s) have no fitting rows ({shown}); their rows are evaluated at "
                             "the global T"))
    warnings.extend(fits.subsets.warnings)
    return fits, before, after, Subsets(groups=results, group_key=plan.groups.key, group_prior=plan.lam,
                                        calibration=calibration, rows=rows)


def _share(opened: OpenedSource, rows: np.ndarray) -> np.ndarray:
    """Global row indices ``rows`` that fall in this process's share, relative to its start."""
    start, stop = opened.share()
    return rows[(rows >= start) & (rows < stop)]


def row_extras(calibration: CellCalibration, slot: int, *, estimators: Sequence[str], bootstrap: int, seed: int,
               bins: int, rows: torch.Tensor | tuple[GroupRows, int] | None = None) -> dict:
    """The per-row estimators and bootstrap intervals of one slot (over the rows ``rows`` selects: a mask, or the
    kept rows sorted by group and a group; None: every row), from the confidences the pass kept; the classwise ECE
    is not among them (it needs every class's probability)."""
    from ..metrics.bootstrap import bootstrap_intervals
    from ..metrics.calibration import debiased_l2_calibration_error, ece_equal_mass, rms_calibration_error

    assert calibration.confidence is not None and calibration.correct is not None and calibration.nll is not None
    confidence, correct, nll = calibration.confidence[slot], calibration.correct, calibration.nll[slot]
    if isinstance(rows, tuple):
        grouped, g = rows
        assert grouped.nll is not None
        confidence, correct = grouped.of(grouped.confidence[slot], g), grouped.of(grouped.correct, g)
        nll = grouped.of(grouped.nll[slot], g)
    elif rows is not None:
        confidence, correct, nll = confidence[rows], correct[rows], nll[rows]
    out: dict = {}
    if not confidence.numel():
        return out
    per_row = {"ece_equal_mass": ece_equal_mass, "l2_ce_debiased": debiased_l2_calibration_error,
               "rms_ce": rms_calibration_error}
    out.update({name: per_row[name](confidence, correct, bins) for name in estimators if name in per_row})
    if bootstrap:
        intervals = bootstrap_intervals(confidence, correct, nll, bootstrap, seed, bins)
        out.update({f"{name}_ci": list(interval) for name, interval in intervals.items()})
        out["bootstrap"] = {"resamples": bootstrap, "seed": seed, "level": 0.95}
    return out


def subset_extras(subsets: Subsets, *, estimators: Sequence[str], bootstrap: int, seed: int, bins: int,
                  warnings: list[str], overall: bool = True) -> list[dict]:
    """``before`` and ``after`` estimators and intervals over every evaluation row (out of fold with folds; only
    when ``overall``), and each group's, in its blocks."""
    calibration = subsets.calibration
    if not (estimators or bootstrap) or calibration is None or calibration.confidence is None:
        return []
    if "ece_classwise" in estimators:
        warnings.append("ece_classwise is left out where rows have their own T (it needs every class's probability "
                        "at each row's T); the other estimators are reported")
    options: dict[str, Any] = {"estimators": estimators, "bootstrap": bootstrap, "seed": seed, "bins": bins}
    extras = [row_extras(calibration, 0, **options), row_extras(calibration, 1, **options)] if overall else []
    if subsets.groups:
        assert subsets.rows is not None
        grouped = GroupRows(calibration, subsets.rows, len(subsets.groups))  # each group's rows: one slice
        for g, group in enumerate(subsets.groups):
            for block, slot in ((group.before_extras, 0), (group.after_extras, 2), (group.after_global_extras, 1)):
                block.update(row_extras(calibration, slot, rows=(grouped, g), **options))
    return extras


def _fit(scan: Scan, layout: CellLayout, plan: Plan, objective: str, bins: int, names: list[str] | None
         ) -> SubsetFits:
    return fit_with_subsets(scan, layout, groups=plan.groups is not None, lam=plan.lam, objective=objective,
                            bins=bins, group_names=names)


def _group_results(names: Sequence[str], n_fit: Sequence[int], n_eval: Sequence[int], fits: SubsetFits,
                   calibration: CellCalibration, global_t: float, rows: np.ndarray, slot: int = 2
                   ) -> list[GroupResult]:
    """Each group's T and its figures: slot 0 (T = 1), ``slot`` (T_g, out of fold with folds), 1 (global T)."""
    results = []
    index = GroupRows.kept(calibration, rows, len(names))
    for g, name in enumerate(names):
        fitted = (fits.subsets.groups or [])[g]
        results.append(GroupResult(
            name, int(n_fit[g]), int(n_eval[g]), 1.0 / fitted.beta,
            subset_metrics(calibration, 0, 1.0, g, index), subset_metrics(calibration, slot, 1.0 / fitted.beta, g,
                                                                         index),
            subset_metrics(calibration, 1, global_t, g, index), fitted.converged, fitted.bound))
    return results


def _joined(fit: RowGroups, other: RowGroups) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The names of both sets of groups (sorted as groups are) and each set's rows re-indexed into them."""
    if other is fit:
        return fit.names, fit.index, fit.index
    names = sorted(set(fit.names) | set(other.names), key=group_order)
    position = {name: i for i, name in enumerate(names)}
    return (names, np.array([position[n] for n in fit.names], dtype=np.int64)[fit.index],
            np.array([position[n] for n in other.names], dtype=np.int64)[other.index])


def group_order(name: str) -> tuple[int, int, str]:
    """Integers numerically, then any other names (tasks) by text."""
    try:
        return 0, int(name), ""
    except ValueError:
        return 1, 0, name


def _counts(index: torch.Tensor, count: int, scan: Scan) -> list[int]:
    """Rows per group over all ranks."""
    from ..core.distributed import all_reduce

    counts = torch.bincount(index.to(scan.device), minlength=count)[:count].to(torch.int64)
    return all_reduce(counts).cpu().tolist()


__all__ = ["GroupResult", "Subsets", "crossfit", "group_order",
           "grouped", "row_extras", "subset_extras"]
