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

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import DataError, TempcalError, param
from ..validation import shown_value, temperature_number, temperature_problem
from .base import OpenedSource

#: The most groups a key may make.
MAX_GROUPS = 100_000
#: The group key of lm-evaluation-harness logs: one group per log file.
TASK = "task"
GROUP_KEY = "tempcal.group_key"
GROUP_TEMPERATURES = "tempcal.group_temperatures"


@dataclass(frozen=True)
class RowGroups:
    """The groups of a SOURCE's counted rows: their names (sorted) and each row's group (all ranks' rows)."""

    key: str
    names: list[str]
    index: np.ndarray  # [N] int64 into names

    @property
    def count(self) -> int:
        return len(self.names)

    def sizes(self) -> list[int]:
        return np.bincount(self.index, minlength=self.count).astype(np.int64).tolist()

    def select(self, rows: Any) -> np.ndarray:
        """The group of each of ``rows`` (indices into the counted rows)."""
        return self.index[np.asarray(rows, dtype=np.int64)]


def read_groups(opened: OpenedSource, key: str, *, option: str | None = None) -> RowGroups:
    """The groups of ``opened``'s counted rows by ``key`` (see the module docstring); ``option`` names where KEY
    came from in messages (default ``--group-by``; ``apply`` reads the stored key)."""
    option = option or param("group_by")
    if opened.kind.name == "lm-eval":
        return _task_groups(opened, key, option)
    if key == TASK and key not in _tensor_names(opened):
        raise TempcalError(f"{option} {TASK} groups lm-evaluation-harness logs by their task; "
                           f"{opened.name} has no tensor '{TASK}'")
    values = _key_values(opened, key, option)
    kept = _kept_rows(opened.data)
    if kept is not None and kept.numel() and int(kept.max()) >= values.shape[0]:
        raise DataError(f"{opened.name}: '{key}' ({option}) has {values.shape[0]} values; the data has "
                        f"more rows")
    if kept is not None:
        values = values[kept.numpy()]
    groups = _named(key, values, opened.name, option)
    check_row_count(groups, opened.data.num_samples, f"{opened.name}: '{key}'", option)
    return groups


def groups_of_values(key: str, values: Any, where: str = "groups") -> RowGroups:
    """Groups from one integer per row (the Python API's ``groups=``)."""
    array = np.asarray(values.cpu() if isinstance(values, torch.Tensor) else values)
    if array.ndim != 1:
        raise DataError(f"{where}: expected one group per row ([N]), got shape {list(array.shape)}")
    if array.dtype.kind not in "biu":
        raise DataError(f"{where}: has dtype {array.dtype}; group values must be integers")
    return _named(key, array.astype(np.int64), where, "groups=")


def _named(key: str, values: np.ndarray, where: str, option: str) -> RowGroups:
    """Sorted distinct values as names, each row's index into them; more than MAX_GROUPS refused."""
    distinct, index = np.unique(values, return_inverse=True)
    if len(distinct) > MAX_GROUPS:
        raise DataError(f"{where}: {option} {key} makes {len(distinct):,} groups; at most "
                        f"{MAX_GROUPS:,} are allowed")
    return RowGroups(key, [str(int(v)) for v in distinct], index.reshape(-1).astype(np.int64))


def _task_groups(opened: OpenedSource, key: str, option: str) -> RowGroups:
    """One group per log file, named by its task (the file's name when it does not follow lm-eval's)."""
    from .lm_eval import task_from_filename

    if key != TASK:
        raise TempcalError(f"{opened.name}: lm-evaluation-harness logs hold no tensors; {option} "
                           f"{TASK} groups their rows by each log's task")
    rows = opened.file_rows or [opened.data.num_samples]
    tasks = [task_from_filename(p) or p.name for p in opened.paths]
    names = sorted(set(tasks))
    if len(names) < len(tasks):
        seen = next(t for t in tasks if tasks.count(t) > 1)
        raise DataError(f"{opened.name}: two logs of task '{seen}'; {option} {TASK} takes one log per task")
    index = np.concatenate([np.full(n, names.index(t), dtype=np.int64) for t, n in zip(tasks, rows, strict=True)])
    return RowGroups(key, names, index)


def _tensor_names(opened: OpenedSource) -> set[str]:
    from ..io.safetensors_header import read_header

    if opened.kind.name in ("safetensors", "head"):
        return set(read_header(opened.paths[0]).tensors)
    return set()


def _key_values(opened: OpenedSource, key: str, option: str) -> np.ndarray:
    """The flat integer values of ``key`` over every row of every file, before rows are left out."""
    kind = opened.kind.name
    if kind in ("safetensors", "head"):
        labels_key = opened.options.labels_key
        return np.concatenate([_safetensors_values(path, key, labels_key, option) for path in opened.paths])
    if kind == "model":
        inputs = Path(opened.inputs_path)  # type: ignore[attr-defined]
        return _safetensors_values(inputs, key, opened.options.labels_key, option)
    if kind == "npz":
        from .numpy import read_npz_array

        return _checked(opened.paths[0], key, read_npz_array(opened.paths[0], key, option),
                        _rows_shape(opened), option)
    if kind == "pt":
        from .torch_dict import read_pt_tensor

        return _checked(opened.paths[0], key, read_pt_tensor(opened.paths[0], key, option),
                        _rows_shape(opened), option)
    raise TempcalError(f"{opened.name}: {option} reads a named tensor of a .safetensors, .npz or .pt "
                       f"SOURCE (or of a model's inputs file); a {kind} SOURCE has none")


def _safetensors_values(path: Path, key: str, labels_key: str, option: str) -> np.ndarray:
    from ..io.safetensors_header import read_header, read_tensor

    header = read_header(path)
    shape = header.tensors[labels_key].shape if labels_key in header.tensors else None
    return _checked(path, key, read_tensor(header, key, option=option), shape, option)


def _rows_shape(opened: OpenedSource) -> tuple[int, ...] | None:
    """The labels' shape of an in-memory SOURCE (one row per label): read back from the file."""
    from .numpy import read_npz_array
    from .torch_dict import read_pt_tensor

    reader = read_npz_array if opened.kind.name == "npz" else read_pt_tensor
    try:
        return tuple(reader(opened.paths[0], opened.options.labels_key, param("labels_key")).shape)
    except TempcalError:
        return None  # no labels (an OOD set): the row count decides


def _checked(path: Path, key: str, tensor: torch.Tensor, labels_shape: Any, option: str) -> np.ndarray:
    """``tensor`` as flat int64 values, after checking its dtype and that its shape is the labels'."""
    if tensor.is_floating_point() or tensor.is_complex():
        raise DataError(f"{path}: '{key}' ({option}) has dtype {str(tensor.dtype).removeprefix('torch.')};"
                        " group values must be integers")
    shape = list(tensor.shape)
    expected = None if labels_shape is None else [int(n) for n in labels_shape]
    if expected is not None and expected[1:] == [1]:  # labels [N, 1] are one label per row
        expected = expected[:1]
    if expected is not None and expected != shape:
        raise DataError(f"{path}: '{key}' ({option}) has shape {shape}; expected one value per row, "
                        f"{list(labels_shape)} like the labels")
    return tensor.reshape(-1).to(torch.int64).numpy()


def _kept_rows(data: Any) -> torch.Tensor | None:
    """The rows a source's data keeps (``--ignore-index`` leaves some out), as indices into every row."""
    inner = getattr(data, "hidden", data)
    for name in ("rows", "index"):
        rows = getattr(inner, name, None)
        if isinstance(rows, torch.Tensor):
            return rows.to(torch.int64).cpu()
    return None


def check_row_count(groups: RowGroups, rows: int, where: str, option: str | None = None) -> None:
    """The group values must cover exactly the counted rows."""
    if groups.index.shape[0] != rows:
        raise DataError(f"{where} ({option or param('group_by')}) gives {groups.index.shape[0]} values for {rows} rows")


# -- the stored per-group temperatures -------------------------------------------------------
def group_metadata(key: str | None, temperatures: dict[str, float] | None) -> dict[str, str | None]:
    """The write-back entries for per-group temperatures (None values remove stale ones)."""
    if key is None or temperatures is None:
        return {GROUP_KEY: None, GROUP_TEMPERATURES: None}
    return {GROUP_KEY: key, GROUP_TEMPERATURES: json.dumps({name: float(t) for name, t in temperatures.items()})}


@dataclass(frozen=True)
class StoredGroups:
    """The group key and each group's T, as a fit with ``--group-by`` stored them."""

    key: str
    temperatures: dict[str, float]


def parse_stored_groups(metadata: Mapping[str, str], where: str) -> StoredGroups | None:
    """The per-group temperatures in ``metadata`` (None when there are none); ``where`` starts every error."""
    key, text = metadata.get(GROUP_KEY), metadata.get(GROUP_TEMPERATURES)
    if key is None and text is None:
        return None
    if key is None or text is None:
        present, absent = (GROUP_KEY, GROUP_TEMPERATURES) if text is None else (GROUP_TEMPERATURES, GROUP_KEY)
        raise DataError(f"{where} holds '{present}' without '{absent}' (fix it, or fit again)")
    try:  # integers read as floats: 10**400 is inf (then refused by name), not an OverflowError or a digit limit
        parsed = json.loads(text, parse_int=float)
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict) or len(parsed) > MAX_GROUPS:
        raise DataError(f"{where} '{GROUP_TEMPERATURES}' is not a JSON object of at most {MAX_GROUPS:,} group names "
                        "and temperatures (fix it, or fit again)")
    temperatures = {}
    for name, value in parsed.items():
        number = None if isinstance(value, bool) or not isinstance(value, (int, float)) else temperature_number(value)
        if number is None:
            raise DataError(f"{where} '{GROUP_TEMPERATURES}': group '{name}' has temperature {shown_value(value)}, "
                            f"{temperature_problem(value)} (fix it, or fit again)")
        temperatures[str(name)] = number
    return StoredGroups(key, temperatures)


def stored_group_temperatures(opened: OpenedSource) -> tuple[str | None, dict[str, float]]:
    """The group key and per-group temperatures stored with ``opened`` (``(None, {})`` when there are none)."""
    if not opened.paths:
        return None, {}
    stored = parse_stored_groups(opened.kind.stored_metadata(opened.paths[0]), f"{opened.paths[0]}:")
    return (None, {}) if stored is None else (stored.key, stored.temperatures)


__all__ = ["GROUP_KEY", "GROUP_TEMPERATURES", "MAX_GROUPS", "TASK", "RowGroups", "StoredGroups", "check_row_count",
           "group_metadata", "groups_of_values", "parse_stored_groups", "read_groups", "stored_group_temperatures"]
