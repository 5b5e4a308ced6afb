"""Pictures for reviewers: reliability diagrams, temperature sweeps, OOD scores (matplotlib, Agg backend).

matplotlib is imported only when a plot is asked for; the format follows the file's suffix.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from ..errors import TempcalError, param

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


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _reliability_axes(ax, hist, metrics, title: str) -> None:
    """Accuracy per non-empty bin as bars, the gap to the diagonal shaded, the confidence histogram beneath."""
    width = 1.0 / len(metrics.bins)
    ax.plot([0, 1], [0, 1], color="0.4", linestyle="--", linewidth=1, label="perfect calibration")
    first_gap = True
    for b in metrics.bins:
        if not b.count:
            continue  # an empty bin is drawn as nothing
        ax.bar(b.lower, b.accuracy, width=width, align="edge", color="tab:blue", alpha=0.8, edgecolor="white",
               linewidth=0.5, label="accuracy" if first_gap else None)
        ax.bar(b.lower, b.confidence - b.accuracy, bottom=b.accuracy, width=width, align="edge",
               facecolor="none", hatch="///", edgecolor="tab:red", linewidth=0.8,
               label="gap to mean confidence" if first_gap else None)
        first_gap = False
    _interval_bars(ax, metrics.bins, width)
    ax.plot([], [], " ", label=f"ECE = {metrics.ece:.4f}, N = {metrics.count}")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize="small")
    counts = [b.count for b in metrics.bins]
    hist.bar([b.lower for b in metrics.bins], counts, width=width, align="edge", color="0.5", edgecolor="white")
    hist.set_xlim(0, 1)
    hist.set_xlabel("confidence")
    hist.set_ylabel("samples")
    if max(counts, default=0) > 0:
        hist.set_yscale("log")


def _interval_bars(ax, bins, width: float) -> None:
    """Each non-empty bin's 95% Wilson interval for its accuracy, as an error bar at the bin's centre."""
    shown = [b for b in bins if b.count and b.accuracy_low is not None]
    if not shown:
        return
    ax.errorbar([b.lower + width / 2 for b in shown], [b.accuracy for b in shown],
                yerr=[[max(0.0, b.accuracy - b.accuracy_low) for b in shown],
                      [max(0.0, b.accuracy_high - b.accuracy) for b in shown]],
                fmt="none", ecolor="black", elinewidth=1, capsize=min(3.0, 40 * width), capthick=1,
                label="95% interval (Wilson)")


def reliability_diagram(panels: list[tuple[str, object]], path: str | os.PathLike) -> Path:
    """One reliability diagram per ``(title, CalibrationMetrics)`` side by side, written to ``path``."""
    path = check_plot_path(path)
    plt = _pyplot()
    fig, axes = plt.subplots(2, len(panels), figsize=(4.5 * len(panels), 5.5), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1]}, sharex="col")
    for k, (title, metrics) in enumerate(panels):
        _reliability_axes(axes[0][k], axes[1][k], metrics, title)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


def sweep_plot(results: list, marks: dict[str, float], path: str | os.PathLike) -> Path:
    """NLL, ECE and entropy against tau on a log axis, with vertical lines at the ``marks`` (label -> tau)."""
    path = check_plot_path(path)
    plt = _pyplot()
    taus = [m.tau for m in results]
    fig, axes = plt.subplots(3, 1, figsize=(6, 7), sharex=True)
    for ax, key, label in zip(axes, ("nll", "ece", "entropy"), ("NLL", "ECE", "entropy (nats)"), strict=True):
        ax.plot(taus, [getattr(m, key) for m in results], marker="o", markersize=3)
        ax.set_ylabel(label)
        for (name, tau), colour in zip(marks.items(), ("tab:red", "tab:green", "tab:purple"), strict=False):
            ax.axvline(tau, color=colour, linestyle="--", linewidth=1, label=f"{name} = {tau:.4g}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_xscale("log")
    axes[-1].set_xlabel("temperature tau")
    if marks:
        axes[0].legend(fontsize="small")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


def _save(fig, path: Path, dpi: int = 120) -> None:
    """Save beside the destination, then rename: a failed save leaves no half-written picture."""
    from ..io.atomic import atomic_path

    with atomic_path(path, what=param("plot")) as temporary:
        fig.savefig(temporary, format=path.suffix.lstrip(".").lower(), dpi=dpi)


#: One colour per score, the same in every panel (matplotlib's tab10 order).
SCORE_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
                 "tab:gray", "tab:olive", "tab:cyan")


def ood_plot(report, path: str | os.PathLike) -> Path:
    """AUROC and FPR95 against tau (a line per score, a column per OOD file), then ID-vs-OOD score histograms only
    where a reviewer looks: each score's best tau and the calibration T, per OOD file (a row per score)."""
    path = check_plot_path(path)
    _pyplot()
    from matplotlib.figure import Figure

    files = len(report.ood_files)
    calibration = report.stored_temperature if report.stored_temperature in report.taus else None
    per_file = 2 if calibration is not None else 1
    columns = files * per_file
    width = max(3.4 * columns, 8.0)
    figure = Figure(figsize=(width, 2.8 * 2 + 2.1 * len(report.scores)), layout="constrained")
    spec = figure.add_gridspec(2 + len(report.scores), columns, height_ratios=[1.35, 1.35] + [1] * len(report.scores))
    for i, ood_file in enumerate(report.ood_files):
        span = slice(i * per_file, (i + 1) * per_file)
        _ood_curves(report, ood_file, figure.add_subplot(spec[0, span]), figure.add_subplot(spec[1, span]),
                    legend=i == 0)
        for row, score in enumerate(report.scores):
            _ood_histograms(report, i, score, calibration, [figure.add_subplot(spec[2 + row, i * per_file + c])
                                                            for c in range(per_file)], first=i == 0 and row == 0)
    _save(figure, path, dpi=100)
    return path


def _ood_curves(report, ood_file: str, auroc_ax, fpr_ax, *, legend: bool) -> None:
    """AUROC and FPR95 against tau for every score (``*``: each score's best tau, outlined: the best of the file)."""
    from ..scores import score_label

    overall = next(b for b in report.best_overall if b.ood_file == ood_file)
    for k, score in enumerate(report.scores):
        rows = sorted(report.rows(ood_file, score), key=lambda m: m.tau)
        best = next(b for b in report.best if b.ood_file == ood_file and b.score == score)
        colour = SCORE_COLOURS[k % len(SCORE_COLOURS)]
        for ax, key in ((auroc_ax, "auroc"), (fpr_ax, "fpr95")):
            ax.plot([m.tau for m in rows], [getattr(m, key) for m in rows], marker="o", markersize=3, linewidth=1.2,
                    color=colour, label=score_label(score))
            outline = "black" if score == overall.score else colour
            ax.plot([best.tau], [getattr(best, key)], marker="*", markersize=11 if outline == "black" else 9,
                    color=colour, markeredgecolor=outline, linestyle="none")
    name = Path(ood_file).name
    bounds = (("AUROC (ID positive)", report.min_auroc, "min AUROC"),
              ("FPR95 (OOD accepted at 95% ID recall)", report.max_fpr95, "max FPR95"))
    for ax, (title, gate, gate_label) in zip((auroc_ax, fpr_ax), bounds, strict=True):
        ax.set_xscale("log")
        ax.set_title(f"{name}: {title}", fontsize=9)
        ax.grid(True, which="both", alpha=0.25)
        ax.tick_params(labelsize=7)
        if report.stored_temperature is not None:
            ax.axvline(report.stored_temperature, color="0.35", linestyle="--", linewidth=1,
                       label=f"calibration T = {report.stored_temperature:.4g}")
        if gate is not None:
            ax.axhline(gate, color="tab:red", linestyle=":", linewidth=1, label=f"gate: {gate_label} {gate:g}")
    fpr_ax.set_xlabel("temperature tau", fontsize=8)
    if legend:  # once, above the panels (as the figure's title), so that no curve hides behind it
        handles, labels = auroc_ax.get_legend_handles_labels()
        count = len(report.scores)
        title = (f"{report.source}\nin-distribution vs OOD: {count} score{'s' if count > 1 else ''} at "
                 f"{len(report.taus)} temperatures; * = each score's best tau, outlined * = the best score and tau "
                 "of the OOD file")
        figure = auroc_ax.figure
        columns = max(1, min(len(labels), int(figure.get_figwidth() // 1.75)))  # as many as fit across the figure
        figure.legend(handles, labels, loc="outside upper center", ncols=columns, fontsize=8, title=title,
                      title_fontsize=8, frameon=False)


def _ood_histograms(report, index: int, score: str, calibration: float | None, axes: list, *, first: bool) -> None:
    """ID vs OOD histograms of one score on one OOD file at its best tau and (second panel) at the calibration T."""
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    from ..scores import score_label

    ood_file = report.ood_files[index]
    best = next(b for b in report.best if b.ood_file == ood_file and b.score == score)
    panels = [(best.tau, "best tau")]
    if calibration is not None:
        panels.append((calibration, "calibration T"))
    if len(panels) == 2 and best.tau == calibration:  # one picture says it: the best tau is the calibration T
        axes[1].axis("off")
        axes[1].text(0.5, 0.5, f"{score_label(score)}: the best tau is\nthe calibration T", ha="center", va="center",
                     fontsize=8, color="0.35", transform=axes[1].transAxes)
        panels = panels[:1]
    for ax, (tau, what) in zip(axes, panels, strict=False):
        k = report.taus.index(tau)
        m = report.rows(ood_file, score)[k]
        id_values, ood_values = report.id_scores[score][k], report.ood_scores[index][score][k]
        both = np.concatenate([id_values, ood_values])
        both = both[np.isfinite(both)]
        low, high = np.percentile(both, [0.1, 99.9]) if both.size else (0.0, 0.0)  # a few outliers flatten nothing
        edges = np.linspace(low, high, 41) if high > low else np.array([low - 0.5, low + 0.5])
        for values, label, colour in ((id_values, "ID", "tab:blue"), (ood_values, "OOD", "tab:orange")):
            ax.hist(np.clip(values, edges[0], edges[-1]), bins=edges.tolist(), density=True, alpha=0.55,
                    color=colour, label=label)
        same = " = calibration T" if what == "best tau" and tau == calibration else ""
        ax.set_title(f"{score_label(score)}, {what}{same}: tau = {tau:.4g}\nAUROC {m.auroc:.4f}, FPR95 {m.fpr95:.4f}",
                     fontsize=8)
        ax.tick_params(labelsize=6)
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.set_yticks([])
        if ax is axes[0]:
            ax.set_ylabel(Path(ood_file).name, fontsize=7)
        if first and ax is axes[0]:
            ax.legend(fontsize=7)


def log_spaced(start: float, stop: float, count: int) -> list[float]:
    """``count`` temperatures from ``start`` to ``stop``, evenly spaced in log T."""
    if count == 1:
        return [start]
    step = (math.log(stop) - math.log(start)) / (count - 1)
    return [math.exp(math.log(start) + k * step) for k in range(count)]
