"""``fit --folds K`` and ``fit --group-by KEY``: one call per run.

* Cross-fitting (:func:`crossfit_run`): the global T on every row; T_k on the rows outside fold k; ``after`` over
  every row, each at its own fold's T_k (out of fold); one calibration pass gives ``before``, ``after`` and every
  group's figures.
* Groups (:func:`grouped_run`): T_g on a group's fitting rows, drawn toward the global T by ``group_prior`` (toward
  T_k within fold k); each group's evaluation rows at T = 1, T_g and the global T, all in one calibration pass.

Each run forms the conformal sets out of fold or per group when asked (:mod:`tempcal.conformal`) and adds the
estimators and bootstrap intervals per group; ``fit_file`` builds its report from the :class:`SubsetRun`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..conformal import GROUP_SET_READS, fit_group_sets, fold_sets
from ..core.distributed import all_reduce
from ..core.scan import Scan
from ..core.scan_fit import FitResult
from ..errors import DataError, Info
from ..metrics.calibration import CalibrationMetrics
from ..sources.base import OpenedSource
from ..sources.grouping import RowGroups
from .cells import CellLayout, SubsetFits, Subsets, cell_calibration, fit_group_results, subset_extras, subset_metrics
from .fits import assign_folds, cell_index, fit_with_subsets, fold_sizes
from .options import Asked, Plan, check_folds, read_groups

#: Groups named in the line about groups without fitting rows.
FIRST_SHOWN = 5


@dataclass
class SubsetRun:
    """A subset run's global fit, its ``before`` and ``after`` (out of fold with folds), its subsets, the reads the
    conformal sets took and the overall estimators (with folds; without, ``fit_file`` computes them)."""

    fit: FitResult
    before: CalibrationMetrics
    after: CalibrationMetrics
    subsets: Subsets
    reads: int = 0
    extras: list[dict] = field(default_factory=list)


def with_groups(plan: Plan, loaded: OpenedSource, group_by: str | None) -> Plan:
    """The plan with SOURCE's groups read (``group_by``)."""
    return plan if group_by is None else replace(plan, groups=read_groups(loaded, group_by))


def crossfit_run(loaded: OpenedSource, scan: Scan, plan: Plan, asked: Asked, warnings: list[str]) -> SubsetRun:
    """``--folds K`` on ``scan`` (every row of ``loaded``, this process's share): every row fits the deployed T, K
    out-of-fold fits, out-of-fold metrics (and conformal sets, and the estimators over every row and per group)."""
    k = check_folds(plan.folds, scan.num_samples)
    folds = assign_folds(loaded.data.labels.numpy(), k, asked.seed)
    start, stop = loaded.share()
    groups = None if plan.groups is None else torch.from_numpy(plan.groups.index[start:stop])
    count = plan.groups.count if plan.groups is not None else 1
    layout = CellLayout(cell_index(groups, torch.from_numpy(folds[start:stop]), k, scan.device), count, k)
    try:
        fits = _fit(scan, layout, plan, asked, plan.groups.names if plan.groups is not None else None)
        fold_betas = 1.0 / torch.tensor(fits.fold_temperatures, dtype=torch.float64)
        betas = [torch.ones(count * k, dtype=torch.float64), fold_betas.repeat(count)]
        if plan.groups is not None:
            betas.append(1.0 / torch.tensor(fits.group_fold_temperatures, dtype=torch.float64).reshape(-1))
        report = torch.zeros_like(layout.cells) if groups is None else groups.to(scan.device)
        calibration = cell_calibration(scan, torch.stack(betas), layout.cells, report, count, asked.bins)
        global_t = fits.fit.temperature
        before, after = subset_metrics(calibration, 0, 1.0), subset_metrics(calibration, 1, global_t)
        assert before is not None and after is not None
        subsets = Subsets(folds={"k": k, "temperatures": fits.fold_temperatures, "sizes": fold_sizes(folds, k)},
                          group_prior=plan.lam if plan.groups is not None else None, calibration=calibration,
                          rows=None if plan.groups is None else plan.groups.index, fold_rows=folds)
        if plan.groups is not None:
            sizes = plan.groups.sizes()
            subsets.groups = fit_group_results(plan.groups.names, sizes, sizes, fits, calibration, global_t,
                                               plan.groups.index)
            subsets.group_key = plan.groups.key
        warnings.extend(fits.subsets.warnings)
        before, after, reads = fold_sets(scan, loaded, subsets, asked.alphas, global_t, before,
                                         after) if asked.alphas else (before, after, 0)
    except DataError as exc:
        raise exc.prefixed(f"{loaded.name}: ") from None
    warnings[:0] = fits.fit.warnings
    extras = subset_extras(subsets, estimators=asked.estimators, bootstrap=asked.bootstrap, seed=asked.seed,
                           bins=asked.bins, warnings=warnings)
    return SubsetRun(fits.fit, before, after, subsets, reads, extras)


def grouped_run(loaded: OpenedSource, evaluated: OpenedSource | None, fit_scan: Scan, eval_scan: Scan, plan: Plan,
                fit_index: np.ndarray, eval_index: np.ndarray, asked: Asked, warnings: list[str]) -> SubsetRun:
    """``--group-by``: the group fits on ``fit_scan`` (rows ``fit_index`` of ``loaded``) and their figures on
    ``eval_scan`` (rows ``eval_index`` of ``evaluated``, when given; the indices are global and sorted), with the
    conformal sets and each group's coverage when ``alphas`` are given, and each group's estimators."""
    assert plan.groups is not None
    eval_groups = plan.groups if evaluated is None else read_groups(evaluated, plan.groups.key)
    evaluated = evaluated or loaded
    names, fit_of, eval_of = _joined(plan.groups, eval_groups)
    count = len(names)
    fit_g = torch.from_numpy(fit_of[_share(loaded, fit_index)])
    fits = _fit(fit_scan, CellLayout(fit_g.to(fit_scan.device), count, 1), plan, asked, names)
    eval_g = torch.from_numpy(eval_of[_share(evaluated, eval_index)]).to(eval_scan.device)
    global_t = fits.fit.temperature
    f64 = torch.float64
    betas = torch.stack([torch.ones(count, dtype=f64), torch.full((count,), 1.0 / global_t, dtype=f64),
                         1.0 / torch.tensor(fits.group_temperatures, dtype=f64)])
    calibration = cell_calibration(eval_scan, betas, eval_g, eval_g, count, asked.bins)
    before, after = subset_metrics(calibration, 0, 1.0), subset_metrics(calibration, 1, global_t)
    assert before is not None and after is not None
    counts = torch.bincount(fit_g.to(fit_scan.device), minlength=count)[:count].to(torch.int64)
    rows = eval_of[eval_index]
    results = fit_group_results(names, all_reduce(counts).cpu().tolist(), calibration.counts.tolist(), fits,
                                calibration, global_t, rows)
    empty = [g.group for g in results if g.n_fit == 0]
    if empty:  # one line however many groups (thousands, with many small groups)
        shown = ", ".join(empty[:FIRST_SHOWN]) + (", ..." if len(empty) > FIRST_SHOWN else "")
        warnings.append(Info(f"{len(empty)} group(s) have no fitting rows ({shown}); their rows are evaluated at "
                             "the global T"))
    warnings.extend(fits.subsets.warnings)
    subsets = Subsets(groups=results, group_key=plan.groups.key, group_prior=plan.lam, calibration=calibration,
                      rows=rows)
    reads = 0
    if asked.alphas:
        before, after = fit_group_sets(fit_scan, eval_scan, evaluated, eval_index, subsets, asked.alphas, global_t,
                                       before, after)
        reads = GROUP_SET_READS
    subset_extras(subsets, estimators=asked.estimators, bootstrap=asked.bootstrap, seed=asked.seed, bins=asked.bins,
                  warnings=warnings, overall=False)
    return SubsetRun(fits.fit, before, after, subsets, reads)


def _fit(scan: Scan, layout: CellLayout, plan: Plan, asked: Asked, names: list[str] | None) -> SubsetFits:
    return fit_with_subsets(scan, layout, groups=plan.groups is not None, lam=plan.lam, objective=asked.objective,
                            bins=asked.bins, group_names=names)


def _share(opened: OpenedSource, rows: np.ndarray) -> np.ndarray:
    """Global row indices ``rows`` that fall in this process's share, relative to its start."""
    start, stop = opened.share()
    return rows[(rows >= start) & (rows < stop)]


def _joined(fit: RowGroups, other: RowGroups) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The names of both sets of groups (sorted as groups are: integers numerically, then tasks by text) and each
    set's rows re-indexed into them."""
    if other is fit:
        return fit.names, fit.index, fit.index
    names = sorted(set(fit.names) | set(other.names), key=_group_order)
    position = {name: i for i, name in enumerate(names)}
    return (names, np.array([position[n] for n in fit.names], dtype=np.int64)[fit.index],
            np.array([position[n] for n in other.names], dtype=np.int64)[other.index])


def _group_order(name: str) -> tuple[int, int, str]:
    try:
        return 0, int(name), ""
    except ValueError:
        return 1, 0, name


__all__ = ["SubsetRun", "crossfit_run", "grouped_run", "with_groups"]
