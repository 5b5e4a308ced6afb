"""The per-group figure: each group's ECE at each temperature (before / after), largest first.

``report --plot`` and ``fit --plot`` with ``--group-by`` draw it: one horizontal bar per group and series (a
reported temperature, or each group at its own T), at most :data:`MAX_GROUPS_DRAWN` groups (the largest ECE
of the last series first; the title says how many are left out).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .groups_console import short_name
from .plots import _save, check_plot_path, new_figure

#: Groups drawn, at most.
MAX_GROUPS_DRAWN = 30
COLOURS = ("tab:gray", "tab:blue", "tab:orange", "tab:green")


def group_ece_figure(names: Sequence[str], series: Sequence[tuple[str, Sequence[float | None]]], title: str):
    """Bars of ECE per group (rows) and series (colours); groups ordered by the last series' ECE, largest first."""
    last = series[-1][1]
    order = sorted(range(len(names)), key=lambda i: -(last[i] or 0.0))
    shown = order[:MAX_GROUPS_DRAWN]
    height = 0.8 / max(len(series), 1)
    figure = new_figure(figsize=(7.0, 1.2 + 0.32 * len(shown) * max(1, len(series) / 2)))
    ax = figure.subplots()
    for j, (label, values) in enumerate(series[:len(COLOURS)]):
        positions = [k + (j - (len(series) - 1) / 2) * height for k in range(len(shown))]
        ax.barh(positions, [values[i] or 0.0 for i in shown], height=height, color=COLOURS[j], label=label)
    ax.set_yticks(range(len(shown)), [short_name(names[i]) for i in shown], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ECE")
    more = len(names) - len(shown)
    ax.set_title(title + (f" ({more} more groups not drawn)" if more > 0 else ""), fontsize=10)
    ax.legend(loc="best", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return figure


def group_ece_plot(names: Sequence[str], series: Sequence[tuple[str, Sequence[float | None]]], title: str,
                   path: str | os.PathLike) -> Path:
    """:func:`group_ece_figure`, written to ``path``."""
    path = check_plot_path(path)
    _save(group_ece_figure(names, series, title), path)
    return path


def report_group_plot(result, path: str | os.PathLike) -> Path:
    """``report --group-by --plot``: every group's ECE at each reported temperature."""
    rows = result.group_rows
    names = [g.group for g in rows[0].groups]
    series = []
    for row in rows[:len(COLOURS)]:
        by_name = {g.group: g.metrics.ece for g in row.groups}
        label = "each group at its stored T" if row.per_group else f"tau = {row.tau:.4g}"
        series.append((label, [by_name.get(name) for name in names]))
    return group_ece_plot(names, series, f"{result.source}: ECE per {result.group_key}", path)


def fit_group_plot(report, path: str | os.PathLike) -> Path:
    """``fit --group-by --plot``: every group's ECE at T = 1, at the global T and at its own T."""
    groups = report.subsets.groups
    names = [g.group for g in groups]
    oof = " (out of fold)" if report.subsets.folds is not None else ""

    def ece(blocks) -> list[float | None]:
        return [None if m is None else m.ece for m in blocks]

    series = [("before (T = 1)", ece(g.before for g in groups)),
              (f"global T = {report.temperature:.4g}{oof}", ece(g.after_global for g in groups)),
              (f"each group at its T{oof}", ece(g.after for g in groups))]
    return group_ece_plot(names, series, f"{report.source}: ECE per {report.subsets.group_key}", path)


__all__ = ["MAX_GROUPS_DRAWN", "fit_group_plot", "group_ece_figure", "group_ece_plot", "report_group_plot"]
