"""Which rows of a SOURCE fitted its stored T: ``tempcal.split`` (``{"fit": "split", "val_fraction", "seed", "rows",
"n_fit", "labels"}`` or ``{"fit": "all", "rows"}``), written by ``fit``; ``report --eval-rows`` re-derives the held-out
rows from it (the split comes from the labels alone)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.splitting import stratified_split
from ..errors import DataError, Note, TempcalError, param
from ..sources.base import OpenedSource

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


__all__ = ["evaluation_rows", "fitted_split", "in_sample_note", "stored_split"]
