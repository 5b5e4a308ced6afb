"""Out-of-distribution detection by max-softmax probability (MSP) and energy at several temperatures.

Convention (the CLI contract's): in-distribution (ID) samples are the positives and a
higher score means "more in-distribution".

* ``msp`` at temperature tau: ``max softmax(logits / tau)`` (a single binary logit z:
  ``max(sigmoid(z / tau), 1 - sigmoid(z / tau))``).
* ``energy`` at tau: ``tau * logsumexp(logits / tau)`` (a single binary logit z is the
  two-class row ``[0, z]``: ``tau * log(1 + exp(z / tau))``).
* AUROC and AUPR-In: ID positive, ranked by the score (``sklearn.metrics.roc_auc_score``,
  ``average_precision_score``). AUPR-Out: OOD positive, ranked by minus the score.
* FPR95: with ``k = ceil(0.95 * n_id)``, the threshold ``s`` is the k-th largest ID score,
  i.e. the largest ``s`` with ``mean(id >= s) >= 0.95``; FPR95 ``= mean(ood >= s)``, ties
  counted as accepted.

Every score comes from one :meth:`Scan.calibration` pass per file for all temperatures.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.data import LogitsData, LogitsSource, as_logits_data
from ..core.distributed import all_gather_1d
from ..core.scan import Scan
from ..errors import DataError, TempcalError
from ..io.safetensors_header import LogitsFile, read_header, read_tensor
from ..validation import check_taus, parse_tau

#: Temperatures tried when no ``--tau`` is given (log-spaced); the stored T is added to them.
DEFAULT_TAUS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 1000.0)
SCORES = ("msp", "energy")
SCORE_NAMES = {"msp": "MSP", "energy": "energy"}
#: Fraction of in-distribution samples kept by the FPR95 threshold.
ID_RECALL = 0.95


# -- temperatures ------------------------------------------------------------------------
def default_taus(stored: float | None = None) -> list[float]:
    """The default sweep: :data:`DEFAULT_TAUS` plus the stored T when there is one, sorted, without duplicates."""
    taus = set(DEFAULT_TAUS)
    if stored is not None:
        taus.add(float(stored))
    return sorted(taus)


def resolve_taus(values: Sequence[str | float] | None, stored: float | None,
                 source: str | os.PathLike = "SOURCE") -> list[float]:
    """``--tau`` values in the order given without duplicates, or the default sweep when there are none."""
    if not values:
        return default_taus(stored)
    taus: list[float] = []
    for text in values:
        tau = parse_tau(text, stored, source)
        if tau not in taus:
            taus.append(tau)
    return taus


def tau_label(tau: float) -> str:
    """The shortest text that reads back as ``tau`` ("2", "0.5", "2.3575053928861727")."""
    text = repr(float(tau))
    return text[:-2] if text.endswith(".0") else text


# -- metrics -----------------------------------------------------------------------------
def fpr_at_recall(id_scores, ood_scores, recall: float = ID_RECALL) -> tuple[float, float]:
    """``(fpr, threshold)``: the fraction of OOD scores at or above the largest threshold keeping ``recall`` of ID.

    The threshold is the k-th largest ID score with ``k = ceil(recall * n_id)`` (exact rational
    arithmetic, so 0.95 * 20 is 19), the largest ``s`` with ``mean(id >= s) >= recall``.
    """
    id_scores = np.asarray(id_scores, dtype=np.float64)
    ood_scores = np.asarray(ood_scores, dtype=np.float64)
    if id_scores.size == 0 or ood_scores.size == 0:
        raise DataError("FPR needs at least one in-distribution and one out-of-distribution score")
    if not 0 < recall <= 1:
        raise ValueError(f"recall must be in (0, 1], got {recall}")
    fraction = Fraction(recall).limit_denominator(1_000_000)
    k = -(-fraction.numerator * id_scores.size // fraction.denominator)
    threshold = float(np.partition(id_scores, id_scores.size - k)[id_scores.size - k])
    return float(np.mean(ood_scores >= threshold)), threshold


@dataclass(frozen=True)
class OodMetrics:
    """Detection figures of one score at one temperature against one OOD set (ID positive)."""

    tau: float
    score: str
    auroc: float
    aupr_in: float
    aupr_out: float
    fpr95: float
    fpr95_threshold: float
    mean_id: float
    mean_ood: float
    n_id: int
    n_ood: int


def detection_metrics(id_scores, ood_scores, *, tau: float = 1.0, score: str = "msp") -> OodMetrics:
    """AUROC, AUPR-In, AUPR-Out (scikit-learn) and FPR95 of per-sample scores, higher = more in-distribution."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    id_scores = np.asarray(id_scores, dtype=np.float64)
    ood_scores = np.asarray(ood_scores, dtype=np.float64)
    fpr, threshold = fpr_at_recall(id_scores, ood_scores)
    is_id = np.concatenate([np.ones(id_scores.size, dtype=np.int8), np.zeros(ood_scores.size, dtype=np.int8)])
    values = np.concatenate([id_scores, ood_scores])
    return OodMetrics(
        tau=float(tau), score=score, auroc=float(roc_auc_score(is_id, values)),
        aupr_in=float(average_precision_score(is_id, values)),
        aupr_out=float(average_precision_score(1 - is_id, -values)), fpr95=fpr, fpr95_threshold=threshold,
        mean_id=float(id_scores.mean()), mean_ood=float(ood_scores.mean()), n_id=int(id_scores.size),
        n_ood=int(ood_scores.size))


def score_samples(scan: Scan, taus: Sequence[float], scores: Sequence[str] = SCORES) -> dict[str, list[np.ndarray]]:
    """Per-sample float64 scores ``{score: [array per tau]}`` from one pass over ``scan``."""
    for name in scores:
        if name not in SCORES:
            raise ValueError(f"unknown score {name!r}; expected one of {', '.join(SCORES)}")
    for tau in taus:
        if not (math.isfinite(tau) and tau > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {tau}")
    parts = scan.scores([1.0 / tau for tau in taus])
    column = {"msp": "confidence", "energy": "energy"}
    # Rankings need every sample's score: under torch.distributed the ranks' scores are gathered.
    return {name: [all_gather_1d(part[column[name]]).cpu().numpy() for part in parts] for name in scores}


# -- files -------------------------------------------------------------------------------
def load_unlabelled(path: str | os.PathLike, *, logits_key: str = "logits", probs: bool = False) -> LogitsFile:
    """Load a logits file whose labels (if any) are not used: the OOD side.

    The labels are placeholders: each row's arg-max (class 0 for one binary logit), so a
    ``-inf`` logit, which means "impossible class", is never taken for an infinite NLL.
    """
    header = read_header(path)
    logits = read_tensor(header, logits_key, option="--logits-key")
    rows = logits.shape[0] if logits.dim() >= 1 else 0
    try:
        data = as_logits_data(logits, torch.zeros(rows, dtype=torch.int64), probs=probs, logits_name=logits_key)
    except TempcalError as exc:
        raise TempcalError(f"{path}: {exc}") from None
    if not data.binary and data.num_samples:
        step = data.default_chunk_rows(torch.device("cpu"))
        labels = torch.cat([data.logits[i : i + step].argmax(1) for i in range(0, data.num_samples, step)])
        data = LogitsData(data.logits, labels)
    return LogitsFile(header, data)


def check_compatible(source: str, id_data: LogitsSource, ood_path: str, ood_data: LogitsSource) -> None:
    """The same classifier head on both sides: equal class counts and the same binary form."""
    if ood_data.num_classes != id_data.num_classes:
        raise DataError(f"{ood_path}: has {ood_data.num_classes} classes but {source} has {id_data.num_classes}; "
                        "ID and OOD logits must come from the same classifier")
    if ood_data.binary != id_data.binary:
        one, two = (ood_path, source) if ood_data.binary else (source, ood_path)
        raise DataError(f"{one}: holds one binary logit per sample but {two} holds 2 logit columns; "
                        "save both sides the same way")


# -- the whole job -----------------------------------------------------------------------
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


def best_sentence(source: str, ood_file: str, score: str, rows: Sequence[OodMetrics],
                  stored: float | None) -> OodBest:
    """Pick the tau with the best AUROC (the first of equals) and say it next to the calibration T in one sentence."""
    best = max(rows, key=lambda m: m.auroc)  # max keeps the first of equal values
    at_t = next((m for m in rows if stored is not None and m.tau == stored), None)
    name = SCORE_NAMES[score]
    tried = f"{len(rows)} temperature{'s' if len(rows) != 1 else ''} tried"
    figures = f"AUROC {best.auroc:.4f}, FPR95 {best.fpr95:.4f}"
    opening = f"On {ood_file} vs {source}, the {name} score separates in-distribution from OOD samples best"
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


def ood_file(source: Any, ood_files: Sequence[Any], *,
             taus: Sequence[str | float] | None = None, scores: Sequence[str] = ("msp",), device: str = "auto",
             logits_key: str = "logits", labels_key: str = "labels", probs: bool = False,
             chunk_rows: int | None = None) -> OodReport:
    """Run ``tempcal ood``: score SOURCE (ID) and every OOD file at each tau, in one pass per file after validation.

    ``taus`` holds numbers or ``"fitted"``; without it, :func:`default_taus` of the stored T.
    """
    from .common import open_source, scan_source

    if not ood_files:
        raise TempcalError("no OOD file: give at least one with --ood FILE")
    for name in scores:
        if name not in SCORES:
            raise TempcalError(f"--score {name}: expected msp, energy or both")
    from .common import OpenedSource

    source_arg, ood_args = source, list(ood_files)
    source = source.name if isinstance(source, OpenedSource) else str(source)
    check_taus(taus or (), source)
    ood_paths = [o.name if isinstance(o, OpenedSource) else str(o) for o in ood_args]
    for k, path in enumerate(ood_paths):
        if path in ood_paths[:k]:
            raise TempcalError(f"--ood {path}: given twice")
    warnings: list[str] = []
    keys: dict[str, Any] = {"logits_key": logits_key, "labels_key": labels_key, "probs": probs, "ignore_index": None}
    loaded = open_source(source_arg, **keys)
    stored = loaded.stored_temperature
    tau_list = resolve_taus(taus, stored, source)
    others = []
    for path, arg in zip(ood_paths, ood_args, strict=True):
        other = open_source(arg, labels_optional=True, **keys)
        check_compatible(source, loaded.data, path, other.data)
        others.append(other)
    # Scores use no labels, so neither side's labels are checked.
    options: dict[str, Any] = {"device": device, "chunk_rows": chunk_rows, "probs": probs, "warnings": warnings,
                               "labelled": False}
    id_scan = scan_source(loaded, **options)
    ood_scans = [scan_source(o, **options) for o in others]
    for path, scan in [(source, id_scan), *zip(ood_paths, ood_scans, strict=True)]:
        if scan.num_samples < 1:
            raise DataError(f"{path}: holds no samples")
    id_scores = score_samples(id_scan, tau_list, scores)
    all_ood_scores = [score_samples(scan, tau_list, scores) for scan in ood_scans]
    results: list[tuple[str, OodMetrics]] = []
    best: list[OodBest] = []
    for path, ood_scores in zip(ood_paths, all_ood_scores, strict=True):
        for name in scores:
            rows = [detection_metrics(id_scores[name][k], ood_scores[name][k], tau=tau, score=name)
                    for k, tau in enumerate(tau_list)]
            results.extend((path, m) for m in rows)
            best.append(best_sentence(source, path, name, rows, stored))
    return OodReport(
        source=source, ood_files=ood_paths, num_classes=loaded.data.num_classes, binary=loaded.data.binary,
        n_id=id_scan.num_samples, n_ood=[s.num_samples for s in ood_scans], stored_temperature=stored,
        taus=tau_list, taus_from="--tau" if taus else "default sweep", scores=list(scores), results=results,
        best=best, device=str(id_scan.device), passes=id_scan.passes + sum(s.passes for s in ood_scans),
        warnings=warnings, id_scores=id_scores, ood_scores=all_ood_scores)


# -- outputs -----------------------------------------------------------------------------
def score_key(side: str, score: str, tau: float) -> str:
    """Tensor name in the ``--scores`` file: ``id.msp.tau=2`` or ``ood.0.msp.tau=2`` (0 = the first --ood file)."""
    return f"{side}.{score}.tau={tau_label(tau)}"


def score_tensors(report: OodReport) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every per-sample score as a float64 tensor, one per tau and side, and metadata naming the files."""
    tensors: dict[str, torch.Tensor] = {}
    for name in report.scores:
        for k, tau in enumerate(report.taus):
            tensors[score_key("id", name, tau)] = torch.from_numpy(np.ascontiguousarray(report.id_scores[name][k]))
            for i, scores in enumerate(report.ood_scores):
                tensors[score_key(f"ood.{i}", name, tau)] = torch.from_numpy(np.ascontiguousarray(scores[name][k]))
    metadata = {"tempcal.source": report.source, "tempcal.validation": ",".join(tau_label(t) for t in report.taus),
                "tempcal.scores": ",".join(report.scores), "tempcal.convention": "higher = more in-distribution"}
    metadata.update({f"tempcal.workflows.ood.{i}": path for i, path in enumerate(report.ood_files)})
    if report.stored_temperature is not None:
        metadata["tempcal.calibration_temperature"] = tau_label(report.stored_temperature)
    return tensors, metadata


def save_scores(report: OodReport, path: str | os.PathLike) -> Path:
    """Write the per-sample scores as a safetensors file (temporary file in the same folder, then rename)."""
    from safetensors.torch import save_file

    tensors, metadata = score_tensors(report)
    destination = Path(path)
    with _atomic(destination) as temporary:
        save_file(tensors, str(temporary), metadata=metadata)
    return destination


PLOT_FORMATS = ("png", "svg", "pdf")


def plot_format(path: str | os.PathLike) -> str:
    """The image format from the file suffix; anything but png, svg or pdf is a usage error."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise TempcalError(f"--plot {path}: the name must end in .png, .svg or .pdf")
    return suffix


def plot_report(report: OodReport, path: str | os.PathLike) -> Path:
    """ID vs OOD score histograms at each tau (a grid per OOD file and score) and AUROC / FPR95 against tau."""
    fmt = plot_format(path)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    taus = report.taus
    order = sorted(range(len(taus)), key=lambda k: taus[k])
    columns = min(len(taus), 5)
    grid_rows = -(-len(taus) // columns)
    blocks = [(i, name) for i in range(len(report.ood_files)) for name in report.scores]
    total_rows = 1 + grid_rows * len(blocks)
    figure = Figure(figsize=(3.0 * max(columns, 2), 2.4 * total_rows), layout="constrained")
    spec = figure.add_gridspec(total_rows, max(columns, 2) * 2)
    half = max(columns, 2)
    auroc_ax = figure.add_subplot(spec[0, :half])
    fpr_ax = figure.add_subplot(spec[0, half:])
    for i, name in blocks:
        rows = report.rows(report.ood_files[i], name)
        label = f"{Path(report.ood_files[i]).name} ({SCORE_NAMES[name]})"
        xs = [taus[k] for k in order]
        auroc_ax.plot(xs, [rows[k].auroc for k in order], marker="o", label=label)
        fpr_ax.plot(xs, [rows[k].fpr95 for k in order], marker="o", label=label)
    for ax, title in ((auroc_ax, "AUROC (ID positive)"), (fpr_ax, "FPR95 (OOD accepted at 95% ID recall)")):
        ax.set_xscale("log")
        ax.set_xlabel("tau")
        ax.set_title(title, fontsize=9)
        if report.stored_temperature is not None:
            ax.axvline(report.stored_temperature, color="grey", linestyle="--", linewidth=1, label="calibration T")
        ax.legend(fontsize=7)
    for b, (i, name) in enumerate(blocks):
        rows = report.rows(report.ood_files[i], name)
        for position, k in enumerate(order):
            r, c = divmod(position, columns)
            ax = figure.add_subplot(spec[1 + b * grid_rows + r, 2 * c : 2 * c + 2])
            id_values, ood_values = report.id_scores[name][k], report.ood_scores[i][name][k]
            low = min(id_values.min(), ood_values.min())
            high = max(id_values.max(), ood_values.max())
            edges = np.linspace(low, high, 41) if high > low else np.array([low - 0.5, low + 0.5])
            ax.hist(id_values, bins=edges.tolist(), density=True, alpha=0.55, label="ID")
            ax.hist(ood_values, bins=edges.tolist(), density=True, alpha=0.55, label="OOD")
            ax.set_title(f"{SCORE_NAMES[name]} tau={taus[k]:.4g}  AUROC {rows[k].auroc:.3f}", fontsize=8)
            ax.tick_params(labelsize=6)
            if position == 0:
                ax.legend(fontsize=6, title=Path(report.ood_files[i]).name, title_fontsize=6)
    figure.suptitle(f"{report.source}: in-distribution vs OOD scores", fontsize=10)
    destination = Path(path)
    with _atomic(destination) as temporary:
        figure.savefig(temporary, format=fmt, dpi=100)
    return destination


def _atomic(destination: Path):
    """A temporary path beside ``destination`` that is renamed over it on success and removed on failure."""
    from ..io.atomic import atomic_path

    return atomic_path(destination, what="")


__all__ = ["DEFAULT_TAUS", "ID_RECALL", "SCORES", "OodBest", "OodMetrics", "OodReport", "default_taus",
           "detection_metrics", "fpr_at_recall", "load_unlabelled", "ood_file", "parse_tau", "plot_report",
           "resolve_taus", "save_scores", "score_samples"]
