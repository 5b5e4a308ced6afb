"""Per-group temperatures stored with a SOURCE, applied row by row: what ``apply`` reads of them.

``fit --group-by KEY`` stores, beside ``tempcal.temperature``, the key ``tempcal.group_key`` (KEY) and
``tempcal.group_temperatures`` (a JSON object string, group name -> T_g); see :mod:`tempcal.subsets.groups`,
which reads both and each row's group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import Note
from ..sources.base import OpenedSource
from .groups import GROUP_KEY, StoredGroups, read_groups

if TYPE_CHECKING:
    import torch


def row_temperatures(opened: OpenedSource, groups: StoredGroups, default: float,
                     warnings: list[str]) -> tuple[torch.Tensor, dict[str, float], torch.Tensor | None]:
    """Each row's T (float64): its group's stored T, or ``default`` (the global T) for a group none is stored for,
    with a warning; the T of every group the rows hold; and each row's group value (int64) as the tensor KEY holds
    it (None for lm-eval logs, grouped by task, which hold no such tensor)."""
    import torch

    rows = read_groups(opened, groups.key, option=f"the stored '{GROUP_KEY}'")
    index = torch.from_numpy(rows.index)
    per_group = [groups.temperatures.get(name, default) for name in rows.names]
    unstored = [name for name in rows.names if name not in groups.temperatures]
    if unstored:
        count = int(torch.isin(index, torch.tensor([rows.names.index(n) for n in unstored])).sum())
        warnings.append(Note(f"{opened.name}: {len(unstored)} group(s) of '{groups.key}' have no stored temperature "
                             f"(first: '{unstored[0]}'); their {count} rows take the global T = {default!r}"))
    values = None
    if rows.numeric:  # integer groups: their names are the values in decimal
        values = torch.tensor([int(name) for name in rows.names], dtype=torch.int64)[index]
    return torch.tensor(per_group, dtype=torch.float64)[index], dict(zip(rows.names, per_group, strict=True)), values


__all__ = ["row_temperatures"]
