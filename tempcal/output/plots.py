"""Pictures for reviewers: reliability diagrams and temperature sweeps (matplotlib, Agg backend).

matplotlib is imported only when a plot is asked for; the format follows the file's suffix.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from ..errors import TempcalError

FORMATS = (".png", ".svg", ".pdf")


def check_plot_path(path: str | os.PathLike) -> Path:
    """The plot's path, after checking its suffix and that matplotlib is installed."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise TempcalError(f"--plot {path}: unknown format '{path.suffix}'; use .png, .svg or .pdf")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise TempcalError("--plot needs matplotlib: pip install 'tempcal[plot]'") from None
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


def _save(fig, path: Path) -> None:
    """Save beside the destination, then rename: a failed save leaves no half-written picture."""
    from ..io.atomic import atomic_path

    with atomic_path(path, what="--plot") as temporary:
        fig.savefig(temporary, format=path.suffix.lstrip(".").lower(), dpi=120)


def log_spaced(start: float, stop: float, count: int) -> list[float]:
    """``count`` temperatures from ``start`` to ``stop``, evenly spaced in log T."""
    if count == 1:
        return [start]
    step = (math.log(stop) - math.log(start)) / (count - 1)
    return [math.exp(math.log(start) + k * step) for k in range(count)]
