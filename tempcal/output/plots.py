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


def ood_plot(report, path: str | os.PathLike) -> Path:
    """ID vs OOD score histograms at each tau (a grid per OOD file and score) and AUROC / FPR95 against tau."""
    import numpy as np

    from ..workflows.ood import score_label

    path = check_plot_path(path)
    _pyplot()
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
        label = f"{Path(report.ood_files[i]).name} ({score_label(name)})"
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
            ax.set_title(f"{score_label(name)} tau={taus[k]:.4g}  AUROC {rows[k].auroc:.3f}", fontsize=8)
            ax.tick_params(labelsize=6)
            if position == 0:
                ax.legend(fontsize=6, title=Path(report.ood_files[i]).name, title_fontsize=6)
    figure.suptitle(f"{report.source}: in-distribution vs OOD scores", fontsize=10)
    _save(figure, path, dpi=100)
    return path


def log_spaced(start: float, stop: float, count: int) -> list[float]:
    """``count`` temperatures from ``start`` to ``stop``, evenly spaced in log T."""
    if count == 1:
        return [start]
    step = (math.log(stop) - math.log(start)) / (count - 1)
    return [math.exp(math.log(start) + k * step) for k in range(count)]
