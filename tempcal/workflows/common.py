"""What every command's workflow shares: validate a source in one pass, the optional extra figures, and
:class:`Basis`, what a figure set was computed at and on which rows: the one description every output (and the JSON's
``basis``) labels from, so that no output names a figure set by a temperature it was not computed at."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..core import distributed
from ..core.scan import Scan
from ..errors import DataError, param
from ..sources.base import OpenedSource
from ..validation import AS_LOGITS, AS_PROBS, PROBS_KEY, ProbabilitiesError, is_fitted

#: What a figure set was computed at.
AT_ONE, AT_GLOBAL, AT_TAU, AT_GROUPS, AT_FOLDS = "T = 1", "global T", "tau", "per-group T", "out of fold"
#: Which rows it covers.
ROWS_HELD_OUT, ROWS_ALL, ROWS_FITTING, ROWS_OUT_OF_FOLD, ROWS_FILE = (
    "held out", "all", "fitting", "out of fold", "evaluation file")


@dataclass(frozen=True)
class Basis:
    """One figure set's temperature (``at``, and ``tau`` when one T holds for every row) and rows (``rows``, ``n``
    of them). ``stored``: the temperature is the one stored with SOURCE (per-group: the stored T_g); ``in_sample``:
    the rows include those T was fitted on; ``folds``: K of out-of-fold figures; ``source``: the evaluation file."""

    at: str
    rows: str
    n: int
    tau: float | None = None
    stored: bool = False
    in_sample: bool = False
    folds: int | None = None
    source: str | None = None

    @property
    def sweep_point(self) -> bool:
        """Whether the set is at one global temperature (a point of a curve against tau); per-group and
        out-of-fold sets never are."""
        return self.tau is not None and self.at not in (AT_GROUPS, AT_FOLDS)

    def label(self) -> str:
        """The set's name: ``T = 1``, ``T = 2.02``, ``T = 2.02 (stored)``, ``tau = 3.162``, ``per-group T (stored)``,
        ``out of fold``."""
        if self.at == AT_FOLDS:
            return AT_FOLDS
        if self.at == AT_GROUPS:
            return AT_GROUPS + (" (stored)" if self.stored else "")
        assert self.tau is not None
        name = "tau" if self.at == AT_TAU else "T"
        return f"{name} = {self.tau:.4g}" + (" (stored)" if self.stored and self.at == AT_GLOBAL else "")

    def rows_label(self) -> str:
        """The rows it covers, as a phrase: ``on the 150 held-out rows``, ``out of fold over all 300 rows``."""
        phrase = {ROWS_OUT_OF_FOLD: "out of fold over all {n} rows", ROWS_HELD_OUT: "on the {n} held-out rows",
                  ROWS_FITTING: "on the {n} rows T was fitted on", ROWS_FILE: "on the {n} rows of {source}"}.get(
            self.rows, "on all {n} rows" + (", T's fitting rows included" if self.in_sample else ""))
        return phrase.format(n=f"{self.n:,}", source=self.source)

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "tau": self.tau, "rows": self.rows, "n": self.n, "stored": self.stored,
                "in_sample": self.in_sample, "folds": self.folds, "source": self.source, "label": self.label(),
                "rows_label": self.rows_label()}


def report_basis(tau: float, *, rows: str, n: int, stored: float | None, in_sample: bool = False) -> Basis:
    """A ``report`` row at one temperature: the stored global T, T = 1, or another tau."""
    if stored is not None and tau == stored:
        return Basis(AT_GLOBAL, rows, n, tau, stored=True, in_sample=in_sample)
    return Basis(AT_ONE if tau == 1.0 else AT_TAU, rows, n, tau)


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
    from ..metrics.calibration import estimators_for

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


__all__ = ["AT_FOLDS", "AT_GLOBAL", "AT_GROUPS", "AT_ONE", "ROWS_ALL", "ROWS_FILE", "ROWS_HELD_OUT", "ROWS_OUT_OF_FOLD",
           "Basis", "check_stored_reading", "extra_figures", "report_basis", "scan_source", "uses_stored"]
