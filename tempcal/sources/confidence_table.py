"""Confidence tables as SOURCE (``.csv``, ``.jsonl``, ``.parquet``): each row a binary sample, the logit of its
confidence (clipped to [1e-6, 1 - 1e-6], counted) labelled ``correct``; T in the sidecar with the columns and scale."""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ..errors import READING_KEYS, TempcalError, param
from ..io.sidecar import check_regular_file, sidecar_state
from .base import OpenedSource, RowGroups, SourceKind, SourceOptions, named
from .lm_eval_records import as_number, clip
from .tables import TableError, columns_of, read_rows, table_format, write_with_column

#: Where a confidence of exactly 0 or 1 is clipped to: [CLIP, 1 - CLIP].
CLIP = 1e-6
#: The column ``apply`` adds.
CALIBRATED_COLUMN = "calibrated_confidence"
#: ``--correct`` as text (any case).
_BOOLEAN = {"1": 1, "true": 1, "1.0": 1, "0": 0, "false": 0, "0.0": 0}
_INTEGER = re.compile(r"^[+-]?[0-9]{1,18}$")


@dataclass
class TableRows:
    """What was read from a confidence table: each row's logit and label, and how many confidences were clipped."""

    logits: array
    labels: array
    clipped: int
    has_labels: bool


def _shown(value: Any) -> str:
    return clip(repr(value) if not isinstance(value, str) else f"'{value}'")


def check_scale(scale: Any) -> float:
    """``--confidence-scale``: a finite number > 0 (1: probabilities; 100: percentages)."""
    value = float(scale) if isinstance(scale, (int, float)) and not isinstance(scale, bool) else math.nan
    if not (math.isfinite(value) and value > 0):
        raise TempcalError(f"{param('confidence_scale')} {scale}: expected a number > 0 (1 for probabilities, 100 "
                           "for percentages)")
    return value


def confidence_value(value: Any, where: str, scale: float) -> float:
    """A confidence as a probability in [0, 1]: a number (or numeric text) in [0, scale], divided by scale."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise TableError(f"{where}: missing value")
    number = as_number(value)
    if number is None:
        raise TableError(f"{where}: {_shown(value)} is not a number")
    if math.isnan(number):
        raise TableError(f"{where}: missing value ({_shown(value)})")
    if not 0 <= number <= scale:
        raise TableError(f"{where}: {_shown(value)} is outside [0, {scale:g}] ({param('confidence_scale')} {scale:g})")
    return number / scale


def correct_value(value: Any, where: str) -> int:
    """Whether the answer was right: 0/1 (numbers or text) or true/false (booleans or text, any case)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise TableError(f"{where}: missing value")
    if isinstance(value, bool) or (isinstance(value, (int, float)) and value in (0, 1)):
        return int(value)
    if isinstance(value, str) and value.strip().lower() in _BOOLEAN:
        return _BOOLEAN[value.strip().lower()]
    raise TableError(f"{where}: {_shown(value)} is not 0/1 or true/false")


def read_table(path: Path, options: SourceOptions, *, labels_optional: bool = False) -> TableRows:
    """Every row's logit ``ln(c / (1 - c))`` (c clipped to [CLIP, 1 - CLIP]) and label, one row at a time."""
    confidence, correct = options.confidence, options.correct
    if confidence is None or (correct is None and not labels_optional):
        raise TempcalError(f"{path}: a table is read as a confidence table: name its columns with "
                           f"{param('confidence')} COLUMN and {param('correct')} COLUMN")
    scale = check_scale(options.confidence_scale)
    labelled = correct is not None and (not labels_optional or correct in columns_of(path))
    wanted = [confidence, correct] if labelled and correct is not None else [confidence]
    flags = [param("confidence"), param("correct")][:len(wanted)]
    logits, labels, clipped = array("d"), array("q"), 0
    for row, values in read_rows(path, wanted, flags):
        c = confidence_value(values[0], f"{path}: row {row}: '{confidence}' ({flags[0]})", scale)
        if c <= 0 or c >= 1:
            c, clipped = (CLIP if c <= 0 else 1 - CLIP), clipped + 1
        logits.append(math.log(c) - math.log1p(-c))
        labels.append(correct_value(values[1], f"{path}: row {row}: '{correct}' ({flags[1]})") if labelled else 0)
    if not logits:
        raise TableError(f"{path}: no data rows")
    return TableRows(logits, labels, clipped, labelled)


def _group_names(path: Path, key: str, option: str) -> tuple[list[Any], bool]:
    """Each row's value of column ``key`` (ints, or strings), and whether they are all integers."""
    values: list[Any] = []
    for row, (value,) in read_rows(path, [key], [option]):
        where = f"{path}: row {row}: '{key}' ({option})"
        if value is None or isinstance(value, (bool, float)):
            missing = value is None or value != value
            what = "missing value" if missing else f"{_shown(value)} is not a string or an integer"
            raise TableError(f"{where}: {what}; groups are named by a column of strings or integers")
        if not isinstance(value, (int, str)):
            raise TableError(f"{where}: {_shown(value)} is not a string or an integer")
        values.append(value)
    row = next((k for k, v in enumerate(values, start=1) if not (isinstance(v, int) or _INTEGER.match(v.strip()))), 0)
    if row and all(isinstance(v, int) or as_number(v) is not None for v in values):  # a CSV's float column
        raise TableError(f"{path}: row {row}: '{key}' ({option}): {_shown(values[row - 1])} is not a string or an "
                         "integer; groups are named by a column of strings or integers")
    return ([str(v) for v in values] if row else [int(v) for v in values]), not row


class ConfidenceTableKind(SourceKind):
    """Tables of a confidence and a correctness per row (``--confidence``, ``--correct``)."""

    name = "confidence-table"
    title = "confidence table"
    #: The columns and scale a T was fitted with are kept beside it: ``report FILE`` then reads FILE the same way.
    remembered = ("confidence", "correct", "confidence_scale")
    own_apply_format = True

    def claims(self, paths: list[Path], options: SourceOptions) -> bool:
        """A table (all its registry line asks of) named with ``--confidence`` or ``--correct``, or whose sidecar names
        them (an earlier fit); any ``.csv`` (no other kind reads one)."""
        if options.confidence is not None or options.correct is not None or table_format(paths[0]) == "csv":
            return True
        # A stale sidecar too: the table changed since its fit, and opening asks for the columns again.
        return paths[0].is_file() and READING_KEYS["confidence"] in sidecar_state(paths[0]).metadata

    def open(self, paths: list[Path], options: SourceOptions, *, labels_optional: bool = False) -> OpenedSource:
        import torch

        from ..core.data import as_logits_data

        self.refuse_probs(options, f"{paths[0]} is a confidence table, read with {param('confidence')} and "
                                   f"{param('confidence_scale')}")
        check_regular_file(paths[0])
        rows = read_table(paths[0], options, labels_optional=labels_optional)
        logits = torch.frombuffer(rows.logits, dtype=torch.float64).clone()
        labels = torch.frombuffer(rows.labels, dtype=torch.int64).clone()
        data = as_logits_data(logits, labels, ignore_index=None)
        scale = check_scale(options.confidence_scale)
        # Confidences of exactly 0 or the scale (1 as probabilities, 100 as percentages), and where they went.
        warnings = [f"{paths[0]}: {rows.clipped} confidence{'s' if rows.clipped != 1 else ''} of exactly 0 or "
                    f"{scale:g} clipped to [{CLIP * scale:g}, {scale:g} - {CLIP * scale:g}] (their logits would be "
                    "infinite)"] if rows.clipped else []
        fields = {"source_kind": self.name, "clipped": rows.clipped, "confidence_column": options.confidence,
                  "correct_column": options.correct, "confidence_scale": scale}
        return self.with_stored(OpenedSource(paths, data, None, self, options, warnings=warnings,
                                             has_labels=rows.has_labels, json=fields))

    def apply_writer(self, opened: OpenedSource) -> Callable[[str | Path, Any], str]:
        """``apply`` writes the table in its format with :data:`CALIBRATED_COLUMN` added (:func:`apply_table`)."""
        return partial(apply_table, opened)

    def read_groups(self, opened: OpenedSource, key: str, option: str) -> RowGroups:
        """One group per value of column ``key`` (strings, or integers sorted numerically)."""
        import numpy as np

        values, numeric = _group_names(opened.paths[0], key, option)
        return named(key, np.asarray(values, dtype=np.int64 if numeric else object), opened, option, numeric=numeric)

    def describe_details(self, paths: list[Path], options: SourceOptions) -> Any:
        """The table's format, columns, rows, clipped confidences and the columns read."""
        details: dict[str, Any] = {"file": str(paths[0]), "format": table_format(paths[0]),
                                   "columns": columns_of(paths[0]), "confidence": options.confidence,
                                   "correct": options.correct, "confidence_scale": options.confidence_scale}
        shown = ", ".join(f"'{c}'" for c in details["columns"][:20])
        more = f" and {len(details['columns']) - 20} more" if len(details["columns"]) > 20 else ""
        details["summary"] = f"columns: {shown}{more}"
        if options.confidence is not None:
            rows = read_table(paths[0], options, labels_optional=True)
            right = sum(rows.labels) if rows.has_labels else None
            details.update(rows=len(rows.logits), clipped=rows.clipped, correct_rows=right)
            details["summary"] += (f"; confidence '{options.confidence}' (scale {options.confidence_scale:g}), "
                                   f"{rows.clipped} clipped at 0 or {options.confidence_scale:g}" +
                                   (f"; correct '{options.correct}': {right} of {len(rows.logits)} right"
                                    if right is not None else ""))
        return details

    def describe_hints(self, options: SourceOptions) -> list[str]:
        if options.confidence is None or options.correct is None:
            return [f"a confidence table: name its columns with {param('confidence')} COLUMN and "
                    f"{param('correct')} COLUMN ({param('confidence_scale')} 100 for percentages)"]
        return []


def apply_table(opened: OpenedSource, output: str | Path, calibrated: Any) -> str:
    """Write SOURCE's table to ``output`` (the same format) with :data:`CALIBRATED_COLUMN` added, atomically:
    ``calibrated`` (each row's calibrated probability) on the confidence's scale; returns the column's name."""
    path, out = opened.paths[0], Path(output)
    if table_format(out) != table_format(path):
        raise TempcalError(f"{param('output')} {output}: a confidence table is written in its own format; name it "
                           f"with the suffix {path.suffix}")
    if CALIBRATED_COLUMN in columns_of(path):
        raise TableError(f"{path}: already has a column '{CALIBRATED_COLUMN}'; apply to the table without it")
    scale = check_scale(opened.options.confidence_scale)
    write_with_column(path, out, CALIBRATED_COLUMN, [float(p) * scale for p in calibrated])
    return CALIBRATED_COLUMN


__all__ = ["CLIP", "ConfidenceTableKind", "read_table"]
