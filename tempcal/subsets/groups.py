"""``--group-by KEY``: the group of every counted row of a SOURCE, and the per-group temperatures stored with it.

KEY names an integer tensor of SOURCE with one value per row (``[N]``, or ``[B, L]`` beside token labels;
for a model SOURCE, a tensor of its inputs file), read like the labels and cut to the rows that count
(``--ignore-index``). For lm-evaluation-harness logs KEY is the word ``task``: each log file is one group,
named by its task (``samples_<task>_<date>.jsonl``). Groups are named by their values in decimal, sorted
numerically (tasks: by name). Bad input: a missing key, a float tensor, a shape that does not match the
rows, more than :data:`MAX_GROUPS` groups.

Write-back keeps, beside ``tempcal.temperature``, :data:`GROUP_KEY` (KEY) and :data:`GROUP_TEMPERATURES`
(a JSON object string, group name -> T); ``apply`` gives each row its group's stored T (:func:`row_temperatures`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import Note, param
from ..sources.base import OpenedSource
from ..sources.grouping import (
    GROUP_KEY,
    GROUP_TEMPERATURES,
    MAX_GROUPS,
    TASK,
    RowGroups,
    StoredGroups,
    check_row_count,
    group_metadata,
    parse_stored_groups,
)

if TYPE_CHECKING:
    import torch


def read_groups(opened: OpenedSource, key: str, *, option: str | None = None) -> RowGroups:
    """The groups of ``opened``'s counted rows by ``key`` (see the module docstring), as its kind reads them;
    ``option`` names where KEY came from in messages (default ``--group-by``; ``apply`` reads the stored key)."""
    return opened.kind.read_groups(opened, key, option or param("group_by"))


def stored_group_temperatures(opened: OpenedSource) -> tuple[str | None, dict[str, float]]:
    """The group key and per-group temperatures stored with ``opened`` (``(None, {})`` when there are none)."""
    if not opened.paths:
        return None, {}
    stored = parse_stored_groups(opened.kind.stored_metadata(opened.paths[0]), f"{opened.paths[0]}:")
    return (None, {}) if stored is None else (stored.key, stored.temperatures)



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

__all__ = ["GROUP_KEY", "GROUP_TEMPERATURES", "MAX_GROUPS", "TASK", "RowGroups", "StoredGroups", "check_row_count",
           "group_metadata", "parse_stored_groups", "read_groups", "row_temperatures",
           "stored_group_temperatures"]
