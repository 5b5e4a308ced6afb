"""``tempcal report`` as a function: calibration at several temperatures from one pass."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..conformal.commands import metrics_plan, report_thresholds
from ..errors import TempcalError, check_alphas, check_taus, resolve_taus
from ..metrics.calibration import DEFAULT_BINS, CalibrationMetrics, evaluate_many
from ..sources.base import SourceOptions
from ..sources.registry import Source, open_source
from ..subsets.options import Asked, read_groups
from ..subsets.report import GroupRow, held_out_groups, report_groups
from .common import (
    AT_GROUPS,
    ROWS_ALL,
    ROWS_HELD_OUT,
    Basis,
    check_stored_reading,
    evaluation_rows,
    extra_figures,
    in_sample_note,
    json_fields,
    report_basis,
    scan_source,
    stored_split,
    uses_stored,
)


@dataclass
class ReportResult:
    """Calibration of one SOURCE at several temperatures, all from one pass."""

    source: str
    num_classes: int
    count: int
    stored_temperature: float | None
    results: list[CalibrationMetrics]
    sweep: list[float] = field(default_factory=list)  # the sweep's temperatures, if one was asked for
    bins: int = DEFAULT_BINS
    device: str = "cpu"
    warnings: list[str] = field(default_factory=list)
    extras: list[dict] = field(default_factory=list)  # per temperature: other estimators, bootstrap intervals
    opened: Any = field(default=None, repr=False)  # the OpenedSource (a model's logits can be saved from it)
    group_key: str | None = None  # --group-by KEY
    group_rows: list[GroupRow] | None = None  # per temperature, every group's figures
    eval_rows: bool = False  # only the rows the stored T was not fitted on (the stored split's held-out rows)
    conformal_rows: Any = None  # --conformal-alpha: the rows the thresholds came from and the rows judged
    conformal_reads: int = 0  # the reads the thresholds (and, by groups, the sets) took
    bases: list[Basis] = field(default_factory=list)  # per result: the temperature and rows it was computed at

    def basis(self, k: int) -> Basis:
        """What ``results[k]`` was computed at and on which rows."""
        return self.bases[k]

    def points(self) -> list[CalibrationMetrics]:
        """The results at one global temperature each (a per-group row is no point of a sweep over tau)."""
        return [m for k, m in enumerate(self.results) if self.basis(k).sweep_point]

    @property
    def min_nll_tau(self) -> float | None:
        """The temperature of the lowest NLL among the rows at one temperature (the first of equals)."""
        return min(self.points(), key=lambda m: m.nll).tau if self.points() else None

    def sweep_lowest(self, figure: str) -> float | None:
        """The sweep temperature with the lowest ``figure`` (``nll``, ``smece``, ``aurc``...; NaN never counts)."""
        in_sweep = [m for m in self.points() if m.tau in self.sweep and getattr(m, figure) == getattr(m, figure)]
        return min(in_sweep, key=lambda m: getattr(m, figure)).tau if in_sweep else None

    def to_json(self) -> dict:
        rows = []
        for k, m in enumerate(self.results):
            row = m.to_dict()
            basis = self.basis(k)
            row["stored"] = basis.stored
            row["basis"] = basis.to_json()
            if self.extras:
                row.update(self.extras[k])
            if self.group_rows is not None:
                row.update(per_group=self.group_rows[k].per_group,
                           groups=[g.to_json() for g in self.group_rows[k].groups])
            rows.append(row)
        groups = {} if self.group_key is None else {"group_key": self.group_key}
        sets = {} if self.conformal_rows is None else {"conformal_rows": self.conformal_rows.to_json(),
                                                        "conformal_reads": self.conformal_reads}
        return {**groups, **sets, "results": rows, "source": self.source, "n": self.count, "eval_rows": self.eval_rows,
                "num_classes": self.num_classes, "stored_temperature": self.stored_temperature, "bins_count": self.bins,
                "sweep": self._sweep_json() if self.sweep else None, "min_nll_tau": self.min_nll_tau,
                "device": self.device, "warnings": self.warnings, **json_fields(self.opened)}

    def _sweep_json(self) -> dict:
        """The sweep's temperatures and, for each decision, its best: the lowest NLL, ECE, smooth ECE and AURC."""
        out: dict[str, Any] = {"taus": self.sweep, **{f"best_{figure}_tau": self.sweep_lowest(figure)
                                                      for figure in ("nll", "ece", "smece", "aurc")}}
        if self.conformal_rows is not None:
            out["best_set_size_tau"] = self.smallest_sets()
        return out

    def smallest_sets(self) -> list[dict]:
        """Per alpha and score, the sweep temperature whose conformal sets are smallest on average (at a fixed
        miscoverage the coverage is held; the size is what T changes)."""
        in_sweep = [m for m in self.points() if m.tau in self.sweep and m.conformal]
        if not in_sweep:
            return []
        out = []
        for k, entry in enumerate(in_sweep[0].conformal):
            best = min(in_sweep, key=lambda m: m.conformal[k].mean_size)
            out.append({"alpha": entry.alpha, "score": entry.score, "tau": best.tau,
                        "mean_size": best.conformal[k].mean_size})
        return out


def report_file(source: Source, *, taus: Sequence[float | str] | None = None, sweep: Sequence[float] | None = None,
                bins: int = DEFAULT_BINS, device: str = "auto", chunk_rows: int | None = None,
                estimators: Sequence[str] = (), bootstrap: int = 0, seed: int = 0, group_by: str | None = None,
                eval_rows: bool = False, conformal_alpha: Sequence[float] = (), options: SourceOptions | None = None,
                **keys: Any) -> ReportResult:
    """Calibration metrics of ``source`` at each temperature (``fitted`` = the stored T), in one pass.

    Without ``taus`` (and no ``sweep``): the stored T, else 1. ``options`` or keyword arguments
    (``logits_key=...``) say how to read the source, as for :func:`open_source`; a T fitted on probabilities
    is applied to log(p), as it was fitted. ``group_by`` (a tensor of SOURCE, or ``task``): every figure per
    group too, and at the stored T each group's rows at the T_g stored for that key. ``eval_rows``: only the rows
    the stored T was not fitted on, re-derived from the split ``fit`` stored beside T; without it, a note says
    when the figures include the fitting rows. ``conformal_alpha``: LAC and APS sets at every temperature (see
    :mod:`tempcal.conformal.commands` for the rows they use).
    """
    warnings: list[str] = []
    check_taus(taus or [])
    alphas = check_alphas(conformal_alpha)
    asked = Asked(bins, seed, estimators, bootstrap, alphas)
    loaded = open_source(source, options, group_by=group_by, **keys)
    stored = loaded.stored_temperature
    sweep = list(sweep or [])
    check_stored_reading(loaded, uses_stored(taus, sweep))
    resolved = resolve_taus(taus, stored, loaded.name, sweep=sweep, place=loaded.temperature_place())
    groups = read_groups(loaded, group_by) if group_by is not None else None
    scan = scan_source(loaded, device=device, chunk_rows=chunk_rows, probs=loaded.options.probs, warnings=warnings)
    held_out, in_sample = _scored_rows(loaded, eval_rows, stored is not None and stored in resolved, warnings)
    full, share, all_groups = scan, None, groups
    if held_out is not None:
        scan = scan.select(loaded.local_rows(held_out))
        if groups is not None:
            groups, share = held_out_groups(loaded, groups, held_out)
    rows = ROWS_HELD_OUT if held_out is not None else ROWS_ALL
    if groups is None:
        sets = report_thresholds(full, loaded, resolved, alphas, seed, warnings) if alphas else None
        plan = metrics_plan(sets, loaded, held_out is None) if sets is not None else None
        results = evaluate_many(scan, resolved, bins=bins, extra=plan)
        extras, group_rows = extra_figures(scan, resolved, asked), None
        conformal_rows, conformal_reads = (None, 0) if sets is None else (sets.rows, sets.reads)
    else:
        assert all_groups is not None
        run = report_groups(loaded, scan, full, groups, all_groups, resolved, asked, share=share, stored=stored,
                            at_stored=uses_stored(taus, sweep), warnings=warnings)
        results, extras, group_rows = run.results, run.extras, run.rows
        conformal_rows, conformal_reads = run.conformal_rows, run.conformal_reads
    bases = [Basis(AT_GROUPS, rows, scan.num_samples, stored=True, in_sample=in_sample)
             if group_rows is not None and group_rows[k].per_group else
             report_basis(m.tau, rows=rows, n=scan.num_samples, stored=stored, in_sample=in_sample)
             for k, m in enumerate(results)]
    return ReportResult(loaded.name, loaded.data.num_classes, scan.num_samples, stored, results, sweep, bins,
                        str(scan.device), warnings, extras, loaded, None if groups is None else groups.key, group_rows,
                        eval_rows, conformal_rows, conformal_reads, bases)


def _scored_rows(opened: Any, eval_rows: bool, at_stored: bool, warnings: list[str]
                 ) -> tuple[np.ndarray | None, bool]:
    """The held-out rows with ``eval_rows`` (None: every row; then a note when the stored T was fitted on them), and
    whether the rows scored include the stored T's fitting rows."""
    if eval_rows:
        return evaluation_rows(opened, stored_split(opened)), False
    try:
        split = stored_split(opened) if at_stored else None
    except TempcalError as exc:
        warnings.append(f"{exc}; the rows the stored T was fitted on are unknown")
        return None, False
    note = None if split is None else in_sample_note(opened, split, opened.data.num_samples)
    if note is not None:
        warnings.append(note)
    return None, note is not None


__all__ = ["ReportResult", "report_file"]
