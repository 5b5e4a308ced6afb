"""Pictures for reviewers: reliability diagrams, temperature sweeps, risk-coverage curves, OOD scores (matplotlib,
Agg backend).

matplotlib is imported only when a plot is asked for; the format follows the file's suffix.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import TempcalError, param
from .axes import figure_legend, plain_log_ticks

FORMATS = (".png", ".svg", ".pdf")


def check_plot_path(path: str | os.PathLike) -> Path:
    """The plot's path, after checking its suffix and that matplotlib is installed."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise TempcalError(f"{param('plot')} {path}: unknown format '{path.suffix}'; use .png, .svg or .pdf")
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise TempcalError(f"{param('plot')} needs matplotlib, which is not installed: pip install 'tempcal[plot]'")
    return path


def pyplot():
    """pyplot on the Agg backend, set up once for every figure: titles hold user text (paths, task names), so
    ``$...$`` is drawn as written, not parsed as mathtext; tight layout's "not applied" warning is not shown."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    warnings.filterwarnings("ignore", message="Tight layout not applied", category=UserWarning)
    import matplotlib.pyplot as plt

    return plt


def new_figure(**options):
    """A matplotlib Figure on the Agg backend, laid out by constrained layout (legends outside the axes)."""
    pyplot()
    from matplotlib.figure import Figure

    return Figure(layout="constrained", **options)


def reliability_axes(ax, hist, bins: Sequence[Mapping[str, Any]], title: str, ece: float, *,
                     top: int | None = None) -> None:
    """Accuracy per non-empty bin as bars, the gap to the diagonal shaded, each bin's 95% Wilson interval, the
    confidence histogram beneath (up to ``top`` rows when panels share a scale); ECE and N in the title. ``bins``
    are the JSON's (``lower``, ``count``, ``confidence``, ``accuracy``, ``accuracy_low``/``high``), so the plots
    and the HTML page draw the same diagram. The legend, the same for every panel, is the figure's."""
    width = 1.0 / max(len(bins), 1)
    ax.plot([0, 1], [0, 1], color="0.4", linestyle="--", linewidth=1, label="perfect calibration")
    full = [b for b in bins if b["count"]]  # an empty bin is drawn as nothing
    ax.bar([b["lower"] for b in full], [b["accuracy"] for b in full], width=width, align="edge", color="tab:blue",
           alpha=0.8, edgecolor="white", linewidth=0.5, label="accuracy")
    ax.bar([b["lower"] for b in full], [b["confidence"] - b["accuracy"] for b in full],
           bottom=[b["accuracy"] for b in full], width=width, align="edge", facecolor="none", hatch="///",
           edgecolor="tab:red", linewidth=0.8, label="gap to mean confidence")
    shown = [b for b in full if b.get("accuracy_low") is not None]
    if shown:
        ax.errorbar([b["lower"] + width / 2 for b in shown], [b["accuracy"] for b in shown],
                    yerr=[[max(0.0, b["accuracy"] - b["accuracy_low"]) for b in shown],
                          [max(0.0, b["accuracy_high"] - b["accuracy"]) for b in shown]],
                    fmt="none", ecolor="black", elinewidth=1, capsize=min(3.0, 40 * width), capthick=1,
                    label="95% interval (Wilson)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(f"{title}\nECE = {ece:.4f}, N = {sum(b['count'] for b in bins)}")
    counts = [b["count"] for b in bins]
    hist.bar([b["lower"] for b in bins], counts, width=width, align="edge", color="0.5", edgecolor="white")
    hist.set_xlim(0, 1)
    hist.set_xlabel("confidence")
    hist.set_ylabel("samples")
    if max(counts, default=0) > 0:
        hist.set_yscale("log")
        plain_log_ticks(hist.yaxis)
        if top is not None:
            hist.set_ylim(0.8, top * 1.5)


def curve_json(metrics) -> dict[str, Any]:
    """What :func:`risk_coverage_axes` draws of a metrics object, as the JSON has it."""
    return {"risk_coverage": getattr(metrics, "risk_coverage", None), "tau": metrics.tau,
            "aurc": getattr(metrics, "aurc", None)}


def json_bins(metrics) -> list[dict]:
    """A metrics object's bins as the JSON lists them."""
    return [dict(vars(b)) for b in metrics.bins]


#: Reliability panels per row: a grid that grows by rows, so that every temperature asked for is drawn.
PANELS_PER_ROW = 3


def reliability_size(panels: Sequence[tuple[str, Any]], risk_coverage: bool = False) -> tuple[float, float]:
    """The size in inches of :func:`reliability_figure`'s figure."""
    columns = min(len(panels), PANELS_PER_ROW)
    curves = risk_coverage and any(getattr(m, "risk_coverage", None) for _, m in panels)
    return 4.6 * columns, 5.4 * -(-len(panels) // columns) + 0.8 + (3.6 if curves else 0)


def reliability_figure(panels: list[tuple[str, Any]], source: str | None = None, *, risk_coverage: bool = False,
                       figure: Any = None):
    """The figure of :func:`reliability_diagram`: every panel, ``PANELS_PER_ROW`` to a row, the sample counts on
    one shared y scale, ``source`` in the title; with ``risk_coverage``, every panel's risk-coverage curve beneath,
    on one axes. ``figure``: a (sub)figure to draw in, else a new one."""
    columns = min(len(panels), PANELS_PER_ROW)
    rows = -(-len(panels) // columns)
    curves = risk_coverage and any(getattr(m, "risk_coverage", None) for _, m in panels)
    figure = figure if figure is not None else new_figure(figsize=reliability_size(panels, risk_coverage))
    spec = figure.add_gridspec(2 * rows + curves, columns, height_ratios=[3, 1] * rows + [2.6] * curves)
    axes, first_hist = [], None
    for k, (title, metrics) in enumerate(panels):
        row, column = divmod(k, columns)
        ax = figure.add_subplot(spec[2 * row, column])
        hist = figure.add_subplot(spec[2 * row + 1, column], sharex=ax, sharey=first_hist)
        first_hist = first_hist or hist
        reliability_axes(ax, hist, json_bins(metrics), title, metrics.ece)
        axes.append(ax)
    if curves:
        ax = figure.add_subplot(spec[2 * rows, :])
        risk_coverage_axes(ax, [(title, curve_json(m)) for title, m in panels])
        axes.append(ax)
    if source:
        figure.suptitle(source)
    figure_legend(figure, axes, ncols=4 if columns > 1 else 2)  # one panel: the legend in two rows
    return figure


#: Risk-coverage curves drawn in colours of their own, named in the legend; more are shaded by tau instead.
NAMED_CURVES = 10


def risk_coverage_axes(ax, panels: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    """Risk (error rate among the rows kept, most confident first) against coverage, a curve per ``(label,
    metrics)`` (the JSON's ``risk_coverage``, ``tau``, ``aurc``): named in the figure's legend, or, beyond
    :data:`NAMED_CURVES`, shaded by tau with a colour bar."""
    shown = [(label, m) for label, m in panels if (m.get("risk_coverage") or {}).get("coverage")]
    many = len(shown) > NAMED_CURVES
    if many:
        from matplotlib import cm, colors

        norm = colors.LogNorm(min(m["tau"] for _, m in shown), max(m["tau"] for _, m in shown))
        shade = cm.ScalarMappable(norm=norm, cmap="viridis")
    for k, (label, m) in enumerate(shown):
        colour = shade.to_rgba(m["tau"]) if many else SCORE_COLOURS[k % len(SCORE_COLOURS)]
        aurc = f": AURC {m['aurc']:.4f}" if m.get("aurc") is not None else ""
        ax.plot(m["risk_coverage"]["coverage"], m["risk_coverage"]["risk"], color=colour, linewidth=1.3,
                label=None if many else label + aurc)
    if many:
        ax.figure.colorbar(shade, ax=ax, label="tau")
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("coverage (fraction of rows answered, most confident first)")
    ax.set_ylabel("risk (error rate)")
    ax.set_title("risk-coverage (lower is better; AURC = the area beneath)")
    ax.grid(True, alpha=0.3)


def reliability_diagram(panels: list[tuple[str, Any]], path: str | os.PathLike, *,
                        source: str | None = None, risk_coverage: bool = False) -> Path:
    """One reliability diagram per ``(title, CalibrationMetrics)``, all of them, written to ``path`` (with
    ``risk_coverage``, their risk-coverage curves beneath)."""
    path = check_plot_path(path)
    fig = reliability_figure(panels, source, risk_coverage=risk_coverage)
    _save(fig, path)
    return path


#: The sweep's panels against tau: ``(attribute, label)``; the decision figures when they were computed.
SWEEP_PANELS = (("nll", "NLL"), ("ece", "ECE"), ("entropy", "entropy (nats)"), ("smece", "smooth ECE"),
                ("aurc", "AURC"))


def _sweep_panels(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    panels = [(key, label) for key, label in SWEEP_PANELS if any(_finite(m.get(key)) for m in rows)]
    return panels + ([("conformal", "mean set size")] if any(m.get("conformal") for m in rows) else [])


def sweep_size(results: Sequence[Mapping[str, Any]], curves: bool = True) -> tuple[float, float]:
    """The size in inches of :func:`sweep_figure`'s figure."""
    curves = curves and any((m.get("risk_coverage") or {}).get("coverage") for m in results)
    return 6.5, 2.5 * len(_sweep_panels(results)) + (3.6 if curves else 0)


def sweep_figure(results: Sequence[Mapping[str, Any]], marks: dict[str, float], source: str | None = None, *,
                 curves: bool = True, figure: Any = None, labels: Sequence[str] | None = None):
    """NLL, ECE, entropy, smooth ECE and AURC against tau on a log axis, with vertical lines at the ``marks``
    (label -> tau), from the JSON's result rows (each at one temperature: a point of the sweep):
    every row drawn, in order of tau, then (with ``curves``) every row's risk-coverage curve, named by ``labels``
    (default ``tau = ...``). The HTML page draws the same figure, its curves apart. ``figure``: a (sub)figure to
    draw in, else a new one."""
    order = sorted(range(len(results)), key=lambda k: results[k]["tau"])
    rows = [results[k] for k in order]
    taus = [m["tau"] for m in rows]
    panels = _sweep_panels(rows)
    curves = curves and any((m.get("risk_coverage") or {}).get("coverage") for m in rows)
    fig = figure if figure is not None else new_figure(figsize=sweep_size(rows, curves))
    spec = fig.add_gridspec(len(panels) + curves, 1, height_ratios=[1] * len(panels) + [1.5] * curves)
    axes = [fig.add_subplot(spec[0])]
    axes += [fig.add_subplot(spec[k], sharex=axes[0]) for k in range(1, len(panels))]
    for ax, (key, label) in zip(axes, panels, strict=True):
        if key == "conformal":
            _set_sizes(ax, taus, rows)
        else:
            ax.plot(taus, [m.get(key) if _finite(m.get(key)) else math.nan for m in rows], marker="o", markersize=3,
                    label="the temperatures shown")
        ax.set_ylabel(label)
        # one T marked twice (the stored T is the minimum) shows both lines
        styles = (("tab:red", "--", 1.2), ("tab:green", ":", 2.0), ("tab:purple", "-.", 1.2))
        for (name, tau), (colour, line, width) in zip(marks.items(), styles, strict=False):
            ax.axvline(tau, color=colour, linestyle=line, linewidth=width, label=f"{name} = {tau:.4g}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_xscale("log")
    plain_log_ticks(axes[0].xaxis)
    for ax in axes[:-1]:
        ax.tick_params(which="both", labelbottom=False)
    axes[-1].set_xlabel("temperature tau")
    legend = [axes[0], *(ax for ax, (key, _) in zip(axes, panels, strict=True) if key == "conformal")]
    if curves:
        rc = fig.add_subplot(spec[len(panels)])
        names = [f"tau = {m['tau']:.4g}" for m in rows] if labels is None else [labels[k] for k in order]
        risk_coverage_axes(rc, list(zip(names, rows, strict=True)))
        legend.append(rc)
    if source:
        fig.suptitle(source)
    figure_legend(fig, legend, fontsize="small", ncols=3)
    return fig


#: The set-size lines' colours, one per alpha (LAC solid, APS dashed): apart from the curves' default cycle.
SET_COLOURS = ("black", "tab:gray", "tab:brown", "tab:olive")


def _set_sizes(ax, taus: Sequence[float], rows: Sequence[Mapping[str, Any]]) -> None:
    """The conformal sets' mean size against tau, a line per alpha and score (named in the figure's legend)."""
    first = next(m["conformal"] for m in rows if m.get("conformal"))
    for k, entry in enumerate(first):
        sizes = [m["conformal"][k]["mean_size"] if m.get("conformal") else math.nan for m in rows]
        ax.plot(taus, sizes, marker="o" if entry["score"] == "lac" else "s", markersize=3,
                linestyle="-" if entry["score"] == "lac" else "--", color=SET_COLOURS[(k // 2) % len(SET_COLOURS)],
                label=f"set size: {entry['score'].upper()}, alpha {entry['alpha']:g}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _save(fig, path: Path, dpi: int = 120) -> None:
    """Save beside the destination, then rename: a failed save leaves no half-written picture."""
    from ..io.atomic import atomic_path

    with atomic_path(path, what=param("plot")) as temporary:
        fig.savefig(temporary, format=path.suffix.lstrip(".").lower(), dpi=dpi)


#: One colour per score, the same in every panel (matplotlib's tab10 order).
SCORE_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
                 "tab:gray", "tab:olive", "tab:cyan")
#: Tick labels and titles of the OOD figure, in points: readable at the figure's size.
TICK_SIZE, TITLE_SIZE = 9, 10


def ood_plot(report, path: str | os.PathLike) -> Path:
    """The OOD figure (:func:`ood_figure`), written to ``path``."""
    path = check_plot_path(path)
    figure = ood_figure(report)
    _save(figure, path, dpi=100)
    return path


def ood_figure(report):
    """At one tau, what matters there: each OOD file's ROC curves (a curve per score) above ID-vs-OOD score
    histograms. At several, AUROC and FPR95 against tau (a line per score, a column per OOD file), then the score
    histograms where a reviewer looks: each score's best tau and the calibration T."""
    return _ood_one_tau(report) if len(report.taus) == 1 else _ood_sweep(report)


def _ood_title(report, what: str) -> str:
    count = len(report.scores)
    return f"{report.source}\nin-distribution vs OOD: {count} score{'s' if count > 1 else ''} {what}"


def _ood_legend(figure, axes: list, title: str) -> None:
    """Once, above the panels, with the figure's title, so that no curve hides behind it."""
    columns = max(1, int(figure.get_figwidth() // 1.9))  # as many as fit across the figure
    figure_legend(figure, axes, loc="outside upper center", ncols=columns, fontsize=TICK_SIZE, title=title,
                   title_fontsize=TITLE_SIZE)


def _ood_one_tau(report):
    """Per OOD file (a block of columns): the ROC curve of every score, then ID-vs-OOD histograms of each score
    (two to a row for a single file, one for several)."""
    files, scores = len(report.ood_files), len(report.scores)
    across = min(2, scores) if files == 1 else 1
    down = -(-scores // across)
    figure = new_figure(figsize=(max(4.6 * files * across, 6.5), 4.8 + 2.6 * down))
    spec = figure.add_gridspec(1 + down, files * across, height_ratios=[1.7] + [1] * down)
    tau = report.taus[0]
    axes = []
    for i, ood_file in enumerate(report.ood_files):
        roc = figure.add_subplot(spec[0, i * across:(i + 1) * across])
        _roc_axes(report, i, roc)
        axes.append(roc)
        for k, score in enumerate(report.scores):
            m = report.rows(ood_file, score)[0]
            ax = figure.add_subplot(spec[1 + k // across, i * across + k % across])
            _score_histogram(ax, report.id_scores[score][0], report.ood_scores[i][score][0],
                             f"{Path(ood_file).name}: {_label(score)}\nAUROC {m.auroc:.4f}, FPR95 {m.fpr95:.4f}")
            axes.append(ax)
    calibration = " (the calibration T)" if tau == report.stored_temperature else ""
    _ood_legend(figure, axes, _ood_title(report, f"at tau = {tau:.4g}{calibration}"))
    return figure


def _label(score: str) -> str:
    from ..scores import score_label

    return score_label(score)


def roc_points(id_scores, ood_scores, limit: int = 4000):
    """``(fpr, tpr)`` of the ROC curve (ID positive, higher = more ID; tied scores one threshold), from (0, 0)
    to (1, 1), thinned to about ``limit`` points."""
    import numpy as np

    id_scores, ood_scores = np.asarray(id_scores, np.float64), np.asarray(ood_scores, np.float64)
    values = np.concatenate([id_scores, ood_scores])
    order = np.argsort(-values, kind="stable")
    ordered = values[order]
    ends = np.flatnonzero(np.r_[ordered[1:] != ordered[:-1], True])  # the last sample of each threshold
    kept = np.cumsum(order < id_scores.size)[ends]
    tpr = np.r_[0.0, kept / id_scores.size]
    fpr = np.r_[0.0, (ends + 1 - kept) / ood_scores.size]
    if tpr.size > limit:
        pick = np.unique(np.linspace(0, tpr.size - 1, limit).round().astype(int))
        tpr, fpr = tpr[pick], fpr[pick]
    return fpr, tpr


def _roc_axes(report, index: int, ax) -> None:
    """Every score's ROC curve on one OOD file, each with its FPR95 point, the chance diagonal beneath."""
    import numpy as np

    from ..metrics.detection import ID_RECALL

    ood_file = report.ood_files[index]
    ax.plot([0, 1], [0, 1], color="0.6", linestyle=":", linewidth=1, label="chance")
    ax.axhline(ID_RECALL, color="0.35", linestyle="--", linewidth=0.8, label=f"{ID_RECALL:.0%} ID recall (FPR95)")
    for k, score in enumerate(report.scores):
        m = report.rows(ood_file, score)[0]
        id_values, ood_values = report.id_scores[score][0], report.ood_scores[index][score][0]
        colour = SCORE_COLOURS[k % len(SCORE_COLOURS)]
        fpr, tpr = roc_points(id_values, ood_values)
        ax.plot(fpr, tpr, color=colour, linewidth=1.5, label=_label(score))
        kept = float(np.mean(np.asarray(id_values) >= m.fpr95_threshold))
        ax.plot([m.fpr95], [kept], marker="o", markersize=6, color=colour, markeredgecolor="black", linestyle="none")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("OOD accepted (false positive rate)")
    ax.set_ylabel("ID accepted (true positive rate)")
    ax.set_title(f"{Path(ood_file).name}\nROC, ID positive; o = FPR95", fontsize=TITLE_SIZE)
    ax.grid(True, alpha=0.25)
    ax.tick_params(labelsize=TICK_SIZE)


def _score_histogram(ax, id_values, ood_values, title: str) -> None:
    """ID (filled grey) vs OOD (black outline) densities of one score; a few outliers flatten nothing."""
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    both = np.concatenate([id_values, ood_values])
    both = both[np.isfinite(both)]
    low, high = np.percentile(both, [0.1, 99.9]) if both.size else (0.0, 0.0)
    edges = np.linspace(low, high, 41) if high > low else np.array([low - 0.5, low + 0.5])
    ax.hist(np.clip(id_values, edges[0], edges[-1]), bins=edges.tolist(), density=True, color="0.6",
            label="ID scores")
    ax.hist(np.clip(ood_values, edges[0], edges[-1]), bins=edges.tolist(), density=True, histtype="step",
            color="black", linewidth=1.3, label="OOD scores")
    ax.set_title(title, fontsize=TITLE_SIZE)
    ax.tick_params(labelsize=TICK_SIZE)
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.set_yticks([])


def _ood_sweep(report):
    """AUROC and FPR95 against tau per OOD file, then each score's histograms at its best tau and at the
    calibration T."""
    from . import ood_checks

    files = len(report.ood_files)
    calibration = report.stored_temperature if report.stored_temperature in report.taus else None
    per_file = 2 if calibration is not None else 1
    columns = files * per_file
    figure = new_figure(figsize=(max(3.6 * columns, 8.0), 3.0 * 2 + 2.4 * len(report.scores)))
    spec = figure.add_gridspec(2 + len(report.scores), columns, height_ratios=[1.35, 1.35] + [1] * len(report.scores))
    overall = ood_checks.best_overall(report)
    excluded = ood_checks.left_out(report)
    axes: list = []
    for i, ood_file in enumerate(report.ood_files):
        span = slice(i * per_file, (i + 1) * per_file)
        curves = figure.add_subplot(spec[0, span]), figure.add_subplot(spec[1, span])
        _ood_curves(report, ood_file, *curves, overall=overall[i], excluded=excluded)
        axes += curves
        for row, score in enumerate(report.scores):
            panels = [figure.add_subplot(spec[2 + row, i * per_file + c]) for c in range(per_file)]
            _ood_histograms(report, i, score, calibration, panels)
            axes += panels
    _ood_legend(figure, axes, _ood_title(report, f"at {len(report.taus)} temperatures\n* = each score's best "
                                                 "tau, outlined * = the best score and tau of the OOD file"))
    return figure


def _fraction_limits(ax, values: list[float], span: float = 0.05) -> None:
    """y limits at least ``span`` wide within [0, 1]: a flat curve stays flat, not zoomed to its rounding."""
    low, high = min(values), max(values)
    middle, half = (low + high) / 2, max(span, (high - low) * 1.15) / 2
    low, high = max(0.0, middle - half), min(1.0, middle + half)
    ax.set_ylim(low - 0.01, high + 0.01)


def _ood_curves(report, ood_file: str, auroc_ax, fpr_ax, *, overall, excluded: list[str]) -> None:
    """AUROC and FPR95 against tau for every score (``*``: each score's best tau, outlined: the best of the file;
    none for the scores left out of the best)."""
    plotted: dict[str, list[float]] = {"auroc": [], "fpr95": []}
    for k, score in enumerate(report.scores):
        rows = sorted(report.rows(ood_file, score), key=lambda m: m.tau)
        best = next(b for b in report.best if b.ood_file == ood_file and b.score == score)
        colour = SCORE_COLOURS[k % len(SCORE_COLOURS)]
        for ax, key in ((auroc_ax, "auroc"), (fpr_ax, "fpr95")):
            ax.plot([m.tau for m in rows], [getattr(m, key) for m in rows], marker="o", markersize=3, linewidth=1.2,
                    color=colour, label=_label(score))
            plotted[key] += [getattr(m, key) for m in rows]
            if score in excluded:
                continue
            outline = "black" if overall is not None and score == overall.score else colour
            ax.plot([best.tau], [getattr(best, key)], marker="*", markersize=12 if outline == "black" else 10,
                    color=colour, markeredgecolor=outline, linestyle="none")
    name = Path(ood_file).name
    bounds = (("AUROC (ID positive)", report.min_auroc, "min AUROC", "auroc"),
              ("FPR95 (OOD accepted at 95% ID recall)", report.max_fpr95, "max FPR95", "fpr95"))
    for ax, (title, gate, gate_label, key) in zip((auroc_ax, fpr_ax), bounds, strict=True):
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis)
        ax.set_title(f"{name}\n{title}", fontsize=TITLE_SIZE)
        ax.grid(True, which="both", alpha=0.25)
        ax.tick_params(labelsize=TICK_SIZE)
        if report.stored_temperature is not None:
            ax.axvline(report.stored_temperature, color="0.35", linestyle="--", linewidth=1,
                       label=f"calibration T = {report.stored_temperature:.4g}")
        if gate is not None:
            ax.axhline(gate, color="tab:red", linestyle=":", linewidth=1, label=f"gate: {gate_label} {gate:g}")
        _fraction_limits(ax, plotted[key] + ([gate] if gate is not None else []))
    fpr_ax.set_xlabel("temperature tau", fontsize=TICK_SIZE)


def _ood_histograms(report, index: int, score: str, calibration: float | None, axes: list) -> None:
    """ID vs OOD histograms of one score on one OOD file at its best tau and (second panel) at the calibration T."""
    ood_file = report.ood_files[index]
    best = next(b for b in report.best if b.ood_file == ood_file and b.score == score)
    panels = [(best.tau, "best tau")]
    if calibration is not None:
        panels.append((calibration, "calibration T"))
    if len(panels) == 2 and best.tau == calibration:  # one picture says it: the best tau is the calibration T
        axes[1].axis("off")
        axes[1].text(0.5, 0.5, f"{_label(score)}: the best tau is\nthe calibration T", ha="center", va="center",
                     fontsize=TITLE_SIZE, color="0.35", transform=axes[1].transAxes)
        panels = panels[:1]
    for ax, (tau, what) in zip(axes, panels, strict=False):
        k = report.taus.index(tau)
        m = report.rows(ood_file, score)[k]
        same = " = calibration T" if what == "best tau" and tau == calibration else ""
        _score_histogram(ax, report.id_scores[score][k], report.ood_scores[index][score][k],
                         f"{Path(ood_file).name}\n{_label(score)}, {what}{same}: tau = {tau:.4g}\n"
                         f"AUROC {m.auroc:.4f}, FPR95 {m.fpr95:.4f}")


def log_spaced(start: float, stop: float, count: int) -> list[float]:
    """``count`` temperatures from ``start`` to ``stop``, evenly spaced in log T."""
    if count == 1:
        return [start]
    step = (math.log(stop) - math.log(start)) / (count - 1)
    return [math.exp(math.log(start) + k * step) for k in range(count)]
