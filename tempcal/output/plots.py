"""Reliability diagrams, temperature sweeps and risk-coverage curves (matplotlib on Agg, imported only for a plot; the
format from the file's suffix), and what every figure shares: one legend outside the panels, plain log tick labels."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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


def figure_legend(figure, axes: list, **options) -> None:
    """One legend outside every panel (beneath them unless ``loc`` says otherwise), so that it hides no bar, error
    bar or curve: each label once, from whichever panel draws it."""
    handles: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        figure.legend(list(handles.values()), list(handles), loc=options.pop("loc", "outside lower center"),
                      ncols=options.pop("ncols", len(handles)), frameon=False, **options)


def plain_log_ticks(axis) -> None:
    """Tick labels of a log axis as plain numbers (``1.1``, ``20``), never ``1.1x10^0``; matplotlib's choice of
    which ticks to label kept."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        def _num_to_string(self, x, vmin, vmax):
            return f"{x:.4g}"

    axis.set_major_formatter(Plain(labelOnlyBase=False))
    axis.set_minor_formatter(Plain(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def new_figure(**options):
    """A matplotlib Figure on the Agg backend, laid out by constrained layout (legends outside the axes)."""
    pyplot()
    from matplotlib.figure import Figure

    return Figure(layout="constrained", **options)


def reliability_axes(ax, hist, bins: Sequence[Mapping[str, Any]], title: str, ece: float, *,
                     top: int | None = None) -> None:
    """Accuracy per bin with the gap to the diagonal and its Wilson interval, the rows per bin beneath (up to
    ``top``); ``bins`` as the JSON lists them."""
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


#: Reliability panels per row: a grid that grows by rows, so that every temperature asked for is drawn.
PANELS_PER_ROW = 3


def reliability_size(panels: Sequence[tuple[str, Any]], risk_coverage: bool = False) -> tuple[float, float]:
    """The size in inches of :func:`reliability_figure`'s figure."""
    columns = min(len(panels), PANELS_PER_ROW)
    curves = risk_coverage and any(getattr(m, "risk_coverage", None) for _, m in panels)
    return 4.6 * columns, 5.4 * -(-len(panels) // columns) + 0.8 + (3.6 if curves else 0)


def reliability_figure(panels: list[tuple[str, Any]], source: str | None = None, *, risk_coverage: bool = False,
                       figure: Any = None, top: int | None = None):
    """Every panel, ``PANELS_PER_ROW`` to a row, the row counts on one scale (up to ``top``), with ``risk_coverage``
    their curves beneath; drawn in ``figure`` or a new one."""
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
        reliability_axes(ax, hist, [dict(vars(b)) for b in metrics.bins], title, metrics.ece, top=top)
        axes.append(ax)
    if curves:
        ax = figure.add_subplot(spec[2 * rows, :])
        risk_coverage_axes(ax, [(title, curve_json(m)) for title, m in panels])
        axes.append(ax)
    if source:
        figure.suptitle(source)
    figure_legend(figure, axes, ncols=4 if columns > 1 else 2)  # one panel: the legend in two rows
    return figure


#: One colour per score, the same in every panel (matplotlib's tab10 order).
SCORE_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
                 "tab:gray", "tab:olive", "tab:cyan")
#: Risk-coverage curves drawn in colours of their own, named in the legend; more are shaded by tau instead.
NAMED_CURVES = 10


def risk_coverage_axes(ax, panels: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    """Risk against coverage, a curve per ``(label, JSON metrics)``: named in the legend, or beyond
    :data:`NAMED_CURVES` shaded by tau with a colour bar."""
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
    """:data:`SWEEP_PANELS` against tau from the JSON's result rows, lines at the ``marks`` (label -> tau), then with
    ``curves`` every row's risk-coverage curve named by ``labels``; drawn in ``figure`` or a new one."""
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


def _save(fig, path: Path, dpi: int = 120) -> Path:
    """Save beside the destination, then rename: a failed save leaves no half-written picture."""
    from ..io.paths import atomic_path

    with atomic_path(path, what=param("plot")) as temporary:
        fig.savefig(temporary, format=path.suffix.lstrip(".").lower(), dpi=dpi)
    return path


def log_spaced(start: float, stop: float, count: int) -> list[float]:
    """``count`` temperatures from ``start`` to ``stop``, evenly spaced in log T."""
    if count == 1:
        return [start]
    step = (math.log(stop) - math.log(start)) / (count - 1)
    return [math.exp(math.log(start) + k * step) for k in range(count)]
