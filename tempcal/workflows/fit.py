"""``tempcal fit`` as a function: open, validate, split, fit T, evaluate before and after."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..conformal.passes import ConformalPlan, fit_thresholds
from ..core.fitting import FitResult, fit_temperature
from ..core.scan import ALL_ROWS
from ..core.splitting import stratified_split
from ..errors import DataError, StoredNote, check_alphas, param
from ..metrics.calibration import DEFAULT_BINS, CalibrationMetrics, evaluate_many
from ..sources.base import Keep, Kept, SourceOptions
from ..sources.registry import Source, open_source
from ..subsets.cells import Subsets, metrics_block
from ..subsets.fits import SubsetRun, crossfit_run, grouped_run
from ..subsets.options import Asked, read_groups
from ..subsets.options import plan as subset_plan
from .common import (
    AT_FOLDS,
    AT_GLOBAL,
    AT_GROUPS,
    AT_ONE,
    ROWS_ALL,
    ROWS_FILE,
    ROWS_HELD_OUT,
    ROWS_OUT_OF_FOLD,
    Basis,
    eval_json_fields,
    extra_figures,
    fitted_split,
    json_fields,
    scan_source,
)

#: The share of SOURCE that fits T when neither ``val_fraction`` nor ``eval_file`` nor ``folds`` is given.
DEFAULT_VAL_FRACTION = 0.5


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
    extras: list[dict] = field(default_factory=list)  # before, after: other estimators, bootstrap intervals
    conformal_reads: int = 0  # reads of the fitting rows for the conformal thresholds (after the fit)
    opened: Any = field(default=None, repr=False)  # the OpenedSource, for write-back and saving a model
    subsets: Subsets | None = None  # --folds and --group-by: the fold and group temperatures and figures
    evaluated: Any = field(default=None, repr=False)  # the --eval file's OpenedSource (its counts in the JSON)

    @property
    def temperature(self) -> float:
        return self.fit.temperature

    @property
    def rows(self) -> str:
        """Which rows ``before`` and ``after`` cover (see :mod:`.basis`)."""
        if self.folds is not None:
            return ROWS_OUT_OF_FOLD
        if self.eval_source is not None:
            return ROWS_FILE
        return ROWS_ALL if self.val_fraction in (None, 1) else ROWS_HELD_OUT

    @property
    def folds(self) -> int | None:
        """K of ``--folds K`` (None without)."""
        return None if self.subsets is None or self.subsets.folds is None else int(self.subsets.folds["k"])

    @property
    def before_basis(self) -> Basis:
        """``before``: T = 1 on the evaluation rows (all rows with ``--folds``)."""
        rows = ROWS_ALL if self.rows == ROWS_OUT_OF_FOLD else self.rows
        return Basis(AT_ONE, rows, self.n_eval, 1.0, source=self.eval_source)

    @property
    def after_basis(self) -> Basis:
        """``after``: the fitted T on the evaluation rows, or each fold's T out of fold."""
        if self.folds is not None:
            return Basis(AT_FOLDS, ROWS_OUT_OF_FOLD, self.n_eval, folds=self.folds)
        return Basis(AT_GLOBAL, self.rows, self.n_eval, self.temperature, in_sample=self.rows == ROWS_ALL,
                     source=self.eval_source)

    def split_label(self) -> str:
        """How the rows were split, as the console's header and the page say it: ``T fitted on 674 rows; figures on
        the 674 held-out rows (stratified split, val-fraction 0.5, seed 0)``."""
        held_out = self.after_basis.rows == ROWS_HELD_OUT
        how = (f" ({self.folds}-fold cross-fitting, seed {self.seed})" if self.folds is not None else
               f" (stratified split, val-fraction {self.val_fraction:g}, seed {self.seed})" if held_out else "")
        fitted = f"{self.n_fit:,} rows" if held_out else f"all {self.n_fit:,} rows"
        return f"T fitted on {fitted}; figures {self.after_basis.rows_label()}{how}"

    def reads_label(self) -> str:
        """``"1 pass"``, ``"3 passes"``: how many reads of the data the fit took."""
        passes = self.fit.passes
        return f"{passes} pass" if passes == 1 else f"{passes} passes"

    @property
    def passes(self) -> int:
        """Reads of the data: the fit's (the validating scan included) and the conformal thresholds'."""
        return self.fit.passes + self.conformal_reads

    def to_json(self) -> dict:
        """The contract's JSON plus how the fit went and the reliability bins."""
        before, after = metrics_block(self.before, full=True), metrics_block(self.after, full=True)
        before["basis"], after["basis"] = self.before_basis.to_json(), self.after_basis.to_json()
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
            **json_fields(self.opened), **eval_json_fields(self.evaluated), **self._subsets_json(),
        }

    def _subsets_json(self) -> dict[str, Any]:
        """The folds and groups, each block of a group (``n`` evaluation rows) with its basis: T = 1, its own T and
        the global T (out of fold with folds)."""
        return {} if self.subsets is None else self.subsets.to_json(lambda n: {
            "before": replace(self.before_basis, n=n).to_json(),
            "after": Basis(AT_GROUPS, self.rows, n, folds=self.folds, source=self.eval_source).to_json(),
            "after_global": replace(self.after_basis, n=n).to_json()})

    def groups_json(self) -> list[dict[str, Any]]:
        """``--group-by``: each group's JSON (its T, counts and figure blocks, each block with its basis)."""
        return self._subsets_json().get("groups", [])

    @property
    def group_temperatures(self) -> dict[str, float] | None:
        """Name -> T_g of every group with fitting rows (None without groups)."""
        return None if self.subsets is None else self.subsets.group_temperatures()


def fit_file(source: Source, *, eval_file: Source | None = None, val_fraction: float | None = None,
             seed: int = 0, objective: str = "nll", bins: int = DEFAULT_BINS, device: str = "auto",
             chunk_rows: int | None = None, estimators: Sequence[str] = (), bootstrap: int = 0,
             conformal_alpha: Sequence[float] = (), folds: int | None = None, group_by: str | None = None,
             group_prior: float | None = None, options: SourceOptions | None = None, progress: Any = None,
             **keys: Any) -> FitReport:
    """Fit T on ``source`` (a seeded stratified part of it, ``val_fraction``, default 0.5; or all of it with
    ``eval_file``) and evaluate.

    A source is a file, a glob pattern, a list of them (shards read in chunks), or an opened source;
    ``options`` or keyword arguments (``logits_key=...``) say how to read it, as for :func:`open_source`.
    Values that look like probabilities are refused unless ``probs`` says what they are (or the T stored
    with the source was fitted on them), before anything is fitted. ``conformal_alpha`` forms LAC and APS sets at
    each miscoverage level, thresholds from the fitting rows (one more read of them), sets on the evaluation rows.

    ``folds`` (K): cross-fitting: T on every row, T_k on the rows outside each of K seeded stratified folds,
    ``after`` out of fold (neither ``eval_file`` nor ``val_fraction`` then). ``group_by`` (a tensor of
    SOURCE, or ``task`` for lm-evaluation-harness logs): a T per group, drawn toward the global T by
    ``group_prior`` (0: independent fits; default :data:`~tempcal.subsets.options.DEFAULT_GROUP_PRIOR`).
    ``progress``: a context manager shown while the one global T is fitted, its ``ece_pass`` told each pass of the
    ECE search (the command line's delayed progress line); None: nothing is shown.
    """
    alphas = check_alphas(conformal_alpha)
    warnings: list[str] = []
    plan = subset_plan(folds, group_prior, eval_file, val_fraction)
    loaded = open_source(source, options, group_by=group_by, **keys)
    loaded.warnings = [w for w in loaded.warnings if not isinstance(w, StoredNote)]  # the fit replaces that T
    if group_by is not None:
        plan = replace(plan, groups=read_groups(loaded, group_by))
    asked = Asked(bins, seed, estimators, bootstrap, alphas, objective)
    evaluated = None
    if plan.folds is not None:  # --folds K: the validating scan of every row, then the cross-fitting run
        scan = fit_scan = eval_scan = scan_source(loaded, device=device, chunk_rows=chunk_rows,
                                                  probs=loaded.options.probs, warnings=warnings, fit_rows=ALL_ROWS)
    else:
        val_fraction = DEFAULT_VAL_FRACTION if val_fraction is None else val_fraction
        probs = loaded.options.probs
        evaluated = None if eval_file is None else _evaluation_file(loaded, eval_file)
        # The split comes from the labels alone, so the validating scan knows the fitting rows and prepares the
        # fit's start on exactly them: the fit then takes at most a read or two more.
        fit_rows: Any = ALL_ROWS
        everything = np.arange(loaded.data.num_samples)
        fit_index, eval_index = everything, everything if evaluated is None else np.arange(evaluated.data.num_samples)
        if evaluated is None and val_fraction != 1:
            fit_index, eval_index = stratified_split(loaded.data.labels.numpy(), val_fraction, seed)
            fit_rows = loaded.local_rows(fit_index)
        scan = scan_source(loaded, device=device, chunk_rows=chunk_rows, probs=probs, warnings=warnings,
                           fit_rows=fit_rows)
        fit_scan = eval_scan = scan
        if evaluated is not None:
            eval_scan = scan_source(evaluated, device=device, chunk_rows=chunk_rows, probs=probs, warnings=warnings)
        elif val_fraction != 1:
            fit_scan, eval_scan = scan.select(fit_rows), scan.select(loaded.local_rows(eval_index))
        _check_evaluation_rows(eval_scan, loaded, evaluated)
    try:
        run = (crossfit_run(loaded, scan, plan, asked, warnings) if plan.folds is not None else
               grouped_run(loaded, evaluated, fit_scan, eval_scan, plan, fit_index, eval_index, asked, warnings)
               if plan.groups is not None else _fit_and_evaluate(fit_scan, eval_scan, asked, progress))
    except DataError as exc:
        raise exc.prefixed(f"{loaded.name}: ") from None
    warnings[:0] = run.fit.warnings
    if plan.folds is None:  # with folds, the run's are out of fold
        run.extras = extra_figures(eval_scan, [1.0, run.fit.temperature], asked)
    return FitReport(
        source=loaded.name, eval_source=None if evaluated is None else evaluated.name, fit=run.fit,
        before=run.before, after=run.after, num_classes=loaded.data.num_classes, n_fit=fit_scan.num_samples,
        n_eval=eval_scan.num_samples, val_fraction=None if evaluated is not None else val_fraction, seed=seed,
        bins=bins, device=str(scan.device), warnings=warnings, extras=run.extras, conformal_reads=run.reads,
        opened=loaded, subsets=run.subsets, evaluated=evaluated)


def _check_evaluation_rows(eval_scan: Any, loaded: Any, evaluated: Any) -> None:
    """Refuse an evaluation part without rows, saying how to get some."""
    if eval_scan.num_samples < 1:
        where = evaluated.name if evaluated is not None else loaded.name
        raise DataError(f"{where}: the evaluation part holds no samples"
                        + ("" if evaluated is not None or loaded.data.num_samples < 2
                           else f"; lower {param('val_fraction')} or pass {param('eval')}"))


def _fit_and_evaluate(fit_scan: Any, eval_scan: Any, asked: Asked, progress: Any = None) -> SubsetRun:
    """The one global T (with a progress line on long runs) and the metrics before and after, conformal sets
    included when ``asked.alphas`` are given."""
    with progress if progress is not None else nullcontext() as display:
        result = fit_temperature(fit_scan, objective=asked.objective, bins=asked.bins,
                                 on_pass=None if display is None else display.ece_pass)
    taus = [1.0, result.temperature]
    alphas = asked.alphas
    sets = ConformalPlan(alphas, fit_thresholds(fit_scan, taus, alphas)) if alphas else None
    before, after = evaluate_many(eval_scan, taus, bins=asked.bins, extra=sets)
    return SubsetRun(result, before, after, None, 1 if alphas else 0)


def _evaluation_file(loaded: Any, eval_file: Source) -> Any:
    """``eval_file`` opened as SOURCE is, with as many classes."""
    evaluated = loaded.open_related(eval_file)
    if evaluated.data.num_classes != loaded.data.num_classes:
        raise DataError(f"{evaluated.name}: has {evaluated.data.num_classes} classes but {loaded.name} has "
                        f"{loaded.data.num_classes}")
    return evaluated


def keep_fit(report: FitReport, *, output: str | None = None, store: bool = True, save_model: str | None = None,
             save_logits: str | None = None, generation: bool = False, save_hidden: str | None = None,
             settings: dict[str, Any] | None = None) -> Kept:
    """Keep the fitted T, the groups' temperatures and the split where SOURCE's kind keeps them
    (:meth:`~tempcal.sources.base.OpenedSource.keep`); ``store=False`` writes no T. The files that hold T, and lines."""
    ask = Keep(store=store, output=output, metadata=fitted_split(report).to_metadata(),
               group_key=report.subsets.group_key if report.subsets else None,
               group_temperatures=report.group_temperatures, save_model=save_model, save_logits=save_logits,
               generation=generation, save_hidden=save_hidden, settings=settings,
               results={"n_fit": report.n_fit, "n_eval": report.n_eval, "fit_method": report.fit.method,
                        "before": {"nll": report.before.nll, "ece": report.before.ece},
                        "after": {"nll": report.after.nll, "ece": report.after.ece}})  # a language model's record
    return report.opened.keep(report.temperature, ask)


__all__ = ["FitReport", "fit_file", "keep_fit"]
