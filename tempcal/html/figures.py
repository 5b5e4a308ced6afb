"""The HTML page's figures as inline SVG (text kept as text: small, searchable, sharp), drawn with ``--plot``'s
axes from the result's metrics objects."""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any

from ..output.plots import (
    SCORE_COLOURS,
    curve_json,
    figure_legend,
    new_figure,
    plain_log_ticks,
    pyplot,
    reliability_figure,
    risk_coverage_axes,
    sweep_figure,
)


def svg(fig) -> str:
    """The figure as an ``<svg>`` element without the XML prologue or fixed size, then closed."""
    plt = pyplot()
    buffer = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "tempcal"}):
        fig.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buffer.getvalue()
    # The page sizes figures (CSS width 100%); the viewBox keeps the aspect ratio.
    return re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"',
                  r'<svg\1 role="img" preserveAspectRatio="xMidYMid meet"', text[text.index("<svg"):], count=1)


def reliability(panels: Sequence[tuple[str, Any]]) -> list[str]:
    """One reliability diagram per ``(title, metrics)`` as ``--plot`` draws it, the rows per bin on one scale."""
    top = max((b.count for _, m in panels for b in m.bins), default=1)
    return [svg(reliability_figure([panel], top=top, figure=new_figure(figsize=(4.2, 5.0)))) for panel in panels]


def sweep(results: Sequence[dict], marks: dict[str, float]) -> str:
    """The figures against tau that ``report --plot`` draws on a sweep (the page shows the curves apart)."""
    return svg(sweep_figure(results, marks, curves=False))


def risk_coverage(curves: Sequence[tuple[str, Any]]) -> str:
    """Risk (error rate among the rows kept) against coverage, one line per ``(label, metrics)``, as ``--plot``
    draws it."""
    fig = new_figure(figsize=(5.5, 4.2))
    ax = fig.add_subplot()
    risk_coverage_axes(ax, [(label, curve_json(m)) for label, m in curves])
    figure_legend(fig, [ax], ncols=2)
    return svg(fig)


def groups(rows: Sequence[dict], global_label: str = "global T", limit: int = 20) -> str:
    """Per-group ECE at T = 1, at the global T (``global_label``) and at each group's own T, the ``limit`` groups of
    largest ECE at T = 1, as horizontal bars (the series of ``fit --plot``'s group bars)."""
    plt = pyplot()
    rows = sorted(rows, key=lambda g: -(g["before"]["ece"] if g["before"]["ece"] is not None else -1))[:limit]
    series = [("T = 1", "before", "0.6"), (global_label, "after_global", "tab:orange"),
              ("per-group T", "after", "tab:blue")]
    series = [s for s in series if any((g.get(s[1]) or {}).get("ece") is not None for g in rows)]
    fig, ax = plt.subplots(figsize=(6, 0.4 * len(rows) * max(1, len(series) / 2) + 1.2))
    height = 0.8 / len(series)
    ys = list(range(len(rows)))[::-1]
    for j, (label, key, colour) in enumerate(series):
        offset = ((len(series) - 1) / 2 - j) * height
        ax.barh([y + offset for y in ys], [(g.get(key) or {}).get("ece") or 0.0 for g in rows], height=height,
                color=colour, label=label)
    ax.set_yticks(ys, [f"{g['group']} (n={g.get('n_eval', g.get('n', ''))})" for g in rows], fontsize=8)
    ax.set_xlabel("ECE")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return svg(fig)


def ood_curves(report, ood_file: str) -> list[str]:
    """AUROC, then FPR95, against tau for every score of ``report`` (``ood``'s result) on one OOD file (a single
    tau: a bar per score)."""
    plt = pyplot()
    scores, taus = report.scores, sorted(set(report.taus))
    out = []
    for key, label in (("auroc", "AUROC (higher is better)"), ("fpr95", "FPR95 (lower is better)")):
        fig, ax = plt.subplots(figsize=(4.4, 3.2))
        for score, colour in zip(scores, SCORE_COLOURS, strict=False):
            points = sorted((m.tau, getattr(m, key)) for m in report.rows(ood_file, score))
            if len(taus) == 1:
                ax.bar(scores.index(score), points[0][1], color=colour, label=score)
            else:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, color=colour,
                        label=score)
        if len(taus) == 1:
            ax.set_xticks(range(len(scores)), scores)
            ax.set_xlabel(f"score at tau = {taus[0]:.4g}")
        else:
            ax.set_xscale("log")
            plain_log_ticks(ax.xaxis)
            ax.set_xlabel("temperature tau")
            ax.legend(fontsize=8)
        ax.set_title(label, fontsize=11)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        out.append(svg(fig))
    return out


__all__ = ["groups", "ood_curves", "reliability", "risk_coverage", "svg", "sweep"]
