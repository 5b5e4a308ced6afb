"""``tempcal ood`` as a function: score SOURCE (in-distribution) and every OOD set at each tau, then rank; every score
at every tau comes from one scores-only pass per file (ODIN runs the model instead)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ..core.parallel import all_gather_rows
from ..core.scan import Scan
from ..errors import (
    UNIT,
    DataError,
    TempcalError,
    as_temperature,
    check_option,
    check_taus,
    param,
    resolve_taus,
    whole_number,
)
from ..metrics.detection import ID_RECALL, OodMetrics, detection_intervals, detection_metrics
from ..scores import score_label, score_names
from ..scores.engine import scan_scores
from ..sources.base import OpenedSource, SourceOptions
from ..sources.registry import Source, open_source
from ..subsets.ood import group_results, ood_groups
from .common import check_stored_reading, json_fields, ood_json_fields, scan_source, uses_stored

#: Temperatures tried when no ``--tau`` is given (log-spaced); the stored T is added to them.
DEFAULT_TAUS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 1000.0)
#: Confidence level of the bootstrap intervals.
BOOTSTRAP_LEVEL = 0.95


@dataclass(frozen=True)
class _Row:
    """One reported row of an OOD set, as its best and its gate failures name it (first in their JSON)."""

    ood_file: str
    score: str
    tau: float
    auroc: float
    fpr95: float


@dataclass(frozen=True)
class OodBest(_Row):
    """The temperature with the best AUROC for one OOD set and score, beside the calibration temperature."""

    calibration_tau: float | None  # the stored T, when there is one
    calibration_auroc: float | None  # its figures, when it was evaluated
    calibration_fpr95: float | None
    sentence: str


@dataclass(frozen=True)
class OodBestOverall(_Row):
    """The score and temperature with the best AUROC for one OOD set, beside the best score at the calibration T."""

    calibration_tau: float | None
    calibration_score: str | None  # the best score at it, when it was evaluated
    calibration_auroc: float | None
    calibration_fpr95: float | None
    sentence: str


@dataclass(frozen=True)
class GateFailure(_Row):
    """A reported row that fails ``--min-auroc`` or ``--max-fpr95``, and why."""

    reasons: tuple[str, ...]

    def line(self) -> str:
        return f"{self.ood_file}, {score_label(self.score)}, tau = {self.tau:.6g}: {'; '.join(self.reasons)}"


@dataclass
class OodReport:
    """What ``tempcal ood`` reports: detection figures per OOD file, score and tau, and the best of them."""

    source: str
    ood_files: list[str]
    num_classes: int
    binary: bool
    n_id: int
    n_ood: list[int]
    stored_temperature: float | None
    taus: list[float]
    taus_from: str  # "default sweep" or "--tau"
    scores: list[str]
    results: list[tuple[str, OodMetrics]]  # (ood_file, metrics), by file, then score, then tau
    best: list[OodBest]  # per OOD file and score
    best_overall: list[OodBestOverall]  # per OOD file
    device: str
    passes: int
    score_options: dict[str, Any] = field(default_factory=dict)  # gen_gamma, gen_top
    react: Any = None  # sources.head.ReactClip when --react was given
    bootstrap: int = 0
    seed: int = 0
    min_auroc: float | None = None
    max_fpr95: float | None = None
    gate_failures: list[GateFailure] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    id_scores: dict[str, list[np.ndarray]] = field(default_factory=dict, repr=False)
    ood_scores: list[dict[str, list[np.ndarray]]] = field(default_factory=list, repr=False)
    group_key: str | None = None  # --group-by KEY
    groups: list[dict] | None = None  # per in-distribution group, its figures against every OOD file
    opened: Any = field(default=None, repr=False)  # the OpenedSource (an --lm run describes its model and texts)
    others: list[Any] = field(default_factory=list, repr=False)  # the --ood files' OpenedSources (their counts)

    def rows(self, ood_file: str, score: str) -> list[OodMetrics]:
        return [m for f, m in self.results if f == ood_file and m.score == score]

    @property
    def summary(self) -> str:
        """The best score and tau per OOD set, each beside the calibration T, in one sentence each."""
        return " ".join(b.sentence for b in self.best_overall)

    @property
    def gate_passed(self) -> bool | None:
        """None without a gate; else whether every reported row passes it."""
        if self.min_auroc is None and self.max_fpr95 is None:
            return None
        return not self.gate_failures

    def to_json(self) -> dict:
        """The contract's ``results`` (each row also names its ``ood_file``), the best of them, ReAct and the gate."""
        results = []
        for ood_file, m in self.results:
            row: dict[str, Any] = {"tau": m.tau, "score": m.score, "auroc": m.auroc, "aupr_in": m.aupr_in,
                                   "aupr_out": m.aupr_out, "fpr95": m.fpr95}
            # Scores beyond float64's range (MaxLogit at tau ~ 1e-300) are +-inf: no finite threshold or mean.
            row.update(ood_file=ood_file, fpr95_threshold=_finite(m.fpr95_threshold), mean_id=_finite(m.mean_id),
                       mean_ood=_finite(m.mean_ood), n_id=m.n_id, n_ood=m.n_ood)
            if m.auroc_ci is not None and m.fpr95_ci is not None:
                row.update(auroc_ci=list(m.auroc_ci), fpr95_ci=list(m.fpr95_ci))
            results.append(row)
        return {
            "results": results, "best_overall": [asdict(b) for b in self.best_overall],
            "best": [asdict(b) for b in self.best], "summary": self.summary,
            "source": self.source, "ood_files": self.ood_files, "num_classes": self.num_classes,
            "binary": self.binary, "n_id": self.n_id, "n_ood": self.n_ood,
            "stored_temperature": self.stored_temperature, "taus": self.taus, "taus_from": self.taus_from,
            "scores": self.scores, **self.score_options, "id_recall": ID_RECALL,
            **{f"react_{key}": getattr(self.react, key, None) for key in ("percentile", "threshold", "passes")},
            "bootstrap": ({"resamples": self.bootstrap, "seed": self.seed, "level": BOOTSTRAP_LEVEL}
                          if self.bootstrap else None),
            "min_auroc": self.min_auroc, "max_fpr95": self.max_fpr95, "gate_passed": self.gate_passed,
            "gate_failures": [asdict(g) for g in self.gate_failures],
            "device": self.device, "passes": self.passes, "warnings": self.warnings,
            **({} if self.groups is None else {"group_key": self.group_key, "groups": self.groups}),
            **json_fields(self.opened), **ood_json_fields(self.others),
        }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _tried(count: int, what: str) -> str:
    return f"{count} {what}{'s' if count != 1 else ''}"


def _unmatched(source: str, stored: float | None) -> str:
    """How a sentence ends when no row is at the calibration T."""
    if stored is None:
        return f"{source} stores no calibration temperature to compare with."
    return f"the calibration temperature T = {stored:.4g} was not among them."


def _best(rows: Sequence[OodMetrics], stored: float | None) -> tuple[OodMetrics, OodMetrics | None]:
    """The row with the best AUROC (one at the calibration T among equals, else the first), and the best row at it."""
    best = max(rows, key=lambda m: m.auroc)  # max keeps the first of equal values
    at_t = max((m for m in rows if stored is not None and m.tau == stored), key=lambda m: m.auroc, default=None)
    return (at_t if at_t is not None and at_t.auroc == best.auroc else best), at_t


def best_sentence(source: str, ood_file: str, score: str, rows: Sequence[OodMetrics],
                  stored: float | None) -> OodBest:
    """Pick the tau with the best AUROC (the calibration T if it is among the best, else the first of equals) and
    say it next to the calibration T in one sentence."""
    best, at_t = _best(rows, stored)
    tried = f"{_tried(len(rows), 'temperature')} tried"
    figures = f"AUROC {best.auroc:.4f}, FPR95 {best.fpr95:.4f}"
    opening = (f"On {ood_file} vs {source}, the {score_label(score)} score separates in-distribution from OOD "
               "samples")
    if len(rows) > 1 and all((m.auroc, m.fpr95) == (best.auroc, best.fpr95) for m in rows):
        sentence = f"{opening} equally well at all {tried} ({figures}): its ranking does not change with tau."
    elif at_t is not None and at_t.tau == best.tau:
        sentence = f"{opening} best at the calibration temperature T = {stored:.4g} of the {tried} ({figures})."
    elif at_t is not None:
        sentence = (f"{opening} best at tau = {best.tau:.4g} of the {tried} ({figures}), against AUROC "
                    f"{at_t.auroc:.4f}, FPR95 {at_t.fpr95:.4f} at the calibration temperature T = {stored:.4g}.")
    else:
        sentence = f"{opening} best at tau = {best.tau:.4g} of the {tried} ({figures}); {_unmatched(source, stored)}"
    return OodBest(ood_file=ood_file, score=score, tau=best.tau, auroc=best.auroc, fpr95=best.fpr95,
                   calibration_tau=stored, calibration_auroc=None if at_t is None else at_t.auroc,
                   calibration_fpr95=None if at_t is None else at_t.fpr95, sentence=sentence)


def best_overall_sentence(source: str, ood_file: str, rows: Sequence[OodMetrics], stored: float | None,
                          num_scores: int, num_taus: int) -> OodBestOverall:
    """The best score and tau for one OOD set (best AUROC; among equals, one at the calibration T, else the first
    in report order), beside the best score at the calibration T, in one sentence."""
    best, best_at_t = _best(rows, stored)
    where = f"the calibration temperature T = {stored:.4g}" if best_at_t is best else f"tau = {best.tau:.4g}"
    sentence = (f"On {ood_file} vs {source}, the best of {_tried(num_scores, 'score')} x "
                f"{_tried(num_taus, 'temperature')} is {score_label(best.score)} at {where} "
                f"(AUROC {best.auroc:.4f}, FPR95 {best.fpr95:.4f})")
    if best_at_t is best:
        sentence += "."
    elif best_at_t is not None:
        sentence += (f"; at the calibration temperature T = {stored:.4g} the best is {score_label(best_at_t.score)} "
                     f"(AUROC {best_at_t.auroc:.4f}, FPR95 {best_at_t.fpr95:.4f}).")
    else:
        sentence += f"; {_unmatched(source, stored)}"
    return OodBestOverall(
        ood_file=ood_file, score=best.score, tau=best.tau, auroc=best.auroc, fpr95=best.fpr95,
        calibration_tau=stored, calibration_score=None if best_at_t is None else best_at_t.score,
        calibration_auroc=None if best_at_t is None else best_at_t.auroc,
        calibration_fpr95=None if best_at_t is None else best_at_t.fpr95, sentence=sentence)


def gate_failures(results: Sequence[tuple[str, OodMetrics]], min_auroc: float | None,
                  max_fpr95: float | None) -> list[GateFailure]:
    """Every reported row with AUROC below ``min_auroc`` or FPR95 above ``max_fpr95``."""
    failures = []
    for ood_file, m in results:
        reasons = []
        if min_auroc is not None and not m.auroc >= min_auroc:
            reasons.append(f"AUROC {m.auroc:.4f} is below {min_auroc:g}")
        if max_fpr95 is not None and not m.fpr95 <= max_fpr95:
            reasons.append(f"FPR95 {m.fpr95:.4f} is above {max_fpr95:g}")
        if reasons:
            failures.append(GateFailure(ood_file, m.score, m.tau, m.auroc, m.fpr95, tuple(reasons)))
    return failures


def check_gate(value: float | None, name: str) -> float | None:
    """A gate's bound: None, or a number in [0, 1] (AUROC and FPR95 are fractions)."""
    return None if value is None else check_option(param(name), value, UNIT)


def score_samples(scan: Scan, taus: Sequence[float], scores: Sequence[str] = ("msp", "energy"),
                  options: dict[str, Any] | None = None) -> dict[str, list[np.ndarray]]:
    """Per-sample float64 scores ``{score: [array per tau]}`` from one pass, every rank's samples gathered."""
    parts = scan_scores(scan, [1.0 / as_temperature(tau) for tau in taus], scores, options)
    return {name: [all_gather_rows(part[name]).cpu().numpy() for part in parts] for name in scores}


def check_compatible(source: str, id_data: Any, ood_path: str, ood_data: Any) -> None:
    """The same classifier head on both sides: equal class counts and the same binary form."""
    if ood_data.num_classes != id_data.num_classes:
        raise DataError(f"{ood_path}: has {ood_data.num_classes} classes but {source} has {id_data.num_classes}; "
                        "ID and OOD logits must come from the same classifier")
    if ood_data.binary != id_data.binary:
        one, two = (ood_path, source) if ood_data.binary else (source, ood_path)
        raise DataError(f"{one}: holds one binary logit per sample but {two} holds 2 logit columns; "
                        "save both sides the same way")


def ood_file(source: Source, ood_files: Sequence[Source], *, taus: Sequence[str | float] | None = None,
             scores: str | Sequence[str] = ("msp",), device: str = "auto", chunk_rows: int | None = None,
             gen_gamma: float = 0.1, gen_top: int = 100, react: float | None = None, bootstrap: int = 0,
             seed: int = 0, min_auroc: float | None = None, max_fpr95: float | None = None,
             odin_eps: float | None = None, group_by: str | None = None, options: SourceOptions | None = None,
             **keys: Any) -> OodReport:
    """Score SOURCE (ID) and every OOD set at each tau; ``taus`` holds numbers or ``"fitted"`` (default sweep).

    OOD sets are read the way SOURCE is (for a model SOURCE: inputs files run through the same model).
    ``scores``: names from :data:`tempcal.scores.REGISTRY`, ``both``, ``all`` or comma-separated lists;
    ``gen_gamma`` and ``gen_top`` set GEN up. ``react`` (hidden states with a head): clip the hidden
    states at that percentile of SOURCE's values first. ``bootstrap`` resamples (seeded by ``seed``) add
    95% intervals for AUROC and FPR95. ``min_auroc`` / ``max_fpr95``: the rows that fail them are listed
    in ``gate_failures``. ``odin_eps`` (a model SOURCE, MSP) perturbs the inputs first, as ODIN does;
    ``passes`` then counts model runs (each a forward, backward and forward over one file at one tau).
    ``group_by`` (a tensor of SOURCE, or ``task``): each in-distribution group against every OOD file too, at the
    stored T each group (and the OOD rows it is compared with) at the T_g stored for that key.
    """
    if not ood_files:
        raise TempcalError(f"no OOD file: give at least one with {param('ood')} FILE")
    scores = score_names(scores)
    from ..scores.gen import check_gamma, check_top

    score_options = {"gen_gamma": check_gamma(gen_gamma), "gen_top": check_top(gen_top)}
    bootstrap = whole_number(bootstrap, param("bootstrap"), minimum=0)
    seed = whole_number(seed, param("seed"), minimum=0)
    min_auroc, max_fpr95 = check_gate(min_auroc, "min_auroc"), check_gate(max_fpr95, "max_fpr95")
    given_name = str(source) if isinstance(source, (str, os.PathLike)) else None
    check_taus(taus or ())
    ood_names = [o.name if isinstance(o, OpenedSource) else str(o) for o in ood_files]
    for k, name in enumerate(ood_names):
        if name in ood_names[:k]:
            raise TempcalError(f"{param('ood')} {name}: given twice")
    if odin_eps is not None:
        from ..models.odin import check_eps

        check_eps(odin_eps)
        if list(scores) != ["msp"]:
            raise TempcalError(f"{param('odin_eps')} scores by max softmax: drop {param('score')} or give msp")
    options = options or SourceOptions()
    options = options.but(ignore_index=None, **({"react": react} if react is not None else {}), **keys)
    loaded = open_source(source, options, labels_optional=True, group_by=group_by)  # no score uses labels
    # A file is named as given (a glob stays a glob); a model run over its inputs as "MODEL on INPUTS".
    source_name = given_name if given_name and loaded.paths else loaded.name
    stored = loaded.stored_temperature
    check_stored_reading(loaded, uses_stored(taus))
    tau_list = resolve_taus(taus, stored, source_name, defaults=DEFAULT_TAUS, sort=False,
                           place=loaded.temperature_place())
    others = []
    for name, other in zip(ood_names, ood_files, strict=True):
        opened = loaded.open_related(other, labels_optional=True)
        check_compatible(source_name, loaded.data, name, opened.data)
        others.append(opened)
    warnings: list[str] = []
    groups, applied = ood_groups(loaded, group_by, uses_stored(taus), tau_list, stored, warnings)
    scored = [*tau_list, *applied.extra]
    if odin_eps is not None:
        side_scores, passes, device_used = _odin_sides(loaded, others, scored, odin_eps)
    else:
        side_scores, passes, device_used = _scan_sides(loaded, others, scored, scores, score_options, device,
                                                       chunk_rows, warnings, [source_name, *ood_names])
    grouped = None if groups is None else group_results(groups, ood_names, scores, tau_list, applied, stored,
                                                        side_scores[0], side_scores[1:])
    id_scores, *all_ood_scores = [{name: values[:len(tau_list)] for name, values in side.items()}
                                  for side in side_scores]
    results, best, best_overall = _assemble(source_name, ood_names, scores, tau_list, stored, id_scores,
                                            all_ood_scores, bootstrap, seed)
    return OodReport(
        source=source_name, ood_files=ood_names, num_classes=loaded.data.num_classes, binary=loaded.data.binary,
        n_id=len(id_scores[scores[0]][0]), n_ood=[len(s[scores[0]][0]) for s in all_ood_scores],
        stored_temperature=stored, taus=tau_list, taus_from="--tau" if taus else "default sweep", scores=scores,
        results=results, best=best, best_overall=best_overall, device=device_used, passes=passes,
        score_options=score_options, react=getattr(loaded.data, "react", None), bootstrap=bootstrap, seed=seed,
        min_auroc=min_auroc, max_fpr95=max_fpr95, gate_failures=gate_failures(results, min_auroc, max_fpr95),
        warnings=warnings, id_scores=id_scores, ood_scores=all_ood_scores,
        group_key=None if groups is None else groups.key, groups=grouped, opened=loaded, others=others)


def _assemble(source: str, ood_names: list[str], scores: list[str], taus: list[float], stored: float | None,
              id_scores: dict[str, list[np.ndarray]], all_ood_scores: list[dict[str, list[np.ndarray]]],
              bootstrap: int, seed: int) -> tuple[list[tuple[str, OodMetrics]], list[OodBest], list[OodBestOverall]]:
    """The figures of every OOD file, score and tau (with bootstrap intervals), the best tau per file and score,
    and the best score and tau per file."""
    results: list[tuple[str, OodMetrics]] = []
    best: list[OodBest] = []
    best_overall: list[OodBestOverall] = []
    for i, (name, ood_scores) in enumerate(zip(ood_names, all_ood_scores, strict=True)):
        rows = [detection_metrics(id_scores[score][k], ood_scores[score][k], tau=tau, score=score)
                for score in scores for k, tau in enumerate(taus)]
        if bootstrap:
            intervals = detection_intervals([id_scores[s][k] for s in scores for k in range(len(taus))],
                                            [ood_scores[s][k] for s in scores for k in range(len(taus))],
                                            bootstrap, seed, level=BOOTSTRAP_LEVEL, ood_stream=i + 1)
            rows = [replace(m, auroc_ci=ci["auroc"], fpr95_ci=ci["fpr95"]) for m, ci in zip(rows, intervals,
                                                                                          strict=True)]
        results.extend((name, m) for m in rows)
        for j, score in enumerate(scores):
            best.append(best_sentence(source, name, score, rows[j * len(taus):(j + 1) * len(taus)], stored))
        best_overall.append(best_overall_sentence(source, name, rows, stored, len(scores), len(taus)))
    return results, best, best_overall


def _scan_sides(loaded: OpenedSource, others: list[OpenedSource], taus: list[float], scores: list[str],
                score_options: dict[str, Any], device: str, chunk_rows: int | None, warnings: list[str],
                names: list[str]):
    """Every side's scores from its logits: one validating scan and one scores pass per file."""
    # Scores use no labels, so neither side's labels are checked.
    scans = [scan_source(side, device=device, chunk_rows=chunk_rows, probs=loaded.options.probs, warnings=warnings,
                         labelled=False) for side in (loaded, *others)]
    for name, scan in zip(names, scans, strict=True):
        if scan.num_samples < 1:
            raise DataError(f"{name}: holds no samples")
    side_scores = [score_samples(scan, taus, scores, score_options) for scan in scans]
    return side_scores, sum(scan.passes for scan in scans), str(scans[0].device)


def _odin_sides(loaded: OpenedSource, others: list[OpenedSource], taus: list[float], eps: float):
    """Every side's ODIN scores: the model run over each inputs file at each tau."""
    from ..models.odin import odin_scores

    model = getattr(loaded, "model", None)
    if model is None:
        raise TempcalError(f"{param('odin_eps')} needs a model SOURCE with {param('inputs')} and "
                           f"{param('ood_inputs')}")
    options = loaded.options
    side_scores = []
    for side in (loaded, *others):
        inputs = side.inputs_path  # type: ignore[attr-defined]
        side_scores.append({"msp": [odin_scores(model, inputs, tau=tau, eps=eps, batch_size=options.batch_size,
                                                inputs_key=options.inputs_key, output_key=options.output_key,
                                                progress=options.progress).numpy() for tau in taus]})
    return side_scores, len(taus) * (1 + len(others)), str(model.device)


__all__ = ["OodBestOverall", "OodReport", "best_overall_sentence", "best_sentence", "gate_failures", "ood_file",
           "score_samples"]
