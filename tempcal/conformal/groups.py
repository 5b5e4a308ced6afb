"""The sets per group of rows under one set of thresholds, for ``fit --group-by KEY --conformal-alpha A`` and
``report --group-by KEY --conformal-alpha A``: the figure that shows one group under-covered.

:func:`group_sets` sums the sets per group in one read of the judged rows; :func:`fit_group_sets` takes ``fit``'s
thresholds from the fitting rows at T = 1 and at the global T (one more read).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from ..core.scan import Scan
from ..metrics.calibration import CalibrationMetrics
from ..sources.base import OpenedSource
from ..subsets.cells import GroupResult, Subsets
from .passes import SetSums, Thresholds, fit_thresholds, grouped_results
from .sets import ConformalResult

#: Reads ``fit``'s grouped sets take beyond the fit: the fitting rows' scores, then the evaluation rows' sets.
READS = 2


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


__all__ = ["READS", "fit_group_sets", "group_sets", "place_group_sets"]
