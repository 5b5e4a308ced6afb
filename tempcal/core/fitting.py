"""The public fit: :func:`fit_temperature` on tensors or a :class:`~tempcal.core.scan.Scan`, with groups and folds.

It validates what it is given (one scan of the data), then fits on that scan (:mod:`tempcal.core.scan_fit`) or,
with ``groups`` or ``folds``, hands it to the subset fit :mod:`tempcal.subsets` registers in :data:`SUBSET_FIT`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..errors import TempcalError
from ..validation import probabilities_refused
from .certified import T_MAX, T_MIN, Evaluator
from .data import as_logits_data
from .kernels import DEFAULT_BINS
from .scan import ALL_ROWS, Scan
from .scan_fit import MAX_PASSES, FitResult, fit_scan

if TYPE_CHECKING:
    from .ece_fit import PassCallback

#: The fit of ``groups=`` and ``folds=``, ``(scan, groups, kept rows, group_prior=, folds=, seed=, objective=, bins=)
#: -> FitResult``: registered when :mod:`tempcal.subsets.fits` loads (``tempcal.fit_temperature`` loads it).
SUBSET_FIT: list[Callable[..., FitResult]] = []


def fit_temperature(logits, labels=None, *, objective: str = "nll", bins: int = DEFAULT_BINS,
                    device: str | torch.device = "auto", chunk_rows: int | None = None,
                    probs: bool | None = None, xtol: float | None = None, max_passes: int = MAX_PASSES,
                    groups: Any = None, group_prior: float | None = None, folds: int | None = None, seed: int = 0,
                    evaluate: Evaluator | None = None, ece_terms: Any = None,
                    on_pass: PassCallback | None = None) -> FitResult:
    """Fit T on ``logits`` ``[N, C]`` (or ``[N]`` binary) and integer ``labels`` ``[N]``.

    ``probs=True``: ``logits`` holds probabilities and T is fitted on log(p); ``probs=False``: logits, whatever they
    look like; ``probs=None``: logits, refusing values that all look like probability vectors
    (:class:`~tempcal.validation.ProbabilitiesError`). Logits whose rows are flat are refused too.

    ``logits`` may also be a :class:`~tempcal.core.scan.Scan` (``labels`` None), so that callers validate once and
    fit on a split without reading the data again. ``xtol`` is the relative tolerance on T (default 1e-7);
    ``max_passes`` caps the reads, the validating scan included.

    ``groups`` (one value per row) also fits each group's T, drawn toward the global T by ``group_prior``
    (``lam * (ln T - ln T_global)^2`` added to the group's NLL sum): ``group_temperatures``. ``folds`` (K, seeded by
    ``seed``) also fits T outside each of K class-stratified folds: ``fold_temperatures``. Both share the global
    fit's reads. ``evaluate`` and ``ece_terms`` replace the scan's pass for fits that ride on another's reads.
    """
    kept = None
    if isinstance(logits, Scan):
        scan = logits
    else:
        data = as_logits_data(logits, labels, probs=probs)
        kept = data.index
        scan = Scan(data, device=device, chunk_rows=chunk_rows, fit_rows=ALL_ROWS)
        if probs is None and scan.looks_like_probabilities:
            raise probabilities_refused("the logits")
    if groups is not None or folds is not None:
        if not SUBSET_FIT:
            raise TempcalError("groups= and folds= are fitted by tempcal.subsets: call tempcal.fit_temperature, or "
                               "import tempcal.subsets.fits first")
        return SUBSET_FIT[0](scan, groups, kept, group_prior=group_prior, folds=folds, seed=seed,
                             objective=objective, bins=bins)
    return fit_scan(scan, objective=objective, bins=bins, xtol=xtol, max_passes=max_passes, evaluate=evaluate,
                    ece_terms=ece_terms, on_pass=on_pass)


__all__ = ["MAX_PASSES", "SUBSET_FIT", "T_MAX", "T_MIN", "FitResult", "fit_temperature"]
