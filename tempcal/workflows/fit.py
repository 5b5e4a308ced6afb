"""``tempcal fit`` as a function: open, validate, split, fit T, evaluate before and after."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from ..core.data import LogitsData
from ..core.fitting import FitResult, fit_temperature
from ..core.scan import ALL_ROWS
from ..core.splitting import stratified_split
from ..errors import DataError, StoredNote, TempcalError, param
from ..metrics.calibration import DEFAULT_BINS, CalibrationMetrics, ConformalPlan, evaluate_many
from ..metrics.conformal_pass import fit_thresholds
from ..output.progress import Progress
from ..sources.base import SourceOptions
from ..sources.registry import Source, open_source
from .common import extra_figures, scan_source


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
    conformal_reads: int = 0  # reads of the fitting rows for the conformal thresholds (after the fit)
    opened: Any = field(default=None, repr=False)  # the OpenedSource, for write-back and saving a model

    @property
    def temperature(self) -> float:
        return self.fit.temperature

    @property
    def passes(self) -> int:
        """Reads of the data: the fit's (the validating scan included) and the conformal thresholds'."""
        return self.fit.passes + self.conformal_reads

    def to_json(self) -> dict:
        """The contract's JSON plus how the fit went and the reliability bins."""

        def block(m: CalibrationMetrics) -> dict[str, Any]:
            out: dict[str, Any] = dict(m.summary())
            out.update(entropy=m.entropy, mean_confidence=m.mean_confidence, tau=m.tau,
                       bins=[b.__dict__ for b in m.bins])
            out.update(m.decisions())
            return out

        before, after = block(self.before), block(self.after)
        if self.extras:
            before.update(self.extras[0])
            after.update(self.extras[1])
        return {
            "temperature": self.temperature, "n_fit": self.n_fit, "n_eval": self.n_eval,
            "num_classes": self.num_classes, "before": before, "after": after,
            "passes": self.passes, "converged": self.fit.converged, "objective": self.fit.objective,
            "fit_method": self.fit.method, "error_bound": self.fit.error_bound,
            "bound": self.fit.bound, "fit_nll": self.fit.nll, "source": self.source,
            "eval_source": self.eval_source, "val_fraction": self.val_fraction, "seed": self.seed,
            "bins_count": self.bins, "device": self.device, "warnings": self.warnings,
            "probs": bool(self.opened is not None and self.opened.options.probs),
        }


def fit_file(source: Source, *, eval_file: Source | None = None, val_fraction: float = 0.5,
             seed: int = 0, objective: str = "nll", bins: int = DEFAULT_BINS, device: str = "auto",
             chunk_rows: int | None = None, estimators: Sequence[str] = (), bootstrap: int = 0,
             conformal_alpha: Sequence[float] = (), options: SourceOptions | None = None, **keys: Any) -> FitReport:
    """Fit T on ``source`` (a seeded stratified part of it, or all of it with ``eval_file``) and evaluate.

    A source is a file, a glob pattern, a list of them (shards read in chunks), or an opened source;
    ``options`` or keyword arguments (``logits_key=...``) say how to read it, as for :func:`open_source`.
    Values that look like probabilities are refused unless ``probs`` says what they are (or the T stored
    with the source was fitted on them), before anything is fitted. ``conformal_alpha`` forms LAC and APS sets at
    each miscoverage level, thresholds from the fitting rows (one more read of them), sets on the evaluation rows.
    """
    alphas = check_alphas(conformal_alpha)
    warnings: list[str] = []
    loaded = open_source(source, options, **keys)
    loaded.warnings = [w for w in loaded.warnings if not isinstance(w, StoredNote)]  # the fit replaces that T
    probs = loaded.options.probs
    evaluated = None
    if eval_file is not None:
        evaluated = loaded.open_related(eval_file)
        if evaluated.data.num_classes != loaded.data.num_classes:
            raise DataError(f"{evaluated.name}: has {evaluated.data.num_classes} classes but {loaded.name} has "
                            f"{loaded.data.num_classes}")
    # The split comes from the labels alone, so the validating scan knows the fitting rows and prepares the
    # fit's start on exactly them: the fit then takes at most a read or two more.
    fit_rows: Any = ALL_ROWS
    if evaluated is None and val_fraction != 1:
        fit_index, eval_index = stratified_split(loaded.data.labels.numpy(), val_fraction, seed)
        fit_rows = loaded.local_rows(fit_index)
    scan = scan_source(loaded, device=device, chunk_rows=chunk_rows, probs=probs, warnings=warnings,
                       fit_rows=fit_rows)
    if evaluated is not None:
        fit_scan = scan
        eval_scan = scan_source(evaluated, device=device, chunk_rows=chunk_rows, probs=probs, warnings=warnings)
        fraction = None
    else:
        if val_fraction == 1:
            fit_scan = eval_scan = scan
        else:
            fit_scan, eval_scan = scan.select(fit_rows), scan.select(loaded.local_rows(eval_index))
        fraction = val_fraction
    if eval_scan.num_samples < 1:
        where = evaluated.name if evaluated is not None else loaded.name
        raise DataError(f"{where}: the evaluation part holds no samples"
                        + ("" if evaluated is not None or loaded.data.num_samples < 2
                           else f"; lower {param('val_fraction')} or pass {param('eval')}"))
    try:
        with Progress("fitting T", enabled=loaded.options.progress) as progress:
            result = fit_temperature(fit_scan, objective=objective, bins=bins, on_pass=progress.ece_pass)
    except DataError as exc:
        raise exc.prefixed(f"{loaded.name}: ") from None
    warnings.extend(result.warnings)
    taus = [1.0, result.temperature]
    plan = ConformalPlan(alphas, fit_thresholds(fit_scan, taus, alphas)) if alphas else None
    before, after = evaluate_many(eval_scan, taus, bins=bins, conformal=plan)
    extras = extra_figures(eval_scan, [1.0, result.temperature], bins=bins, estimators=estimators,
                           bootstrap=bootstrap, seed=seed)
    return FitReport(
        source=loaded.name, eval_source=None if evaluated is None else evaluated.name, fit=result,
        before=before, after=after, num_classes=loaded.data.num_classes, n_fit=fit_scan.num_samples,
        n_eval=eval_scan.num_samples, val_fraction=fraction, seed=seed, bins=bins,
        device=str(scan.device), warnings=warnings, paths=[str(p) for p in loaded.paths], extras=extras,
        conformal_reads=1 if alphas else 0, opened=loaded)


def check_alphas(alphas: Sequence[float]) -> list[float]:
    """The conformal miscoverage levels, each strictly between 0 and 1, in the order given (repeats dropped)."""
    out: list[float] = []
    for alpha in alphas:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
            raise TempcalError(f"{param('conformal_alpha')} {alpha}: expected a number strictly between 0 and 1")
        if float(alpha) not in out:
            out.append(float(alpha))
    return out


def write_back(report: FitReport, *, output: str | None = None, save_model: str | None = None,
               save_logits: str | None = None, store: bool = True) -> list[str]:
    """Keep the fitted T: in SOURCE's files (or a copy at ``output``); for a model SOURCE, its logits as a
    logits file (``save_logits``) and the model calibrated (``save_model``). ``store=False`` writes no T
    (the logits are still saved, without T). Returns the paths that now hold T."""
    from ..sources.model import ModelSource

    opened = report.opened
    if not isinstance(opened, ModelSource):
        return [str(p) for p in opened.write_temperature(report.temperature, output)] if store else []
    from ..models.save import save_calibrated_model
    from ..models.save import save_logits as write_logits

    if save_logits:
        write_logits(cast(LogitsData, opened.data), save_logits, temperature=report.temperature if store else None,
                     metadata={"tempcal.model": str(opened.model.path), "tempcal.inputs": str(opened.inputs_path)})
    if save_model and store:
        return [str(save_calibrated_model(opened.model.path, report.temperature, save_model,
                                          output_key=opened.options.output_key, check_inputs=opened.inputs_path,
                                          inputs_key=opened.options.inputs_key))]
    return []


__all__ = ["FitReport", "check_alphas", "fit_file", "write_back"]
