"""Per-group temperatures stored with a SOURCE, and each row's group: what ``apply`` and ``inspect`` read of them.

``fit --group-by KEY`` stores, beside ``tempcal.temperature``, the key ``tempcal.group_key`` (KEY) and
``tempcal.group_temperatures`` (a JSON object string, group name -> T_g). KEY names an integer tensor of SOURCE
with one value per row (``[N]``, or ``[B, L]`` beside token labels; group names are the integers in decimal), or,
for lm-evaluation-harness logs, ``task``: each log file is one group, named by its task.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import Note, TempcalError
from ..sources.base import OpenedSource

if TYPE_CHECKING:
    import torch

GROUP_KEY = "tempcal.group_key"
GROUP_TEMPERATURES_KEY = "tempcal.group_temperatures"
#: The group key of lm-evaluation-harness logs: one group per log file, named by its task.
TASK = "task"
#: The most groups a SOURCE may have (the contract's bound).
MAX_GROUPS = 100_000


@dataclass(frozen=True)
class StoredGroups:
    """The group key and each group's T, as a fit with ``--group-by`` stored them."""

    key: str
    temperatures: dict[str, float]


def stored_groups(metadata: Mapping[str, str], where: str) -> StoredGroups | None:
    """The per-group temperatures in ``metadata`` (None when there are none); ``where`` starts every error."""
    key, text = metadata.get(GROUP_KEY), metadata.get(GROUP_TEMPERATURES_KEY)
    if key is None and text is None:
        return None
    if key is None or text is None:
        present, absent = (GROUP_KEY, GROUP_TEMPERATURES_KEY) if text is None else (GROUP_TEMPERATURES_KEY, GROUP_KEY)
        raise TempcalError(f"{where} holds '{present}' without '{absent}' (fix it, or fit again)")
    try:
        parsed = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict) or len(parsed) > MAX_GROUPS:
        raise TempcalError(f"{where} '{GROUP_TEMPERATURES_KEY}' is not a JSON object of at most {MAX_GROUPS:,} "
                           "group names and temperatures (fix it, or fit again)")
    temperatures = {}
    for name, value in parsed.items():
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
        if not ok:
            raise TempcalError(f"{where} '{GROUP_TEMPERATURES_KEY}': group '{name}' has temperature {value!r}, not a "
                               "positive number (fix it, or fit again)")
        temperatures[str(name)] = float(value)
    return StoredGroups(key, temperatures)


def row_groups(opened: OpenedSource, key: str) -> tuple[list[str], torch.Tensor]:
    """Each row's group: the group names and, per row of ``opened`` (every row of its files, in order), the
    index of its name. Bad input: a missing or float tensor, a shape that does not match the rows."""
    import torch

    if opened.kind.name == "lm-eval" and key == TASK:
        return _task_groups(opened)
    parts = [_group_tensor(opened, path, key) for path in opened.paths]
    if not parts:
        raise TempcalError(f"{opened.name}: a model's outputs have no group tensor '{key}'")
    values = torch.cat(parts)
    if values.numel() != opened.data.num_samples:
        raise TempcalError(f"{opened.name}: group tensor '{key}' has {values.numel()} values but the SOURCE has "
                           f"{opened.data.num_samples} rows")
    unique, index = torch.unique(values, return_inverse=True)
    if unique.numel() > MAX_GROUPS:
        raise TempcalError(f"{opened.name}: group tensor '{key}' has {unique.numel():,} groups, more than "
                           f"{MAX_GROUPS:,}")
    return [str(int(v)) for v in unique.tolist()], index


def _group_tensor(opened: OpenedSource, path: Path, key: str) -> torch.Tensor:
    """The integer values of tensor ``key`` in one file of ``opened``, flattened."""
    import torch

    kind = opened.kind.name
    option = f"the stored '{GROUP_KEY}'"
    if kind in ("safetensors", "head"):
        from ..io.safetensors_header import read_header, read_tensor

        tensor = read_tensor(read_header(path), key, option=option)
    elif kind == "npz":
        from ..sources.numpy import read_npz_array

        tensor = read_npz_array(path, key, option)
    elif kind == "pt":
        from ..sources.torch_dict import read_pt_tensor

        tensor = read_pt_tensor(path, key, option)
    else:
        raise TempcalError(f"{path}: per-group temperatures are stored for it, but tempcal reads group tensors from "
                           ".safetensors, .npz and .pt files only (and 'task' from lm-eval logs)")
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise TempcalError(f"{path}: group tensor '{key}' has dtype {str(tensor.dtype).removeprefix('torch.')}; "
                           "expected an integer dtype")
    return tensor.reshape(-1).to(torch.int64)


def _task_groups(opened: OpenedSource) -> tuple[list[str], torch.Tensor]:
    """lm-eval logs grouped by task: every row of a log belongs to its file's task (each log read again for its
    row count when there are several)."""
    import torch

    from ..sources.lm_eval import read_lm_eval_log, task_from_filename

    tasks: list[str] = []
    for path in opened.paths:
        task = task_from_filename(path)
        if task is None:
            raise TempcalError(f"{path}: its name does not follow samples_<task>_<date>.jsonl, so it has no task "
                               "to group by")
        tasks.append(task)
    norm = opened.options.lm_eval_norm
    counts = ([opened.data.num_samples] if len(opened.paths) == 1
              else [read_lm_eval_log(path, norm)[1].numel() for path in opened.paths])
    names = sorted(set(tasks))
    index = [torch.full((rows,), names.index(task), dtype=torch.int64) for task, rows in zip(tasks, counts,
                                                                                              strict=True)]
    return names, torch.cat(index)


def row_temperatures(opened: OpenedSource, groups: StoredGroups, default: float,
                     warnings: list[str]) -> tuple[torch.Tensor, dict[str, float]]:
    """Each row's T (float64): its group's stored T, or ``default`` (the global T) for a group none is stored for,
    with a warning; and the T of every group the rows hold."""
    import torch

    names, index = row_groups(opened, groups.key)
    per_group = [groups.temperatures.get(name, default) for name in names]
    unstored = [name for name in names if name not in groups.temperatures]
    if unstored:
        rows = int(torch.isin(index, torch.tensor([names.index(n) for n in unstored])).sum())
        warnings.append(Note(f"{opened.name}: {len(unstored)} group(s) of '{groups.key}' have no stored temperature "
                             f"(first: '{unstored[0]}'); their {rows} rows take the global T = {default!r}"))
    return torch.tensor(per_group, dtype=torch.float64)[index], dict(zip(names, per_group, strict=True))


__all__ = ["GROUP_KEY", "GROUP_TEMPERATURES_KEY", "MAX_GROUPS", "TASK", "StoredGroups", "row_groups",
           "row_temperatures", "stored_groups"]
