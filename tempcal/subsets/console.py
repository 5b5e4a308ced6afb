"""The console's per-group and per-fold views: compact tables, largest ECE first, that fit 80 columns.

A group table lists at most :data:`TOP_GROUPS` groups (the largest ECE first) and says how many more there
are; names longer than :data:`NAME_WIDTH` characters are shortened with an ellipsis (the JSON keeps them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from ..conformal.sets import SHORT_P
from ..output.figures import group_coverage

#: Groups shown in a table; the rest are counted.
TOP_GROUPS = 20
NAME_WIDTH = 16


def short_name(name: str) -> str:
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "\u2026"


def _figure(m: Any, key: str = "ece") -> str:
    return "" if m is None else f"{getattr(m, key):.4f}"


def _print_table(console: Console, headers: Sequence[str], groups: Sequence[Any], row: Callable[[Any], list[str]]
                 ) -> None:
    """A table of the first :data:`TOP_GROUPS` ``groups`` (``row``: each one's cells), and how many more there are."""
    table = Table(show_edge=False, pad_edge=False)
    for k, header in enumerate(headers):
        table.add_column(header, justify="left" if k == 0 else "right", no_wrap=True)
    for g in groups[:TOP_GROUPS]:
        table.add_row(*row(g))
    console.print(table)
    if len(groups) > TOP_GROUPS:
        console.print(f"... and {len(groups) - TOP_GROUPS} more groups (every group is in the JSON)")


def print_fit_groups(report: Any, console: Console) -> None:
    """The fold temperatures' range, and each group's T and ECE at T = 1, at T_g and at the global T."""
    subsets = report.subsets
    if subsets is None:
        return
    if subsets.folds is not None:
        temps = subsets.folds["temperatures"]
        console.print(f"T per fold: {min(temps):.4g} to {max(temps):.4g} ({subsets.folds['k']} folds; 'after': each "
                      "row at its fold's T)")
    if subsets.groups is None:
        return
    groups = sorted(subsets.groups, key=lambda g: 1.0 if g.after is None else -g.after.ece)
    oof = ", out of fold" if subsets.folds is not None else ""
    console.print(f"{len(groups)} groups by {subsets.group_key} (prior {subsets.group_prior:g}{oof}), largest ECE "
                  "first:")
    _print_table(console, ["group", "n", GROUP_T, *(f"{figure}\n{at}" for figure, at in GROUP_COLUMNS)], groups,
                 lambda g: [short_name(g.group), str(g.n_eval), f"{g.temperature:.4g}", _figure(g.before),
                            _figure(g.after), _figure(g.after_global), _figure(g.after, "nll")])


#: The per-group columns of ``fit --group-by`` (console and HTML page alike): each group's T, then (figure, the
#: temperature its rows were at) for its blocks ``before``, ``after`` (its own T) and ``after_global``.
GROUP_T = "T_g"
GROUP_COLUMNS = (("ECE", "T = 1"), ("ECE", "per-group T"), ("ECE", "global T"), ("NLL", "per-group T"))


def print_group_coverage(report: Any, console: Console) -> None:
    """``--group-by`` with ``--conformal-alpha``: each group's coverage and mean set size under the global sets at
    the fitted T, lowest coverage first, with the groups whose shortfall is more than chance marked."""
    subsets = report.subsets
    blocks = group_coverage((g.group, g.n_eval, g.after_global_extras.get("conformal"))
                            for g in subsets.groups or [])
    where = "out of fold" if subsets.folds is not None else f"at {report.after_basis.label()}"
    for ranked in blocks:
        target, scores = 1.0 - ranked[0].alpha, list(ranked[0].cells)
        console.print(f"conformal coverage by group {where} (global sets; target {target:g}), lowest first:")
        cells = [[short_name(g.group), str(g.n),
                  *(v for s in scores for v in (f"{g.cells[s]['coverage']:.4f}" + ("*" if g.short[s] else " "),
                                                f"{g.cells[s]['mean_size']:.3f}"))] for g in ranked]
        _print_table(console, ["group", "n", *(h for s in scores for h in (f"{s.upper()} cov", f"{s.upper()} size"))],
                     cells, list)
        console.print(f"* short of {target:g} beyond chance (binomial p < {SHORT_P:g}): "
                      + ", ".join(f"{s.upper()} {sum(g.short[s] for g in ranked)} of {len(ranked)}" for s in scores))


def print_report_groups(result: Any, console: Console) -> None:
    """Per temperature row: each group's figures, largest ECE first."""
    for k, row in enumerate(result.group_rows or []):
        groups = sorted(row.groups, key=lambda g: -g.metrics.ece)
        basis = result.basis(k)
        at = basis.label() + (": each group's rows at its own T" if not basis.sweep_point else "")
        console.print(f"{len(groups)} groups by {result.group_key} at {at}, largest ECE first:", soft_wrap=True)
        headers = ["group", "n", "T" if basis.sweep_point else GROUP_T, "NLL", "ECE", "MCE", "Brier", "acc"]
        _print_table(console, headers, groups, lambda g: [short_name(g.group), str(g.metrics.count), f"{g.tau:.4g}", *(
            _figure(g.metrics, key) for key in ("nll", "ece", "mce", "brier", "accuracy"))])


__all__ = ["GROUP_COLUMNS", "GROUP_T", "NAME_WIDTH", "TOP_GROUPS", "print_fit_groups", "print_group_coverage",
           "print_report_groups", "short_name"]
