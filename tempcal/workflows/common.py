"""Whole-file jobs behind the CLI commands: load, validate, split, fit, evaluate."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from ..core import distributed
from ..core.data import LogitsSource
from ..core.fitting import FitResult, fit_temperature
from ..core.scan import Scan
from ..core.splitting import stratified_split
from ..errors import DataError, TempcalError
from ..io.safetensors_header import load_logits
from ..metrics.calibration import DEFAULT_BINS, CalibrationMetrics, evaluate_many
from ..sources.safetensors import IGNORE_INDEX, expand_sources, open_sharded
from ..validation import check_taus, parse_tau


@dataclass
class FitReport:
    """What ``tempcal fit`` reports: the fit, and calibration before (T = 1) and after on the evaluation samples."""

    source: str
    eval_source: str | None
    fit: FitResult
    before: CalibrationMetrics
    after: CalibrationMetrics
    num_classes: int
    n_fit: int
    n_eval: int
    val_fraction: float | None
    seed: int
    bins: int
    device: str
    warnings: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # SOURCE's files, where write-back goes
    extras: list[dict] = field(default_factory=list)  # before, after: other estimators, bootstrap intervals

    @property
    def temperature(self) -> float:
        return self.fit.temperature

    def to_json(self) -> dict:
        """The contract's JSON plus how the fit went and the reliability bins."""

        def block(m: CalibrationMetrics) -> dict[str, Any]:
            out: dict[str, Any] = dict(m.summary())
            out.update(entropy=m.entropy, mean_confidence=m.mean_confidence, tau=m.tau,
                       bins=[b.__dict__ for b in m.bins])
            return out

        before, after = block(self.before), block(self.after)
        if self.extras:
            before.update(self.extras[0])
            after.update(self.extras[1])
        return {
            "temperature": self.temperature, "n_fit": self.n_fit, "n_eval": self.n_eval,
            "num_classes": self.num_classes, "before": before, "after": after,
            "passes": self.fit.passes, "converged": self.fit.converged, "objective": self.fit.objective,
            "bound": self.fit.bound, "fit_nll": self.fit.nll, "source": self.source,
            "eval_source": self.eval_source, "val_fraction": self.val_fraction, "seed": self.seed,
            "bins_count": self.bins, "device": self.device, "warnings": self.warnings,
        }


Sources = Any  # a path, a glob, a list of them, or an OpenedSource


@dataclass
class OpenedSource:
    """One SOURCE argument: its files (shards), its logits as a chunked source, and the stored T."""

    paths: list[Path]
    data: LogitsSource  # LogitsData (in memory) or ShardedLogits (read in chunks)
    stored_temperature: float | None
    warnings: list[str] = field(default_factory=list)  # e.g. a stale sidecar

    @property
    def name(self) -> str:
        more = f" (+{len(self.paths) - 1} more shards)" if len(self.paths) > 1 else ""
        return f"{self.paths[0]}{more}"

    def share(self) -> tuple[int, int]:
        """The rows ``[start, stop)`` this process reduces: all of them, or its rank's share under torch.distributed."""
        return distributed.share(self.data.num_samples)

    def local_rows(self, rows) -> torch.Tensor:
        """Global row positions ``rows`` that fall in this process's share, relative to its start."""
        start, stop = self.share()
        rows = torch.as_tensor(rows, dtype=torch.int64)
        return rows[(rows >= start) & (rows < stop)] - start


def open_source(source: Sources, *, logits_key: str = "logits", labels_key: str = "labels", probs: bool = False,
                ignore_index: int | None = IGNORE_INDEX, labels_optional: bool = False) -> OpenedSource:
    """Check the files' headers and shapes; logits are read in chunks later (``--probs`` reads one file whole).

    An :class:`OpenedSource` (e.g. a model already run over its inputs) is returned as it is.
    """
    if isinstance(source, OpenedSource):
        return source
    paths = expand_sources([source] if isinstance(source, (str, os.PathLike)) else list(source))
    if not paths:
        raise TempcalError("no SOURCE file given")
    from ..sources.formats import file_format, load_any

    other = [p for p in paths if p.exists() and file_format(p) != "safetensors"]
    if other:
        if len(paths) > 1:
            raise TempcalError(f"{other[0]}: shards must be .safetensors files")
        loaded_any = load_any(paths[0], logits_key=logits_key, labels_key=labels_key, probs=probs,
                              labels_required=not labels_optional, ignore_index=ignore_index)
        opened = OpenedSource(paths, loaded_any.data, loaded_any.stored_temperature)
        opened.warnings = list(loaded_any.warnings)
        return opened
    if probs:
        if len(paths) > 1:
            raise TempcalError("--probs takes a single file, not shards")
        loaded = load_logits(paths[0], logits_key=logits_key, labels_key=labels_key, probs=True)
        return OpenedSource(paths, cast(LogitsSource, loaded.data), loaded.stored_temperature)
    data = open_sharded(paths, logits_key=logits_key, labels_key=labels_key, ignore_index=ignore_index,
                        labels_optional=labels_optional)
    return OpenedSource(paths, data, data.shards[0].header.stored_temperature())


def scan_source(opened: OpenedSource, *, device: str | torch.device, chunk_rows: int | None, probs: bool,
                warnings: list[str], labelled: bool = True) -> Scan:
    """Validate a source's values (this process's share of them) in one pass; warn on probability-like input."""
    data = opened.data
    warnings.extend(opened.warnings)
    if distributed.active():
        start, stop = opened.share()
        data = data.select(torch.arange(start, stop))
    try:
        scan = Scan(data, device=device, chunk_rows=chunk_rows, labelled=labelled)
    except DataError as exc:
        raise DataError(f"{opened.name}: {exc}") from None
    if scan.looks_like_probabilities and not probs:
        warnings.append(f"{opened.name}: every row of the logits looks like a probability vector "
                        "(values in [0, 1] summing to 1); pass --probs if they are probabilities")
    return scan


def fit_file(source: Sources, *, eval_file: Sources | None = None, val_fraction: float = 0.5,
             seed: int = 0, objective: str = "nll", bins: int = DEFAULT_BINS, device: str = "auto",
             logits_key: str = "logits", labels_key: str = "labels", probs: bool = False,
             chunk_rows: int | None = None, ignore_index: int | None = IGNORE_INDEX,
             estimators: Sequence[str] = (), bootstrap: int = 0) -> FitReport:
    """Fit T on ``source`` (a seeded stratified part of it, or all of it with ``eval_file``) and evaluate.

    A source is a file, a glob pattern, or a list of them (shards read in chunks).
    """
    warnings: list[str] = []
    keys: dict[str, Any] = {"logits_key": logits_key, "labels_key": labels_key, "probs": probs,
                            "ignore_index": ignore_index}
    loaded = open_source(source, **keys)
    evaluated = None
    if eval_file is not None:
        evaluated = open_source(eval_file, **keys)
        if evaluated.data.num_classes != loaded.data.num_classes:
            raise DataError(f"{evaluated.name}: has {evaluated.data.num_classes} classes but {loaded.name} has "
                            f"{loaded.data.num_classes}")
    scan = scan_source(loaded, device=device, chunk_rows=chunk_rows, probs=probs, warnings=warnings)
    if evaluated is not None:
        fit_scan = scan
        eval_scan = scan_source(evaluated, device=device, chunk_rows=chunk_rows, probs=probs, warnings=warnings)
        fraction = None
    else:
        fit_index, eval_index = stratified_split(loaded.data.labels.numpy(), val_fraction, seed)
        if val_fraction == 1:
            fit_scan = eval_scan = scan
        else:
            fit_scan, eval_scan = scan.select(loaded.local_rows(fit_index)), scan.select(loaded.local_rows(eval_index))
        fraction = val_fraction
    if eval_scan.num_samples < 1:
        where = evaluated.name if evaluated is not None else loaded.name
        raise DataError(f"{where}: the evaluation part holds no samples"
                        + ("" if evaluated is not None or loaded.data.num_samples < 2
                           else "; lower --val-fraction or pass --eval"))
    try:
        result = fit_temperature(fit_scan, objective=objective, bins=bins)
    except DataError as exc:
        raise DataError(f"{loaded.name}: {exc}") from None
    result.passes += 1  # the validating scan of the fitting samples
    warnings.extend(result.warnings)
    before, after = evaluate_many(eval_scan, [1.0, result.temperature], bins=bins)
    extras = extra_figures(eval_scan, [1.0, result.temperature], bins=bins, estimators=estimators,
                           bootstrap=bootstrap, seed=seed)
    return FitReport(
        source=loaded.name, eval_source=None if evaluated is None else evaluated.name, fit=result,
        before=before, after=after, num_classes=loaded.data.num_classes, n_fit=fit_scan.num_samples,
        n_eval=eval_scan.num_samples, val_fraction=fraction, seed=seed, bins=bins,
        device=str(scan.device), warnings=warnings, paths=[str(p) for p in loaded.paths], extras=extras)


@dataclass
class ReportResult:
    """Calibration of one file at several temperatures, all from one pass."""

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

    @property
    def sweep_best(self) -> float | None:
        """The sweep temperature with the lowest NLL."""
        in_sweep = [m for m in self.results if m.tau in self.sweep]
        return min(in_sweep, key=lambda m: m.nll).tau if in_sweep else None

    def to_json(self) -> dict:
        rows = []
        for k, m in enumerate(self.results):
            row = m.to_dict()
            row["stored"] = self.stored_temperature is not None and m.tau == self.stored_temperature
            if self.extras:
                row.update(self.extras[k])
            rows.append(row)
        return {"results": rows, "source": self.source, "n": self.count, "num_classes": self.num_classes,
                "stored_temperature": self.stored_temperature, "bins_count": self.bins,
                "sweep": {"taus": self.sweep, "best_nll_tau": self.sweep_best} if self.sweep else None,
                "device": self.device, "warnings": self.warnings}


def resolve_taus(taus: list[float | str] | None, stored: float | None, sweep: list[float],
                 source: str | os.PathLike = "SOURCE") -> list[float]:
    """The contract's rules: ``fitted`` is the stored T; without --tau (and no sweep) the stored T, else 1.0."""
    resolved = [parse_tau(tau, stored, source) for tau in taus or []]
    if not taus and not sweep:
        resolved.append(stored if stored is not None else 1.0)
    if sweep and stored is not None:
        resolved.append(stored)
    return sorted(set(resolved) | set(sweep))


def report_file(source: Sources, *, taus: list[float | str] | None = None, sweep: list[float] | None = None,
                bins: int = DEFAULT_BINS, device: str = "auto", logits_key: str = "logits",
                labels_key: str = "labels", probs: bool = False, chunk_rows: int | None = None,
                ignore_index: int | None = IGNORE_INDEX, estimators: Sequence[str] = (), bootstrap: int = 0,
                seed: int = 0) -> ReportResult:
    """Calibration metrics of ``source`` at each temperature (``fitted`` = the stored T), in one pass."""
    warnings: list[str] = []
    check_taus(taus or [])
    loaded = open_source(source, logits_key=logits_key, labels_key=labels_key, probs=probs, ignore_index=ignore_index)
    stored = loaded.stored_temperature
    sweep = list(sweep or [])
    resolved = resolve_taus(taus, stored, sweep, loaded.name)
    scan = scan_source(loaded, device=device, chunk_rows=chunk_rows, probs=probs, warnings=warnings)
    results = evaluate_many(scan, resolved, bins=bins)
    extras = extra_figures(scan, resolved, bins=bins, estimators=estimators, bootstrap=bootstrap, seed=seed)
    return ReportResult(loaded.name, loaded.data.num_classes, scan.num_samples, stored, results, sweep, bins,
                        str(scan.device), warnings, extras)


def scan_file(loaded: Any, *, device: str | torch.device, chunk_rows: int | None, probs: bool,
              warnings: list[str]) -> Scan:
    """:func:`scan_source` for a file loaded whole with :func:`tempcal.io.safetensors_header.load_logits`."""
    return scan_source(OpenedSource([loaded.header.path], loaded.data, None), device=device, chunk_rows=chunk_rows,
                       probs=probs, warnings=warnings)


def extra_figures(scan: Scan, taus: Sequence[float], *, bins: int, estimators: Sequence[str] = (),
                  bootstrap: int = 0, seed: int = 0) -> list[dict]:
    """Per temperature: the asked-for estimators under their own names, and bootstrap intervals ``*_ci``."""
    from ..metrics.bootstrap import bootstrap_scan
    from ..metrics.estimators import estimators_for

    out = []
    for tau in taus:
        row: dict = {}
        if estimators:
            row.update(estimators_for(scan, tau, bins, list(estimators)))
        if bootstrap:
            intervals = bootstrap_scan(scan, tau, bootstrap, seed, bins)
            row.update({f"{name}_ci": list(interval) for name, interval in intervals.items()})
            row["bootstrap"] = {"resamples": bootstrap, "seed": seed, "level": 0.95}
        out.append(row)
    return out
