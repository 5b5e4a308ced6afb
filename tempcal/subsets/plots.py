"""``--plot`` with ``--group-by``: the command's usual figure, and beneath it each group's ECE as bars (every series,
at most :data:`MAX_GROUPS_DRAWN` groups, largest ECE first), each series named from its figure set's
:class:`~tempcal.workflows.common.Basis`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..output import plots
from ..output.plots import _save, check_plot_path, new_figure, reliability_size, sweep_size
from .console import short_name

#: Groups drawn, at most.
MAX_GROUPS_DRAWN = 30
#: Series colours in order (matplotlib's tab10 without black's neighbours); the per-group series is black.
COLOURS = ("tab:gray", "tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
           "tab:olive", "tab:cyan")
OWN_COLOUR = "black"

Series = tuple[str, Sequence[float | None]]


def _colours(series: Sequence[Series], own: set[int]) -> list:
    """A colour per series: :data:`COLOURS` in turn (a viridis ramp when there are more), black for ``own``."""
    plain = len(series) - len(own)
    if plain <= len(COLOURS):
        ramp: Iterator[Any] = iter(COLOURS)
    else:
        from matplotlib import colormaps

        ramp = iter([colormaps["viridis"](j / max(plain - 1, 1)) for j in range(plain)])
    return [OWN_COLOUR if k in own else next(ramp) for k in range(len(series))]


def group_ece_axes(ax, names: Sequence[str], series: Sequence[Series], title: str, own: Sequence[int] = ()) -> None:
    """Bars of ECE per group (rows) and series (colours, every one), groups ordered by the first series' ECE, largest
    first; ``own``: the series at each group's own T (drawn in black)."""
    first = series[0][1]
    shown = sorted(range(len(names)), key=lambda i: -(first[i] or 0.0))[:MAX_GROUPS_DRAWN]
    height = 0.8 / max(len(series), 1)
    for j, ((label, values), colour) in enumerate(zip(series, _colours(series, set(own)), strict=True)):
        positions = [k + (j - (len(series) - 1) / 2) * height for k in range(len(shown))]
        ax.barh(positions, [values[i] or 0.0 for i in shown], height=height, color=colour, label=label)
    ax.set_yticks(range(len(shown)), [short_name(names[i]) for i in shown], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ECE")
    more = len(names) - len(shown)
    ax.set_title(title + (f" ({more} more groups not drawn)" if more > 0 else ""), fontsize=10)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)


def with_group_bars(size: tuple[float, float], draw: Callable[[Any], None], names: Sequence[str],
                    series: Sequence[Series], title: str, own: Sequence[int] = ()):
    """One figure: ``draw`` (given a subfigure of ``size`` inches) above, the group bars beneath."""
    bars = 1.4 + 0.16 * min(len(names), MAX_GROUPS_DRAWN) * max(2, len(series))  # a readable bar each
    figure = new_figure(figsize=(max(size[0], 8.0), size[1] + bars))
    top, bottom = figure.subfigures(2, 1, height_ratios=[size[1], bars])
    draw(top)
    group_ece_axes(bottom.subplots(), names, series, title, own)
    return figure


def report_group_figure(result):
    """``report --group-by --plot``: the sweep against tau (its points: the rows at one temperature) or every row's
    reliability diagram and risk-coverage curve, then every group's ECE for every row of the report."""
    rows = result.group_rows
    names = [g.group for g in rows[0].groups]
    series = []
    for k, row in enumerate(rows):
        by_name = {g.group: g.metrics.ece for g in row.groups}
        series.append((result.basis(k).label(), [by_name.get(name) for name in names]))
    own = [k for k in range(len(rows)) if not result.basis(k).sweep_point]
    size, draw = report_drawing(result)
    return with_group_bars(size, draw, names, series, f"ECE per {result.group_key}", own)


def report_drawing(result) -> tuple[tuple[float, float], Callable[[Any], None]]:
    """What ``report --plot`` draws without groups: its size and a function drawing it into a (sub)figure."""
    from ..output.figures import min_nll_taus

    if result.sweep:
        points = [(k, m) for k, m in enumerate(result.results) if result.basis(k).sweep_point]
        lowest = min_nll_taus([m for _, m in points])  # over every row drawn, the stored T's included
        marks = {"min NLL": lowest[0]} if lowest else {}
        if result.stored_temperature is not None:
            marks["stored T"] = result.stored_temperature
        rows = [m.to_dict(with_bins=False) for _, m in points]
        labels = [result.basis(k).label() for k, _ in points]
        return sweep_size(rows), lambda figure: plots.sweep_figure(rows, marks, result.source, figure=figure,
                                                                   labels=labels)
    panels = [(result.basis(k).label(), m) for k, m in enumerate(result.results)]
    return (reliability_size(panels, True),
            lambda figure: plots.reliability_figure(panels, result.source, risk_coverage=True, figure=figure))


def fit_panels(report) -> list[tuple[str, Any]]:
    """``fit --plot``'s reliability panels, named by what each side was computed at."""
    return [(f"before ({report.before_basis.label()})", report.before),
            (f"after ({report.after_basis.label()})", report.after)]


def fit_group_figure(report):
    """``fit --group-by --plot``: the reliability diagrams before and after, then every group's ECE at T = 1, at the
    global T (out of fold with folds) and at its own T."""
    groups = report.subsets.groups
    names = [g.group for g in groups]

    def ece(blocks) -> list[float | None]:
        return [None if m is None else m.ece for m in blocks]

    oof = " (out of fold)" if report.folds is not None else ""
    series = [("T = 1", ece(g.before for g in groups)),
              ("global T (out of fold)" if oof else f"global T = {report.temperature:.4g}",
               ece(g.after_global for g in groups)),
              (f"per-group T{oof}", ece(g.after for g in groups))]
    panels = fit_panels(report)
    return with_group_bars(reliability_size(panels), lambda figure: plots.reliability_figure(
        panels, report.source, figure=figure), names, series, f"ECE per {report.subsets.group_key}", [2])


def save_figure(figure, path: str | os.PathLike) -> Path:
    """``figure`` written to ``path`` (its suffix the format)."""
    path = check_plot_path(path)
    _save(figure, path)
    return path


__all__ = ["MAX_GROUPS_DRAWN", "fit_group_figure", "fit_panels", "group_ece_axes",
           "report_drawing", "report_group_figure", "save_figure", "with_group_bars"]
