"""Groups of rows, whatever the kind of SOURCE: group values made names, checked against the labels, and the
per-group temperatures stored beside T. It knows no kind and no opened source, so every kind can import it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import DataError, param
from ..validation import shown_value, temperature_number, temperature_problem

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
    #: Whether the names are integer values in decimal (a tensor's); False for named groups (lm-eval's tasks).
    numeric: bool = True

    @property
    def count(self) -> int:
        return len(self.names)

    def sizes(self) -> list[int]:
        return np.bincount(self.index, minlength=self.count).astype(np.int64).tolist()


def named(key: str, values: np.ndarray, where: str, option: str, *, numeric: bool = True) -> RowGroups:
    """Sorted distinct values as names (integers, or strings when not ``numeric``), each row's index into them;
    more than MAX_GROUPS refused."""
    distinct, index = np.unique(values, return_inverse=True)
    if len(distinct) > MAX_GROUPS:
        raise DataError(f"{where}: {option} {key} makes {len(distinct):,} groups; at most "
                        f"{MAX_GROUPS:,} are allowed")
    names = [str(int(v)) if numeric else str(v) for v in distinct]
    return RowGroups(key, names, index.reshape(-1).astype(np.int64), numeric=numeric)


def file_groups(key: str, names_of: list[str], rows: list[int]) -> RowGroups:
    """One group per name in ``names_of`` (each file's: an evaluation log's task or model), each file's ``rows`` rows
    in its name's group."""
    names = sorted(set(names_of))
    index = np.repeat(np.array([names.index(name) for name in names_of], dtype=np.int64), rows)
    return RowGroups(key, names, index, numeric=False)


def safetensors_values(path: Path, key: str, labels_key: str, option: str) -> np.ndarray:
    """The flat integer values of ``key`` in one safetensors file, checked against its labels' shape."""
    from ..io.safetensors_header import read_header, read_tensor

    header = read_header(path)
    shape = header.tensors[labels_key].shape if labels_key in header.tensors else None
    return checked(path, key, read_tensor(header, key, option=option), shape, option)


def checked(path: Path, key: str, tensor: torch.Tensor, labels_shape: Any, option: str) -> np.ndarray:
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


def kept_rows(data: Any) -> torch.Tensor | None:
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
def group_metadata(key: str | None, temperatures: Mapping[str, float] | None) -> dict[str, str | None]:
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


__all__ = ["GROUP_KEY", "GROUP_TEMPERATURES", "MAX_GROUPS", "TASK", "RowGroups", "StoredGroups", "check_row_count",
           "checked", "file_groups", "group_metadata", "kept_rows", "named", "parse_stored_groups",
           "safetensors_values"]
