"""``report --group-by KEY`` (and ``ood --group-by KEY``'s groups): figures per group at every temperature, one pass.

Each temperature is one slot of :func:`~tempcal.subsets.cells.cell_calibration`, the rows' groups its
subsets; at the stored T, when per-group temperatures are stored for KEY, one more slot holds each group's rows
at their own T_g (a group with none stored takes the global T, with a warning), beside the global T's figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from ..conformal.commands import OWN_GROUP_READS, own_group_sets, report_group_sets, report_thresholds
from ..core.scan import Scan
from ..metrics.calibration import CalibrationMetrics
from ..sources.base import OpenedSource, RowGroups
from ..sources.stored_groups import parse_stored_groups
from ..workflows.common import extra_figures
from .cells import CellCalibration, GroupRows, cell_calibration, metrics_block, row_extras, subset_metrics
from .options import Asked


@dataclass(frozen=True)
class GroupFigures:
    """One group's figures at one temperature (``tau``: the T its rows took)."""

    group: str
    tau: float
    metrics: CalibrationMetrics
    extras: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"group": self.group, "n": self.metrics.count, "tau": self.tau, **metrics_block(self.metrics),
                **self.extras}


@dataclass(frozen=True)
class GroupRow:
    """Every group at one temperature of the report; ``per_group``: each group at its stored T_g."""

    tau: float
    per_group: bool
    groups: list[GroupFigures]


def applicable_groups(opened: OpenedSource, groups: RowGroups, stored: float | None, warnings: list[str]
                      ) -> dict[str, float]:
    """The stored T_g that apply to a report by KEY, by group name (empty: none apply), with warnings for another key
    or groups stored without a T."""
    path = opened.paths[0] if opened.paths else None
    found = None if path is None else parse_stored_groups(opened.kind.stored_metadata(path), f"{path}:")
    if found is None or stored is None:
        return {}
    if found.key != groups.key:
        warnings.append(f"{opened.name}: its per-group temperatures are by '{found.key}', not '{groups.key}'; every "
                        "group is reported at the global T")
        return {}
    missing = [name for name in groups.names if name not in found.temperatures]
    if missing:
        warnings.append(f"{opened.name}: {len(missing)} of {groups.count} groups have no stored T (first: "
                        f"{missing[0]}); they are reported at the global T = {stored!r}")
    return {name: found.temperatures.get(name, stored) for name in groups.names}


@dataclass
class GroupedRun:
    """``report --group-by``'s figures: per row of the report (each temperature, and the stored T_g's row last when
    they apply) the overall metrics, every group's and the estimators; the pass's sums; the rows and reads the
    sets took."""

    results: list[CalibrationMetrics]
    rows: list[GroupRow]
    extras: list[dict]
    calibration: CellCalibration = field(repr=False)
    conformal_rows: Any = None  # the conformal sets' rows (ConformalRows), when asked for
    conformal_reads: int = 0


def held_out_groups(opened: OpenedSource, groups: RowGroups, rows: np.ndarray) -> tuple[RowGroups, tuple[int, int]]:
    """The groups of the held-out ``rows`` alone, and the part of them this process reads (sorted rows: a range)."""
    start, stop = opened.share()
    return (replace(groups, index=groups.index[rows]),
            (int(np.searchsorted(rows, start)), int(np.searchsorted(rows, stop))))


def report_groups(opened: OpenedSource, scan: Scan, full: Scan, groups: RowGroups, all_groups: RowGroups,
                  taus: Sequence[float], asked: Asked, *, share: tuple[int, int] | None, stored: float | None,
                  at_stored: bool, warnings: list[str]) -> GroupedRun:
    """Every temperature over ``scan``'s rows (``share``: the part of ``groups``' rows this process reads, when not
    its share of SOURCE) and every group in one pass; when the stored T is among ``taus`` and its T_g apply
    (``at_stored``), one more row last: each group's rows at its own T_g. Then the estimators, and with
    ``asked.alphas`` the conformal sets from ``full`` (every row, grouped by ``all_groups``)."""
    per_group = applicable_groups(opened, groups, stored, warnings) if at_stored else {}
    start, stop = share or opened.share()
    local = torch.from_numpy(groups.index[start:stop]).to(scan.device)
    rows_taus = [(tau, [tau] * groups.count) for tau in taus]
    if per_group and stored is not None and stored in taus:
        rows_taus.append((stored, [per_group[name] for name in groups.names]))
    betas = 1.0 / torch.tensor([g_taus for _, g_taus in rows_taus], dtype=torch.float64)
    calibration = cell_calibration(scan, betas, local, local, groups.count, asked.bins)
    index = GroupRows.kept(calibration, groups.index, groups.count)
    run = GroupedRun([], [], [], calibration)
    for k, (tau, g_taus) in enumerate(rows_taus):
        total = subset_metrics(calibration, k, tau)
        assert total is not None
        run.results.append(total)
        figures = [GroupFigures(name, g_taus[g], m) for g, name in enumerate(groups.names)
                   if (m := subset_metrics(calibration, k, g_taus[g], g, index)) is not None]
        run.rows.append(GroupRow(tau, k >= len(taus), figures))
    if asked.estimators or asked.bootstrap:
        _extras(scan, run, groups, warnings, asked)
    if asked.alphas:
        _grouped_sets(run, full, opened, all_groups, asked, per_group, warnings)
    return run


def _extras(scan: Scan, run: GroupedRun, groups: RowGroups, warnings: list[str], asked: Asked) -> None:
    """Estimators and intervals per temperature (as without groups; at per-group temperatures from the rows the pass
    kept), and each group's, from the confidences the pass kept."""
    at_plain = iter(extra_figures(scan, [row.tau for row in run.rows if not row.per_group], asked))
    for k, row in enumerate(run.rows):
        if row.per_group and "ece_classwise" in asked.estimators:
            warnings.append("ece_classwise is left out at per-group temperatures (it needs every class's probability "
                            "at each row's T)")
        run.extras.append(row_extras(run.calibration, k, asked) if row.per_group else next(at_plain))
    index = GroupRows(run.calibration, groups.index, groups.count)  # each group's rows: one slice
    number = {name: g for g, name in enumerate(groups.names)}
    run.rows = [replace(row, groups=[replace(f, extras=row_extras(run.calibration, k, asked, (index, number[f.group])))
                                     for f in row.groups])
                for k, row in enumerate(run.rows)]


def _grouped_sets(run: GroupedRun, full: Scan, opened: OpenedSource, groups: RowGroups, asked: Asked,
                  per_group: dict[str, float], warnings: list[str]) -> None:
    """``--group-by`` with ``--conformal-alpha``: the sets at every temperature, overall and per group, from a read of
    the thresholds and one of the evaluation rows; at the stored per-group temperatures (``per_group``, name -> T_g),
    each row's scores and sets at its own group's T, two reads more."""
    plain = [k for k, row in enumerate(run.rows) if not row.per_group]
    sets = report_thresholds(full, opened, [run.results[k].tau for k in plain], asked.alphas, asked.seed, warnings)
    overall, by_group = report_group_sets(full, opened, sets, groups.index, groups.count)
    _place_sets(run, plain, overall, by_group, groups.names)
    reads = sets.reads + 1
    own = [k for k, row in enumerate(run.rows) if row.per_group]
    if own:
        every, mine = own_group_sets(full, opened, sets.rows, asked.alphas,
                                     [per_group[name] for name in groups.names], groups.index)
        _place_sets(run, own, [every] * len(own), [mine] * len(own), groups.names)
        reads += OWN_GROUP_READS
    run.conformal_rows, run.conformal_reads = sets.rows, reads


def _place_sets(run: GroupedRun, places: list[int], overall: list, by_group: list, names: list[str]) -> None:
    """The sets of ``places[j]`` (report rows) from ``overall[j]`` and ``by_group[j][g]`` (None: no rows judged)."""
    number = {name: g for g, name in enumerate(names)}
    for j, k in enumerate(places):
        run.results[k] = replace(run.results[k], conformal=overall[j])
        figures = [(f, by_group[j][number[f.group]]) for f in run.rows[k].groups]
        run.rows[k] = replace(run.rows[k], groups=[f if sets is None else replace(
            f, extras={**f.extras, "conformal": [c.to_json() for c in sets]}) for f, sets in figures])


__all__ = ["GroupFigures", "GroupRow", "GroupedRun", "applicable_groups", "held_out_groups", "report_groups"]
