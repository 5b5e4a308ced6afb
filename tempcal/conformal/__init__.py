"""Conformal prediction sets (``--conformal-alpha``): one capability, one package.

``sets``: the set maths (LAC and APS scores, thresholds, each row's sets, :class:`ConformalResult` and its JSON);
``passes``: the chunk visitors that read them (the fitting rows' scores, the sets' sums) and the one memory policy
(:func:`temperatures_per_read`); ``plan``: :class:`ConformalPlan`, the sets riding on the metrics pass; ``folds``:
the sets per group of rows and ``fit --folds``'s out-of-fold sets; ``report``: ``report``'s rows, thresholds and
sets. The commands' workflows import their entry points from here.
"""

from __future__ import annotations

from .folds import READS as GROUP_SET_READS
from .folds import fit_group_sets, fold_sets
from .passes import fit_thresholds, temperatures_per_read
from .plan import ConformalPlan
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
