"""``fit_file``'s two subset runs, one call each: cross-fitting (``--folds K``) and groups (``--group-by KEY``).

Each fits every T from shared reads (:mod:`.fit_figures`), forms the conformal sets out of fold or per group when
asked (:mod:`tempcal.conformal`), and adds the estimators and bootstrap intervals per group; ``fit_file`` builds
its report from the :class:`SubsetRun`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..conformal import GROUP_SET_READS, fit_group_sets, fold_sets
from ..core.scan import Scan
from ..core.scan_fit import FitResult
from ..errors import DataError
from ..metrics.calibration import CalibrationMetrics
from ..sources.base import OpenedSource
from .fit_figures import Subsets, crossfit, grouped, subset_extras
from .options import Asked, Plan, check_folds, read_groups


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
    """``--folds K``: every row fits the deployed T, K out-of-fold fits, out-of-fold metrics (and conformal sets,
    and the estimators over every row and per group)."""
    check_folds(plan.folds, scan.num_samples)
    try:
        fitted, before, after, subsets = crossfit(loaded, scan, plan, seed=asked.seed, objective=asked.objective,
                                                  bins=asked.bins, warnings=warnings)
        before, after, reads = fold_sets(scan, loaded, subsets, asked.alphas, fitted.fit.temperature, before,
                                         after) if asked.alphas else (before, after, 0)
    except DataError as exc:
        raise exc.prefixed(f"{loaded.name}: ") from None
    warnings[:0] = fitted.fit.warnings
    extras = subset_extras(subsets, estimators=asked.estimators, bootstrap=asked.bootstrap, seed=asked.seed,
                           bins=asked.bins, warnings=warnings)
    return SubsetRun(fitted.fit, before, after, subsets, reads, extras)


def grouped_run(loaded: OpenedSource, evaluated: OpenedSource | None, fit_scan: Scan, eval_scan: Scan, plan: Plan,
                fit_index: np.ndarray, eval_index: np.ndarray, asked: Asked, warnings: list[str]) -> SubsetRun:
    """``--group-by``: the group fits and figures on the fitting and evaluation rows (``evaluated``'s, when given),
    with the conformal sets and each group's coverage when ``alphas`` are given, and each group's estimators."""
    assert plan.groups is not None
    eval_groups = plan.groups if evaluated is None else read_groups(evaluated, plan.groups.key)
    fitted, before, after, subsets = grouped(loaded, evaluated or loaded, fit_scan, eval_scan, plan, fit_index,
                                             eval_groups, eval_index, objective=asked.objective, bins=asked.bins,
                                             warnings=warnings)
    reads = 0
    if asked.alphas:
        before, after = fit_group_sets(fit_scan, eval_scan, evaluated or loaded, eval_index, subsets, asked.alphas,
                                       fitted.fit.temperature, before, after)
        reads = GROUP_SET_READS
    subset_extras(subsets, estimators=asked.estimators, bootstrap=asked.bootstrap, seed=asked.seed, bins=asked.bins,
                  warnings=warnings, overall=False)
    return SubsetRun(fitted.fit, before, after, subsets, reads)


__all__ = ["Asked", "SubsetRun", "crossfit_run", "grouped_run", "with_groups"]
