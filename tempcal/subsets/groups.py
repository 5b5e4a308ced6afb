"""``--group-by KEY``: the group of every counted row of a SOURCE, and the per-group temperatures stored with it.

KEY names an integer tensor of SOURCE with one value per row (``[N]``, or ``[B, L]`` beside token labels;
for a model SOURCE, a tensor of its inputs file), read like the labels and cut to the rows that count
(``--ignore-index``). For lm-evaluation-harness logs KEY is the word ``task``: each log file is one group,
named by its task (``samples_<task>_<date>.jsonl``). Groups are named by their values in decimal, sorted
numerically (tasks: by name). Bad input: a missing key, a float tensor, a shape that does not match the
rows, more than :data:`MAX_GROUPS` groups.

Write-back keeps, beside ``tempcal.temperature``, :data:`GROUP_KEY` (KEY) and :data:`GROUP_TEMPERATURES`
(a JSON object string, group name -> T).
"""

from __future__ import annotations

from ..errors import param
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


__all__ = ["GROUP_KEY", "GROUP_TEMPERATURES", "MAX_GROUPS", "TASK", "RowGroups", "StoredGroups", "check_row_count",
           "group_metadata", "parse_stored_groups", "read_groups", "stored_group_temperatures"]
