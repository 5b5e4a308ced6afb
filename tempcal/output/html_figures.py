"""The HTML report's figures, drawn from a command's JSON (the same dict pipelines read) as inline SVG.

Working from the JSON keeps the page a pure function of what the command reported: a page rendered later from a
saved ``--json`` file is the same page. Text stays text in the SVG (``svg.fonttype = none``), so figures are
small, searchable and sharp at any width; sizes come from the viewBox and the page's CSS.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence

#: Colours of successive series (matplotlib's tab10 order), the same in every figure.
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def svg(fig) -> str:
    """The figure as an ``<svg>`` element without the XML prologue or fixed size, then closed."""
    plt = _pyplot()
    buffer = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "tempcal"}):
        fig.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    # The page sizes figures (CSS width 100%); the viewBox keeps the aspect ratio.
    text = re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"',
                  r'<svg\1 role="img" preserveAspectRatio="xMidYMid meet"', text, count=1)
    return text


def reliability(panels: Sequence[tuple[str, dict]]) -> list[str]:
    """One reliability diagram per ``(title, metrics)``: accuracy per bin with its Wilson interval, the gap to the
    mean confidence, and the rows per bin beneath on one count scale for every panel (the page lays them side by
    side on a wide screen and one under another on a phone)."""
    plt = _pyplot()
    top = max((b["count"] for _, m in panels for b in m.get("bins") or []), default=1)
    out = []
    for title, metrics in panels:
        fig, (ax, hist) = plt.subplots(2, 1, figsize=(4.2, 4.6), gridspec_kw={"height_ratios": [3, 1]}, sharex=True)
        bins = metrics.get("bins") or []
        width = 1.0 / max(len(bins), 1)
        ax.plot([0, 1], [0, 1], color="0.5", linestyle="--", linewidth=1)
        full = [b for b in bins if b["count"]]
        ax.bar([b["lower"] for b in full], [b["accuracy"] for b in full], width=width, align="edge",
               color="tab:blue", alpha=0.75, edgecolor="white", linewidth=0.5, label="accuracy")
        ax.bar([b["lower"] for b in full], [b["confidence"] - b["accuracy"] for b in full],
               bottom=[b["accuracy"] for b in full], width=width, align="edge", facecolor="none", hatch="///",
               edgecolor="tab:red", linewidth=0.6, label="gap to confidence")
        shown = [b for b in full if b.get("accuracy_low") is not None]
        if shown:
            ax.errorbar([b["lower"] + width / 2 for b in shown], [b["accuracy"] for b in shown],
                        yerr=[[max(0.0, b["accuracy"] - b["accuracy_low"]) for b in shown],
                              [max(0.0, b["accuracy_high"] - b["accuracy"]) for b in shown]],
                        fmt="none", ecolor="black", elinewidth=0.8, capsize=2, label="95% interval")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("accuracy")
        ax.set_title(f"{title}: ECE {metrics['ece']:.4f}", fontsize=11)
        ax.legend(loc="upper left", fontsize=8, framealpha=0.9)
        hist.bar([b["lower"] for b in bins], [b["count"] for b in bins], width=width, align="edge", color="0.55")
        hist.set_xlabel("confidence")
        hist.set_ylabel("rows")
        hist.set_yscale("log")
        hist.set_ylim(0.8, top * 1.5)
        fig.tight_layout()
        out.append(svg(fig))
    return out


def sweep(results: Sequence[dict], marks: dict[str, float]) -> str:
    """NLL, ECE, AURC and smooth ECE (those present) against tau on a log axis; dashed lines at ``marks``."""
    plt = _pyplot()
    keys = [(k, label) for k, label in (("nll", "NLL"), ("ece", "ECE"), ("smece", "smooth ECE"), ("aurc", "AURC"))
            if all(r.get(k) is not None for r in results)]
    fig, axes = plt.subplots(len(keys), 1, figsize=(6, 1.8 * len(keys) + 0.6), sharex=True, squeeze=False)
    taus = [r["tau"] for r in results]
    for ax, (key, label) in zip(axes[:, 0], keys, strict=True):
        ax.plot(taus, [r[key] for r in results], marker="o", markersize=3, color="tab:blue")
        ax.set_ylabel(label)
        for (name, tau), colour in zip(marks.items(), ("tab:red", "tab:green", "tab:purple"), strict=False):
            ax.axvline(tau, color=colour, linestyle="--", linewidth=1, label=f"{name} {tau:.4g}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].set_xscale("log")
    axes[-1, 0].set_xlabel("temperature tau")
    if marks:
        axes[0, 0].legend(fontsize=8, loc="best")
    fig.tight_layout()
    return svg(fig)


def risk_coverage(curves: Sequence[tuple[str, dict]]) -> str:
    """Risk (error rate among the rows kept) against coverage, one line per ``(label, curve)``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for (label, curve), colour in zip(curves, COLOURS * 4, strict=False):
        ax.plot(curve["coverage"], curve["risk"], color=colour, linewidth=1.4, label=label)
    ax.set_xlabel("coverage (fraction of rows answered, most confident first)")
    ax.set_ylabel("risk (error rate)")
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return svg(fig)


def groups(rows: Sequence[dict], limit: int = 20) -> str:
    """Per-group ECE before and after, the ``limit`` groups of largest ECE before, as horizontal bars."""
    plt = _pyplot()
    rows = sorted(rows, key=lambda g: -(g["before"]["ece"] if g["before"]["ece"] is not None else -1))[:limit]
    fig, ax = plt.subplots(figsize=(6, 0.32 * len(rows) + 1.2))
    ys = list(range(len(rows)))[::-1]
    ax.barh([y + 0.2 for y in ys], [g["before"]["ece"] for g in rows], height=0.4, color="0.6", label="T = 1")
    ax.barh([y - 0.2 for y in ys], [g["after"]["ece"] for g in rows], height=0.4, color="tab:blue",
            label="group T")
    ax.set_yticks(ys, [f"{g['group']} (n={g.get('n_eval', g.get('n', ''))})" for g in rows], fontsize=8)
    ax.set_xlabel("ECE")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return svg(fig)


def ood_curves(results: Sequence[dict], ood_file: str) -> list[str]:
    """AUROC, then FPR95, against tau for every score on one OOD file (a single tau: a bar per score)."""
    plt = _pyplot()
    rows = [r for r in results if r["ood_file"] == ood_file]
    scores = list(dict.fromkeys(r["score"] for r in rows))
    taus = sorted({r["tau"] for r in rows})
    out = []
    for key, label in (("auroc", "AUROC (higher is better)"), ("fpr95", "FPR95 (lower is better)")):
        fig, ax = plt.subplots(figsize=(4.4, 3.2))
        for score, colour in zip(scores, COLOURS * 4, strict=False):
            points = sorted((r["tau"], r[key]) for r in rows if r["score"] == score)
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
            ax.set_xlabel("temperature tau")
            ax.legend(fontsize=8)
        ax.set_title(label, fontsize=11)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        out.append(svg(fig))
    return out


def finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
