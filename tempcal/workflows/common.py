"""Steps every command's workflow shares: validate a source in one pass, and the optional extra figures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..core import distributed
from ..core.scan import Scan
from ..errors import DataError, param
from ..sources.base import OpenedSource
from ..validation import AS_LOGITS, AS_PROBS, PROBS_KEY, ProbabilitiesError, is_fitted


def scan_source(opened: OpenedSource, *, device: str | torch.device, chunk_rows: int | None, probs: bool | None,
                warnings: list[str], labelled: bool = True, fit_rows: Any = None) -> Scan:
    """Validate this process's share of a source in one pass (preparing a fit on ``fit_rows`` too); refuse
    probability-like values unless ``probs`` says what they are."""
    data = opened.data
    warnings.extend(opened.warnings)
    if distributed.active():
        start, stop = opened.share()
        data = data.select(torch.arange(start, stop))
    try:
        scan = Scan(data, device=device, chunk_rows=chunk_rows, labelled=labelled, fit_rows=fit_rows)
    except DataError as exc:
        raise exc.prefixed(f"{opened.name}: ") from None
    if scan.looks_like_probabilities and probs is None:
        raise opened.kind.probabilities_refused(opened)
    return scan


def uses_stored(taus: Sequence[str | float] | None, sweep: Sequence[float] = ()) -> bool:
    """Whether a command given ``taus`` (and ``sweep``) reports at the stored T: by default (a default sweep
    includes it), with ``fitted``, or with a sweep."""
    return not taus or any(is_fitted(t) for t in taus) or bool(sweep)


def check_stored_reading(opened: OpenedSource, used: bool) -> None:
    """Refuse to apply a T fitted on log(p) to the raw values that an explicit ``probs=False`` asks for."""
    if not (used and opened.stored_probs and opened.options.probs is False):
        return
    stored = opened.stored_temperature
    if stored is not None:
        raise ProbabilitiesError(f"{opened.name}: its stored T = {stored!r} was fitted on log-probabilities "
                                 f"({PROBS_KEY} = \"true\"), so it does not apply to the raw values {AS_LOGITS} "
                                 f"reads; drop {AS_LOGITS} (or pass {AS_PROBS}), or name the temperatures with "
                                 f"{param('tau')}")


def extra_figures(scan: Scan, taus: Sequence[float], *, bins: int, estimators: Sequence[str] = (),
                  bootstrap: int = 0, seed: int = 0) -> list[dict]:
    """Per temperature: the asked-for estimators under their own names, and bootstrap intervals ``*_ci``; all of
    every rank's rows."""
    from ..metrics.bootstrap import bootstrap_scan
    from ..metrics.estimators import estimators_for

    out = []
    equal_mass = {"ece_equal_mass", "l2_ce_debiased"} & set(estimators)
    for tau in taus:
        row: dict = {}
        # One per-sample pass (every rank's rows, gathered) serves the equal-mass estimators and the bootstrap.
        per_sample = scan.per_sample(1.0 / tau) if bootstrap and equal_mass else None
        if estimators:
            row.update(estimators_for(scan, tau, bins, list(estimators), per_sample=per_sample))
        if bootstrap:
            intervals = bootstrap_scan(scan, tau, bootstrap, seed, bins, per_sample=per_sample)
            row.update({f"{name}_ci": list(interval) for name, interval in intervals.items()})
            row["bootstrap"] = {"resamples": bootstrap, "seed": seed, "level": 0.95}
        out.append(row)
    return out


__all__ = ["check_stored_reading", "extra_figures", "scan_source", "uses_stored"]
