"""What every command's workflow shares: validate a source in one pass, the optional extra figures, the fields a
SOURCE's kind adds to the JSON; :class:`Basis`, what a figure set was computed at and on which rows, the one
description every output labels from; and the split that fitted the stored T (``tempcal.split``, written by
``fit``), from which ``report --eval-rows`` re-derives the held-out rows."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..core import parallel
from ..core.scan import Scan
from ..core.splitting import stratified_split
from ..errors import AS_LOGITS, AS_PROBS, PROBS_KEY, DataError, Note, ProbabilitiesError, TempcalError, is_fitted, param
from ..sources.base import OpenedSource

if TYPE_CHECKING:
    from ..subsets.options import Asked

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
    if parallel.active():
        start, stop = opened.share()
        data = data.select(torch.arange(start, stop))
    try:
        scan = Scan(data, device=device, chunk_rows=chunk_rows, labelled=labelled, fit_rows=fit_rows)
    except DataError as exc:
        raise exc.prefixed(f"{opened.name}: ") from None
    if scan.looks_like_probabilities and probs is None:
        raise opened.kind.probabilities_refused(opened)
    return scan


def json_fields(opened: OpenedSource | None) -> dict[str, Any]:
    """The fields ``opened``'s kind adds to a command's JSON (none without a source)."""
    return {} if opened is None else dict(opened.json)


#: The JSON fields that count what a kind left out or changed while reading (evaluation logs, confidence tables).
COUNTED = ("rows_incomplete", "clipped")


def eval_json_fields(evaluated: OpenedSource | None) -> dict[str, Any]:
    """An ``--eval`` file's counts, beside SOURCE's: ``eval_rows_incomplete``, ``eval_clipped`` where its kind
    counts them (SOURCE's own ``rows_incomplete`` / ``clipped`` count SOURCE's rows only)."""
    fields = json_fields(evaluated)
    return {f"eval_{key}": fields[key] for key in COUNTED if key in fields}


def ood_json_fields(others: Sequence[OpenedSource]) -> dict[str, Any]:
    """The OOD files' counts, one per ``--ood`` file in order (None for a file whose kind counts none):
    ``ood_rows_incomplete``, ``ood_clipped`` where any of their kinds counts them."""
    keys = [key for key in COUNTED if any(key in other.json for other in others)]
    return {f"ood_{key}": [other.json.get(key) for other in others] for key in keys}


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


def extra_figures(scan: Scan, taus: Sequence[float], asked: Asked) -> list[dict]:
    """Per temperature: the asked-for estimators under their own names, and bootstrap intervals ``*_ci``; all of
    every rank's rows."""
    from ..metrics.bootstrap import bootstrap_scan
    from ..metrics.calibration import estimators_for

    out = []
    equal_mass = {"ece_equal_mass", "l2_ce_debiased"} & set(asked.estimators)
    for tau in taus:
        row: dict = {}
        # One per-sample pass (every rank's rows, gathered) serves the equal-mass estimators and the bootstrap.
        per_sample = scan.per_sample(1.0 / tau) if asked.bootstrap and equal_mass else None
        if asked.estimators:
            row.update(estimators_for(scan, tau, asked.bins, list(asked.estimators), per_sample=per_sample))
        if asked.bootstrap:
            row.update(asked.interval_fields(bootstrap_scan(scan, tau, asked.bootstrap, asked.seed, asked.bins,
                                                            per_sample=per_sample)))
        out.append(row)
    return out


# -- the split that fitted the stored T ------------------------------------------------------------

SPLIT_KEY = "tempcal.split"


@dataclass(frozen=True)
class StoredSplit:
    """How the fit that stored T chose its rows: a seeded split (``val_fraction``, ``seed``) or every row."""

    rows: int
    val_fraction: float | None = None  # None: every row fitted T
    seed: int = 0
    n_fit: int | None = None
    labels: str = ""  # a digest of the labels the split came from

    @property
    def held_out(self) -> bool:
        return self.val_fraction is not None

    def to_metadata(self) -> dict[str, str | None]:
        if self.val_fraction is None:
            value: dict[str, Any] = {"fit": "all", "rows": self.rows}
        else:
            value = {"fit": "split", "val_fraction": self.val_fraction, "seed": self.seed, "rows": self.rows,
                     "n_fit": self.n_fit, "labels": self.labels}
        return {SPLIT_KEY: json.dumps(value)}

    def describe(self) -> str:
        """The rows that fitted T, as a note says it."""
        if self.val_fraction is None:
            return f"all {self.rows:,} of its rows"
        return (f"{self.n_fit:,} of its {self.rows:,} rows ({param('val_fraction')} {self.val_fraction:g}, "
                f"{param('seed')} {self.seed})")


def fitted_split(report: Any) -> StoredSplit:
    """The split a fit report used (``FitReport``): its seeded split, or every row of SOURCE."""
    rows = report.opened.data.num_samples
    if report.eval_source is None and report.val_fraction is not None and report.val_fraction != 1:
        return StoredSplit(rows, float(report.val_fraction), int(report.seed), int(report.n_fit),
                           labels_digest(report.opened.data.labels))
    return StoredSplit(rows)


def labels_digest(labels: Any) -> str:
    """A short digest of the labels (the split depends on them alone): another file's labels give another."""
    values = np.ascontiguousarray(np.asarray(labels.cpu() if hasattr(labels, "cpu") else labels, dtype=np.int64))
    return hashlib.sha256(values.tobytes()).hexdigest()[:16]


def stored_split(opened: OpenedSource) -> StoredSplit | None:
    """The split stored with ``opened``'s T (None when there is no T, or it was stored without one)."""
    if not opened.paths or opened.stored_problem is not None or opened.stored is None:
        return None
    text = opened.kind.stored_metadata(opened.paths[0]).get(SPLIT_KEY)
    return None if text is None else _parse(text, f"{opened.paths[0]}: '{SPLIT_KEY}'")


def _parse(text: str, where: str) -> StoredSplit:
    """A stored split, each field checked (a bad one is exit 2 naming it)."""
    try:
        value = json.loads(text) if len(text) <= 1000 else None
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict) or value.get("fit") not in ("all", "split"):
        raise DataError(f"{where} is not a split tempcal wrote (fix it, or fit again)")
    rows = _whole(value.get("rows"), where, "rows")
    if value["fit"] == "all":
        return StoredSplit(rows)
    fraction = value.get("val_fraction")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not (0 < fraction < 1):
        raise DataError(f"{where}: 'val_fraction' is {fraction!r}; expected a number strictly between 0 and 1")
    digest = value.get("labels")
    if not isinstance(digest, str) or len(digest) > 64:
        raise DataError(f"{where}: 'labels' is {digest!r}; expected the digest of the labels tempcal wrote")
    n_fit = _whole(value.get("n_fit"), where, "n_fit")
    if not 0 < n_fit < rows:  # the fields together: a split fits on some rows and holds out the others
        raise DataError(f"{where}: 'n_fit' is {n_fit} of 'rows' {rows}; a split fits on at least one row and holds "
                        "out at least one (fix it, or fit again)")
    return StoredSplit(rows, float(fraction), _whole(value.get("seed"), where, "seed"), n_fit, digest)


def _whole(value: Any, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise DataError(f"{where}: '{name}' is {value!r}; expected a whole number >= 0")
    return value


def evaluation_rows(opened: OpenedSource, split: StoredSplit | None) -> np.ndarray:
    """The rows of ``opened`` its stored T was not fitted on, re-derived from the stored split."""
    name = opened.name
    if split is None:
        raise TempcalError(f"{param('eval_rows')}: {name} has no stored split (fit it with this version of tempcal, "
                           "which stores one beside T)")
    if not split.held_out:
        raise TempcalError(f"{param('eval_rows')}: {name}'s stored T was fitted on {split.describe()}; none are "
                           f"held out (fit with {param('folds')} K for out-of-fold figures)")
    n = opened.data.num_samples
    if n != split.rows:
        raise DataError(f"{param('eval_rows')}: {name} has {n:,} rows that count, but the fit that stored T split "
                        f"{split.rows:,}")
    assert split.val_fraction is not None
    if labels_digest(opened.data.labels) != split.labels:
        raise DataError(f"{param('eval_rows')}: {name}'s labels are not those the stored split was drawn from (the "
                        "file changed since the fit: fit again)")
    _, eval_index = stratified_split(opened.data.labels.numpy(), split.val_fraction, split.seed)
    return eval_index


def in_sample_note(opened: OpenedSource, split: StoredSplit, scored: int) -> Note | None:
    """What a report over every row of ``opened`` should say about the rows its stored T was fitted on."""
    if split.rows != scored:
        return None
    if split.held_out:
        return Note(f"{opened.name}: its stored T was fitted on {split.describe()}; these figures include them "
                    f"({param('eval_rows')} reports on the {split.rows - (split.n_fit or 0):,} held out)")
    return Note(f"{opened.name}: its stored T was fitted on {split.describe()}; these figures are in-sample "
                f"(fit with {param('folds')} K for out-of-fold figures)")


__all__ = ["AT_FOLDS", "AT_GLOBAL", "AT_GROUPS", "AT_ONE", "ROWS_ALL", "ROWS_FILE", "ROWS_HELD_OUT", "ROWS_OUT_OF_FOLD",
           "Basis", "check_stored_reading", "eval_json_fields", "evaluation_rows", "extra_figures", "fitted_split",
           "in_sample_note", "json_fields", "ood_json_fields", "report_basis", "scan_source", "stored_split",
           "uses_stored"]
