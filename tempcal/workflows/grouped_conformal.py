"""``fit --group-by KEY --conformal-alpha A``: the global conformal sets, and the coverage they give each group.

The thresholds come from the fitting rows at T = 1 and at the global T (one read of them); the sets are formed
on the evaluation rows at the same temperatures and summed per group (one read of them: the grouped metrics
pass sums per cell at per-group temperatures, and the sets need the thresholds first). ``before`` and ``after``
get the sets over every evaluation row; each group's ``before`` and ``after_global`` blocks get its own coverage
and mean set size under the same thresholds: the figure that shows one group under-covered.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ..core.scan import Scan
from ..metrics.calibration import CalibrationMetrics
from ..metrics.conformal_pass import SetSums, fit_thresholds, set_results
from ..sources.base import OpenedSource
from .subsets import Subsets

#: Reads the grouped sets take beyond the fit: the fitting rows' scores, then the evaluation rows' sets.
READS = 2


def group_sets(fit_scan: Scan, eval_scan: Scan, evaluated: OpenedSource, eval_index: np.ndarray, subsets: Subsets,
               alphas: list[float], global_t: float, before: CalibrationMetrics, after: CalibrationMetrics
               ) -> tuple[CalibrationMetrics, CalibrationMetrics]:
    """``before`` and ``after`` with the sets over every evaluation row; each group's blocks with its own (in its
    ``before_extras`` and ``after_global_extras``)."""
    assert subsets.groups is not None and subsets.rows is not None
    taus = [1.0, global_t]
    thresholds = fit_thresholds(fit_scan, taus, alphas)
    start, stop = evaluated.share()
    mine = (eval_index >= start) & (eval_index < stop)  # this process's evaluation rows, in order
    groups = torch.from_numpy(subsets.rows[mine].astype(np.int64))
    sets = SetSums(thresholds, eval_scan.device, groups=groups, num_groups=len(subsets.groups))
    eval_scan.visit([1.0 / t for t in taus], sets)
    sums = sets.reduced()
    overall = [set_results(alphas, thresholds[k], {s: v.sum(0, keepdim=True) for s, v in sums[k].items()},
                           eval_scan.num_samples) for k in range(len(taus))]
    for g, group in enumerate(subsets.groups):
        for k, block in ((0, group.before_extras), (1, group.after_global_extras)):
            if group.n_eval:
                block["conformal"] = [c.to_json() for c in set_results(alphas, thresholds[k], sums[k], group.n_eval,
                                                                         group=g)]
    return replace(before, conformal=overall[0]), replace(after, conformal=overall[1])


__all__ = ["READS", "group_sets"]
