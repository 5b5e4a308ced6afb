"""The OOD figure of ``ood --plot``: at one tau each OOD file's ROC curves above ID-vs-OOD score histograms; at
several, AUROC and FPR95 against tau, then the histograms at each score's best tau and at the calibration T."""

from __future__ import annotations

import os
from pathlib import Path

from ..scores import score_label
from .plots import SCORE_COLOURS, _save, check_plot_path, figure_legend, new_figure, plain_log_ticks

#: Tick labels and titles of the OOD figure, in points: readable at the figure's size.
TICK_SIZE, TITLE_SIZE = 9, 10


def ood_plot(report, path: str | os.PathLike) -> Path:
    """The OOD figure (:func:`ood_figure`), written to ``path``."""
    path = check_plot_path(path)
    return _save(ood_figure(report), path, dpi=100)


def ood_figure(report):
    """The figure at one tau or at several, as the module says."""
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
            ax = figure.add_subplot(spec[1 + k // across, i * across + k % across])
            _score_histogram(ax, report, i, score, 0, f"{Path(ood_file).name}: {score_label(score)}")
            axes.append(ax)
    calibration = " (the calibration T)" if tau == report.stored_temperature else ""
    _ood_legend(figure, axes, _ood_title(report, f"at tau = {tau:.4g}{calibration}"))
    return figure


def roc_points(id_scores, ood_scores, limit: int = 4000):
    """``(fpr, tpr)`` of the ROC curve (ID positive, higher = more ID; tied scores one threshold), from (0, 0)
    to (1, 1), thinned to about ``limit`` points."""
    import numpy as np

    from ..metrics.detection import tie_counts

    id_up_to, ood_up_to, id_in, ood_in = tie_counts(id_scores, ood_scores)  # ascending: the curve runs backwards
    n, m = id_up_to[-1], ood_up_to[-1]
    tpr = np.r_[0.0, (n - id_up_to + id_in)[::-1] / n]  # the scores at or above each threshold
    fpr = np.r_[0.0, (m - ood_up_to + ood_in)[::-1] / m]
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
        ax.plot(fpr, tpr, color=colour, linewidth=1.5, label=score_label(score))
        kept = float(np.mean(np.asarray(id_values) >= m.fpr95_threshold))
        ax.plot([m.fpr95], [kept], marker="o", markersize=6, color=colour, markeredgecolor="black", linestyle="none")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("OOD accepted (false positive rate)")
    ax.set_ylabel("ID accepted (true positive rate)")
    ax.set_title(f"{Path(ood_file).name}\nROC, ID positive; o = FPR95", fontsize=TITLE_SIZE)
    ax.grid(True, alpha=0.25)
    ax.tick_params(labelsize=TICK_SIZE)


def _score_histogram(ax, report, index: int, score: str, k: int, heading: str) -> None:
    """ID (filled grey) vs OOD (black outline) densities of one score on OOD file ``index`` at ``report.taus[k]``,
    titled ``heading`` and its figures; a few outliers flatten nothing."""
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    id_values, ood_values = report.id_scores[score][k], report.ood_scores[index][score][k]
    m = report.rows(report.ood_files[index], score)[k]
    both = np.concatenate([id_values, ood_values])
    both = both[np.isfinite(both)]
    low, high = np.percentile(both, [0.1, 99.9]) if both.size else (0.0, 0.0)
    edges = np.linspace(low, high, 41) if high > low else np.array([low - 0.5, low + 0.5])
    ax.hist(np.clip(id_values, edges[0], edges[-1]), bins=edges.tolist(), density=True, color="0.6",
            label="ID scores")
    ax.hist(np.clip(ood_values, edges[0], edges[-1]), bins=edges.tolist(), density=True, histtype="step",
            color="black", linewidth=1.3, label="OOD scores")
    ax.set_title(f"{heading}\nAUROC {m.auroc:.4f}, FPR95 {m.fpr95:.4f}", fontsize=TITLE_SIZE)
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
                    color=colour, label=score_label(score))
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
    if calibration is not None and best.tau == calibration:  # one picture says it: the best tau is the calibration T
        axes[1].axis("off")
        axes[1].text(0.5, 0.5, f"{score_label(score)}: the best tau is\nthe calibration T", ha="center", va="center",
                     fontsize=TITLE_SIZE, color="0.35", transform=axes[1].transAxes)
    elif calibration is not None:
        panels.append((calibration, "calibration T"))
    for ax, (tau, what) in zip(axes, panels, strict=False):
        same = " = calibration T" if what == "best tau" and tau == calibration else ""
        _score_histogram(ax, report, index, score, report.taus.index(tau),
                         f"{Path(ood_file).name}\n{score_label(score)}, {what}{same}: tau = {tau:.4g}")


__all__ = ["ood_figure", "ood_plot"]
