"""``tempcal ood`` as a function: score SOURCE (in-distribution) and every OOD set at each tau, then rank.

Every score at every temperature comes from one scores-only pass per file after validation
(:meth:`Scan.scores`); ODIN, which perturbs a model's inputs, runs the model instead. The figures
(:mod:`tempcal.metrics.detection`) and the best-tau sentences are assembled the same way for both.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..core.distributed import all_gather_1d
from ..core.scan import Scan
from ..errors import DataError, TempcalError, param
from ..metrics.detection import ID_RECALL, OodMetrics, detection_metrics
from ..sources.base import OpenedSource, SourceOptions
from ..sources.registry import Source, open_source
from ..validation import as_temperature, check_taus, resolve_taus
from .common import scan_source

#: Temperatures tried when no ``--tau`` is given (log-spaced); the stored T is added to them.
DEFAULT_TAUS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 1000.0)


@dataclass(frozen=True)
class OodBest:
    """The temperature with the best AUROC for one OOD set and score, beside the calibration temperature."""

    ood_file: str
    score: str
    tau: float
    auroc: float
    fpr95: float
    calibration_tau: float | None  # the stored T, when there is one
    calibration_auroc: float | None  # its figures, when it was evaluated
    calibration_fpr95: float | None
    sentence: str


@dataclass
class OodReport:
    """What ``tempcal ood`` reports: detection figures per OOD file, score and tau, and the best tau of each."""

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
    best: list[OodBest]
    device: str
    passes: int
    warnings: list[str] = field(default_factory=list)
    id_scores: dict[str, list[np.ndarray]] = field(default_factory=dict, repr=False)
    ood_scores: list[dict[str, list[np.ndarray]]] = field(default_factory=list, repr=False)

    def rows(self, ood_file: str, score: str) -> list[OodMetrics]:
        return [m for f, m in self.results if f == ood_file and m.score == score]

    @property
    def summary(self) -> str:
        return " ".join(b.sentence for b in self.best)

    def to_json(self) -> dict:
        """The contract's ``results`` (each row also names its ``ood_file``) plus the best tau and the sentence."""
        results = []
        for ood_file, m in self.results:
            row = {"tau": m.tau, "score": m.score, "auroc": m.auroc, "aupr_in": m.aupr_in,
                   "aupr_out": m.aupr_out, "fpr95": m.fpr95}
            row.update(ood_file=ood_file, fpr95_threshold=m.fpr95_threshold, mean_id=m.mean_id,
                       mean_ood=m.mean_ood, n_id=m.n_id, n_ood=m.n_ood)
            results.append(row)
        return {
            "results": results, "best": [asdict(b) for b in self.best], "summary": self.summary,
            "source": self.source, "ood_files": self.ood_files, "num_classes": self.num_classes,
            "binary": self.binary, "n_id": self.n_id, "n_ood": self.n_ood,
            "stored_temperature": self.stored_temperature, "taus": self.taus, "taus_from": self.taus_from,
            "scores": self.scores, "id_recall": ID_RECALL, "device": self.device, "passes": self.passes,
            "warnings": self.warnings,
        }


def score_label(score: str) -> str:
    """How tables and sentences name a score ("MSP", "energy")."""
    from ..scores import get_score

    return get_score(score).label


def best_sentence(source: str, ood_file: str, score: str, rows: Sequence[OodMetrics],
                  stored: float | None) -> OodBest:
    """Pick the tau with the best AUROC (the first of equals) and say it next to the calibration T in one sentence."""
    best = max(rows, key=lambda m: m.auroc)  # max keeps the first of equal values
    at_t = next((m for m in rows if stored is not None and m.tau == stored), None)
    tried = f"{len(rows)} temperature{'s' if len(rows) != 1 else ''} tried"
    figures = f"AUROC {best.auroc:.4f}, FPR95 {best.fpr95:.4f}"
    opening = (f"On {ood_file} vs {source}, the {score_label(score)} score separates in-distribution from OOD "
               "samples best")
    if at_t is not None and at_t.tau == best.tau:
        sentence = f"{opening} at the calibration temperature T = {stored:.4g} of the {tried} ({figures})."
    elif at_t is not None:
        sentence = (f"{opening} at tau = {best.tau:.4g} of the {tried} ({figures}), against AUROC "
                    f"{at_t.auroc:.4f}, FPR95 {at_t.fpr95:.4f} at the calibration temperature T = {stored:.4g}.")
    elif stored is not None:
        sentence = (f"{opening} at tau = {best.tau:.4g} of the {tried} ({figures}); the calibration temperature "
                    f"T = {stored:.4g} was not among them.")
    else:
        sentence = (f"{opening} at tau = {best.tau:.4g} of the {tried} ({figures}); {source} stores no "
                    "calibration temperature to compare with.")
    return OodBest(ood_file=ood_file, score=score, tau=best.tau, auroc=best.auroc, fpr95=best.fpr95,
                   calibration_tau=stored, calibration_auroc=None if at_t is None else at_t.auroc,
                   calibration_fpr95=None if at_t is None else at_t.fpr95, sentence=sentence)


def score_samples(scan: Scan, taus: Sequence[float], scores: Sequence[str] = ("msp", "energy")
                  ) -> dict[str, list[np.ndarray]]:
    """Per-sample float64 scores ``{score: [array per tau]}`` from one pass over ``scan``.

    Rankings need every sample's score: under torch.distributed the ranks' scores are gathered.
    """
    parts = scan.scores([1.0 / as_temperature(tau) for tau in taus], scores)
    return {name: [all_gather_1d(part[name]).cpu().numpy() for part in parts] for name in scores}


def check_compatible(source: str, id_data: Any, ood_path: str, ood_data: Any) -> None:
    """The same classifier head on both sides: equal class counts and the same binary form."""
    if ood_data.num_classes != id_data.num_classes:
        raise DataError(f"{ood_path}: has {ood_data.num_classes} classes but {source} has {id_data.num_classes}; "
                        "ID and OOD logits must come from the same classifier")
    if ood_data.binary != id_data.binary:
        one, two = (ood_path, source) if ood_data.binary else (source, ood_path)
        raise DataError(f"{one}: holds one binary logit per sample but {two} holds 2 logit columns; "
                        "save both sides the same way")


def check_scores(scores: Sequence[str]) -> list[str]:
    """Score names, checked against the registry of :mod:`tempcal.scores`."""
    from ..scores import REGISTRY

    for name in scores:
        if name not in REGISTRY:
            raise TempcalError(f"{param('score')} {name}: expected {', '.join(REGISTRY)} or both")
    return list(scores)


def ood_file(source: Source, ood_files: Sequence[Source], *, taus: Sequence[str | float] | None = None,
             scores: Sequence[str] = ("msp",), device: str = "auto", chunk_rows: int | None = None,
             odin_eps: float | None = None, options: SourceOptions | None = None, **keys: Any) -> OodReport:
    """Score SOURCE (ID) and every OOD set at each tau; ``taus`` holds numbers or ``"fitted"`` (default sweep).

    OOD sets are read the way SOURCE is (for a model SOURCE: inputs files run through the same model).
    ``odin_eps`` (a model SOURCE, MSP) perturbs the inputs first, as ODIN does; ``passes`` then counts
    model runs (each a forward, backward and forward over one file at one tau).
    """
    if not ood_files:
        raise TempcalError(f"no OOD file: give at least one with {param('ood')} FILE")
    scores = check_scores(scores)
    given_name = str(source) if isinstance(source, (str, os.PathLike)) else None
    check_taus(taus or (), given_name or "SOURCE")
    ood_names = [o.name if isinstance(o, OpenedSource) else str(o) for o in ood_files]
    for k, name in enumerate(ood_names):
        if name in ood_names[:k]:
            raise TempcalError(f"{param('ood')} {name}: given twice")
    if odin_eps is not None:
        from ..models.odin import check_eps

        check_eps(odin_eps)
        if list(scores) != ["msp"]:
            raise TempcalError(f"{param('odin_eps')} scores by max softmax: drop {param('score')} energy/both")
    options = (options or SourceOptions()).but(ignore_index=None, **keys)
    loaded = open_source(source, options)
    # A file is named as given (a glob stays a glob); a model run over its inputs as "MODEL on INPUTS".
    source_name = given_name if given_name and loaded.paths else loaded.name
    stored = loaded.stored_temperature
    tau_list = resolve_taus(taus, stored, source_name, defaults=DEFAULT_TAUS, sort=False)
    others = []
    for name, other in zip(ood_names, ood_files, strict=True):
        opened = loaded.open_related(other, labels_optional=True)
        check_compatible(source_name, loaded.data, name, opened.data)
        others.append(opened)
    warnings: list[str] = []
    if odin_eps is not None:
        side_scores, passes, device_used = _odin_sides(loaded, others, tau_list, odin_eps)
    else:
        side_scores, passes, device_used = _scan_sides(loaded, others, tau_list, scores, device, chunk_rows, warnings,
                                                       source_name, ood_names)
    id_scores, all_ood_scores = side_scores[0], side_scores[1:]
    results: list[tuple[str, OodMetrics]] = []
    best: list[OodBest] = []
    for name, ood_scores in zip(ood_names, all_ood_scores, strict=True):
        for score in scores:
            rows = [detection_metrics(id_scores[score][k], ood_scores[score][k], tau=tau, score=score)
                    for k, tau in enumerate(tau_list)]
            results.extend((name, m) for m in rows)
            best.append(best_sentence(source_name, name, score, rows, stored))
    return OodReport(
        source=source_name, ood_files=ood_names, num_classes=loaded.data.num_classes, binary=loaded.data.binary,
        n_id=len(id_scores[scores[0]][0]), n_ood=[len(s[scores[0]][0]) for s in all_ood_scores],
        stored_temperature=stored, taus=tau_list, taus_from="--tau" if taus else "default sweep", scores=scores,
        results=results, best=best, device=device_used, passes=passes, warnings=warnings, id_scores=id_scores,
        ood_scores=all_ood_scores)


def _scan_sides(loaded: OpenedSource, others: list[OpenedSource], taus: list[float], scores: list[str], device: str,
                chunk_rows: int | None, warnings: list[str], source_name: str, ood_names: list[str]):
    """Every side's scores from its logits: one validating scan and one scores pass per file."""
    # Scores use no labels, so neither side's labels are checked.
    scans = [scan_source(side, device=device, chunk_rows=chunk_rows, probs=loaded.options.probs, warnings=warnings,
                         labelled=False) for side in (loaded, *others)]
    for name, scan in zip((source_name, *ood_names), scans, strict=True):
        if scan.num_samples < 1:
            raise DataError(f"{name}: holds no samples")
    side_scores = [score_samples(scan, taus, scores) for scan in scans]
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


__all__ = ["DEFAULT_TAUS", "OodBest", "OodReport", "best_sentence", "check_compatible", "ood_file",
           "score_samples"]
