"""Whole-file jobs behind the CLI commands: load, validate, split, fit, evaluate."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from .errors import DataError, TempcalError
from .fitting import FitResult, fit_temperature
from .loading import LogitsFile, load_logits
from .metrics import DEFAULT_BINS, CalibrationMetrics, evaluate_many
from .scan import Scan
from .splitting import stratified_split


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

    @property
    def temperature(self) -> float:
        return self.fit.temperature

    def to_json(self) -> dict:
        """The contract's JSON plus how the fit went and the reliability bins."""

        def block(m: CalibrationMetrics) -> dict:
            out = m.summary()
            out.update(entropy=m.entropy, mean_confidence=m.mean_confidence, tau=m.tau,
                       bins=[b.__dict__ for b in m.bins])
            return out

        return {
            "temperature": self.temperature, "n_fit": self.n_fit, "n_eval": self.n_eval,
            "num_classes": self.num_classes, "before": block(self.before), "after": block(self.after),
            "passes": self.fit.passes, "converged": self.fit.converged, "objective": self.fit.objective,
            "bound": self.fit.bound, "fit_nll": self.fit.nll, "source": self.source,
            "eval_source": self.eval_source, "val_fraction": self.val_fraction, "seed": self.seed,
            "bins_count": self.bins, "device": self.device, "warnings": self.warnings,
        }


def scan_file(loaded: LogitsFile, *, device: str | torch.device, chunk_rows: int | None, probs: bool,
              warnings: list[str]) -> Scan:
    """Validate a loaded file's values in one pass; note when unflagged input looks like probabilities."""
    try:
        scan = Scan(loaded.data, device=device, chunk_rows=chunk_rows)
    except DataError as exc:
        raise DataError(f"{loaded.header.path}: {exc}") from None
    if scan.looks_like_probabilities and not probs:
        warnings.append(f"{loaded.header.path}: every row of the logits looks like a probability vector "
                        "(values in [0, 1] summing to 1); pass --probs if they are probabilities")
    return scan


def fit_file(source: str | os.PathLike, *, eval_file: str | os.PathLike | None = None, val_fraction: float = 0.5,
             seed: int = 0, objective: str = "nll", bins: int = DEFAULT_BINS, device: str = "auto",
             logits_key: str = "logits", labels_key: str = "labels", probs: bool = False,
             chunk_rows: int | None = None) -> FitReport:
    """Fit T on ``source`` (a seeded stratified part of it, or all of it with ``eval_file``) and evaluate."""
    warnings: list[str] = []
    loaded = load_logits(source, logits_key=logits_key, labels_key=labels_key, probs=probs)
    evaluated = None
    if eval_file is not None:
        evaluated = load_logits(eval_file, logits_key=logits_key, labels_key=labels_key, probs=probs)
        if evaluated.data.num_classes != loaded.data.num_classes:
            raise DataError(f"{eval_file}: has {evaluated.data.num_classes} classes but {source} has "
                            f"{loaded.data.num_classes}")
    scan = scan_file(loaded, device=device, chunk_rows=chunk_rows, probs=probs, warnings=warnings)
    if evaluated is not None:
        fit_scan = scan
        eval_scan = scan_file(evaluated, device=device, chunk_rows=chunk_rows, probs=probs, warnings=warnings)
        fraction = None
    else:
        fit_index, eval_index = stratified_split(loaded.data.labels.numpy(), val_fraction, seed)
        if val_fraction == 1:
            fit_scan = eval_scan = scan
        else:
            fit_scan, eval_scan = scan.select(torch.from_numpy(fit_index)), scan.select(torch.from_numpy(eval_index))
        fraction = val_fraction
    if eval_scan.num_samples < 1:
        raise DataError("the evaluation part holds no samples; lower --val-fraction or pass --eval")
    result = fit_temperature(fit_scan, objective=objective, bins=bins)
    result.passes += 1  # the validating scan of the fitting samples
    warnings.extend(result.warnings)
    before, after = evaluate_many(eval_scan, [1.0, result.temperature], bins=bins)
    return FitReport(
        source=str(source), eval_source=None if eval_file is None else str(eval_file), fit=result,
        before=before, after=after, num_classes=loaded.data.num_classes, n_fit=fit_scan.num_samples,
        n_eval=eval_scan.num_samples, val_fraction=fraction, seed=seed, bins=bins,
        device=str(scan.device), warnings=warnings)


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

    @property
    def sweep_best(self) -> float | None:
        """The sweep temperature with the lowest NLL."""
        in_sweep = [m for m in self.results if m.tau in self.sweep]
        return min(in_sweep, key=lambda m: m.nll).tau if in_sweep else None

    def to_json(self) -> dict:
        rows = []
        for m in self.results:
            row = m.to_dict()
            row["stored"] = self.stored_temperature is not None and m.tau == self.stored_temperature
            rows.append(row)
        return {"results": rows, "source": self.source, "n": self.count, "num_classes": self.num_classes,
                "stored_temperature": self.stored_temperature, "bins_count": self.bins,
                "sweep": {"taus": self.sweep, "best_nll_tau": self.sweep_best} if self.sweep else None,
                "device": self.device, "warnings": self.warnings}


def resolve_taus(taus: list[float | str] | None, stored: float | None, sweep: list[float]) -> list[float]:
    """The contract's rules: ``fitted`` is the stored T; without --tau (and no sweep) the stored T, else 1.0."""
    resolved: list[float] = []
    for tau in taus or []:
        if tau == "fitted":
            if stored is None:
                raise TempcalError("--tau fitted: the file holds no stored temperature (run tempcal fit first)")
            resolved.append(stored)
        else:
            resolved.append(float(tau))
    if not taus and not sweep:
        resolved.append(stored if stored is not None else 1.0)
    if sweep and stored is not None:
        resolved.append(stored)
    return sorted(set(resolved) | set(sweep))


def report_file(source: str | os.PathLike, *, taus: list[float | str] | None = None, sweep: list[float] | None = None,
                bins: int = DEFAULT_BINS, device: str = "auto", logits_key: str = "logits",
                labels_key: str = "labels", probs: bool = False, chunk_rows: int | None = None) -> ReportResult:
    """Calibration metrics of ``source`` at each temperature (``fitted`` = the stored T), in one pass."""
    warnings: list[str] = []
    loaded = load_logits(source, logits_key=logits_key, labels_key=labels_key, probs=probs)
    stored = loaded.stored_temperature
    sweep = list(sweep or [])
    resolved = resolve_taus(taus, stored, sweep)
    scan = scan_file(loaded, device=device, chunk_rows=chunk_rows, probs=probs, warnings=warnings)
    results = evaluate_many(scan, resolved, bins=bins)
    return ReportResult(str(source), loaded.data.num_classes, scan.num_samples, stored, results, sweep, bins,
                        str(scan.device), warnings)
