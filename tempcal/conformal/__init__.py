"""Conformal prediction sets (``--conformal-alpha``), one capability, one package: ``sets`` the maths, ``passes`` the
chunk visitors and the memory policy, ``folds`` and ``report`` the commands' sets; their entry points, imported here."""

from __future__ import annotations

from .folds import READS as GROUP_SET_READS
from .folds import fit_group_sets, fold_sets
from .passes import ConformalPlan, fit_thresholds, temperatures_per_read
from .report import (
    OWN_GROUP_READS,
    ConformalRows,
    metrics_plan,
    own_group_sets,
    report_group_sets,
    report_thresholds,
    with_sets,
)
from .sets import SHORT_P, ConformalResult, under_covered

__all__ = ["GROUP_SET_READS", "OWN_GROUP_READS", "SHORT_P", "ConformalPlan", "ConformalResult", "ConformalRows",
           "fit_group_sets", "fit_thresholds", "fold_sets", "metrics_plan", "own_group_sets", "report_group_sets",
           "report_thresholds", "temperatures_per_read", "under_covered", "with_sets"]
