"""``ood --group-by KEY``: every in-distribution group against every OOD file, at every score and tau.

Group g's figures reuse the main pass's per-row scores (the rows bucketed by group once; each OOD score vector sorted
once, :class:`SortedOod`). At the stored T, when per-group temperatures are stored for KEY, group g's rows and every
OOD row are scored at T_g: those temperatures join each file's one scores pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..metrics.detection import SortedOod, detection_against
from ..sources.base import OpenedSource, RowGroups
from .options import read_groups

#: At most this many distinct stored per-group temperatures are scored (each is one more exp per logit).
MAX_GROUP_TAUS = 256


@dataclass(frozen=True)
class GroupTaus:
    """Each group's temperature at the stored T (empty: none applies), and the extra temperatures to score."""

    per_group: dict[str, float]
    extra: list[float]


def ood_groups(loaded: OpenedSource, group_by: str | None, at_stored: bool, taus: Sequence[float],
               stored: float | None, warnings: list[str]) -> tuple[RowGroups | None, GroupTaus]:
    """SOURCE's groups by ``group_by`` and, when the stored T is reported (``at_stored``, and among ``taus``), the
    stored per-group temperatures that apply to them, with the distinct ones not already among ``taus``."""
    if group_by is None:
        return None, GroupTaus({}, [])
    from .report import applicable_groups

    groups = read_groups(loaded, group_by)
    per_group = applicable_groups(loaded, groups, stored, warnings) if at_stored else {}
    if not per_group or stored is None or stored not in taus:
        return groups, GroupTaus({}, [])
    extra = sorted({t for t in per_group.values() if t not in taus})
    if len(extra) > MAX_GROUP_TAUS:
        warnings.append(f"{len(extra)} distinct per-group temperatures: more than {MAX_GROUP_TAUS} are not scored; "
                        "every group is reported at the global T")
        return groups, GroupTaus({}, [])
    return groups, GroupTaus(per_group, extra)


def group_results(groups: RowGroups, ood_names: Sequence[str], scores: Sequence[str], taus: Sequence[float],
                  applied: GroupTaus, stored: float | None, id_scores: dict[str, list[np.ndarray]],
                  ood_scores: Sequence[dict[str, list[np.ndarray]]]) -> list[dict]:
    """Per group: its size and its rows' figures against every OOD file; ``id_scores`` and ``ood_scores`` hold
    ``taus`` then ``applied.extra``."""
    every = [*taus, *applied.extra]
    position = {tau: k for k, tau in reversed(list(enumerate(every)))}
    sorted_ood: dict[tuple[int, str, int], SortedOod] = {}  # each OOD score vector sorted once, for every group
    order = np.argsort(groups.index, kind="stable")  # the rows of each group, found once
    bounds = np.r_[0, np.cumsum(np.bincount(groups.index, minlength=groups.count))]
    out = []
    for g, name in enumerate(groups.names):
        mine = order[bounds[g]:bounds[g + 1]]
        rows = []
        for f, (ood_name, side) in enumerate(zip(ood_names, ood_scores, strict=True)):
            for score in scores:
                for tau in taus:
                    own = bool(applied.per_group) and tau == stored
                    used = applied.per_group[name] if own else tau
                    k = position[used]
                    if (f, score, k) not in sorted_ood:
                        sorted_ood[f, score, k] = SortedOod(side[score][k])
                    m = detection_against(id_scores[score][k][mine], sorted_ood[f, score, k], tau=used, score=score)
                    rows.append({"ood_file": ood_name, "score": score, "tau": used, "per_group": own,
                                 "auroc": m.auroc, "aupr_in": m.aupr_in, "aupr_out": m.aupr_out, "fpr95": m.fpr95})
        out.append({"group": name, "n_id": int(mine.size), "results": rows})
    return out


__all__ = ["MAX_GROUP_TAUS", "GroupTaus", "group_results", "ood_groups"]
