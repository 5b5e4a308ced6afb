"""lighteval details files (``details_<task>_<date>.parquet``) as SOURCE: row i is ``model_response.logprobs`` padded
with ``-inf``, labelled ``doc.gold_index``; incomplete rows are counted by reason and left out; T as for lm-eval."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import TempcalError, param
from ..io.optional import require
from ..io.sidecar import check_regular_file
from .base import OpenedSource, SourceOptions
from .lm_eval import MAX_PADDED_BYTES, ChoiceRows, LmEvalKind, LogInfo, counts_shown, size_text, task_from_filename
from .lm_eval_records import MAX_CHOICES, NORMS, LmEvalLogError, Where, normalise, short
from .memory import first_line
from .tables import parquet_file

#: The columns read: name in messages -> (struct column, field, the ``pyarrow.types`` tests its values pass, and what
#: that is in words).
COLUMNS = {"doc.gold_index": ("doc", "gold_index", ("is_integer",), "an integer or a list of integers"),
           "doc.choices": ("doc", "choices", ("is_string", "is_large_string"), "a list of strings"),
           "model_response.logprobs": ("model_response", "logprobs", ("is_floating", "is_integer"),
                                       "a list of numbers")}
#: Rows converted to Python at a time.
BATCH_ROWS = 1024
#: The most bytes the three columns of one row group may hold uncompressed (pyarrow reads a row group's columns at
#: once); lighteval writes row groups of a few thousand rows, kilobytes each.
MAX_ROW_GROUP_BYTES = 256 << 20
#: ``rows_incomplete`` keys, as messages say them: several gold indices; a log-probability count not the choice count.
INCOMPLETE = {"several_targets": "with several gold indices",
              "logprobs_count": "without one log-probability per choice"}


class LightevalDetailsError(LmEvalLogError):
    """Bad input in a details file: one line naming the file (and the row, counted from 1, where it applies)."""


def is_lighteval_details(path: str | os.PathLike[str]) -> bool:
    """True for ``details_*.parquet`` (the suffix in any case)."""
    name = Path(path).name
    return name.startswith("details_") and name.lower().endswith(".parquet")


@dataclass
class DetailsInfo(LogInfo):
    """What was read from one details file: its rows (the choice counts are the complete ones') and the rows left out
    by reason."""

    rows: int = 0  # every row of the file
    gold_forms: dict[str, int] = field(default_factory=dict)  # "index" (an integer) / "list"
    incomplete: dict[str, int] = field(default_factory=lambda: dict.fromkeys(INCOMPLETE, 0))
    first_incomplete: int | None = None  # the first incomplete row, counted from 1

    def leave_out(self, reason: str, row: int) -> None:
        self.incomplete[reason] += 1
        if self.first_incomplete is None:
            self.first_incomplete = row

    def warnings(self) -> list[str]:
        """One line when rows were left out."""
        left = sum(self.incomplete.values())
        if not left:
            return []
        return [f"{self.path}: {left} of {self.rows} rows left out as incomplete ({_counts(self.incomplete)}; the "
                f"first is row {self.first_incomplete})"]


def _check_columns(path: Path, parquet: Any) -> None:
    """The three columns exist with the types lighteval writes; a missing one is named."""
    pa = require("pyarrow", "logs", needed_for=f"{path}: reading a lighteval details file")
    schema = parquet.schema_arrow
    for name, (top, child, tests, expected) in COLUMNS.items():
        struct = schema.field(top).type if top in schema.names else None
        if struct is None or not pa.types.is_struct(struct) or struct.get_field_index(child) < 0:
            raise LightevalDetailsError(f"{path}: no column '{name}'; a lighteval details file of a log-likelihood "
                                        f"task has {', '.join(COLUMNS)} (written by lighteval --save-details)")
        kind = struct.field(child).type
        listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        inner = kind.value_type if listed else kind
        if not ((listed or name == "doc.gold_index") and any(getattr(pa.types, test)(inner)
                                                            for test in (*tests, "is_null"))):
            raise LightevalDetailsError(f"{path}: column '{name}' is {kind}; expected {expected}")


def _check_row_groups(path: Path, parquet: Any) -> None:
    """Refuse a row group whose three columns are larger than :data:`MAX_ROW_GROUP_BYTES` uncompressed."""
    meta = parquet.metadata
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        size = sum(group.column(c).total_uncompressed_size for c in range(group.num_columns)
                   # a leaf column of COLUMNS: doc.choices.list.element
                   if f"{group.column(c).path_in_schema}.".startswith(tuple(f"{name}." for name in COLUMNS)))
        if size > MAX_ROW_GROUP_BYTES:
            raise LightevalDetailsError(f"{path}: row group {g} holds {size_text(size)} of {', '.join(COLUMNS)}; "
                                        f"tempcal reads row groups of at most {size_text(MAX_ROW_GROUP_BYTES)} "
                                        "(lighteval writes a few kilobytes per row)")


def _batches(path: Path, parquet: Any) -> Any:
    """Per batch of rows: the gold indices, choices and log-probabilities as Python lists."""
    try:
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=list(COLUMNS)):
            doc, response = batch.column("doc"), batch.column("model_response")
            yield (doc.field("gold_index").to_pylist(), doc.field("choices").to_pylist(),
                   response.field("logprobs").to_pylist())
    except Exception as exc:  # a damaged page or row group
        raise LightevalDetailsError(f"{path}: cannot read its rows ({first_line(exc)})") from None


def read_details(path: str | os.PathLike[str], norm: str = "none") -> tuple[ChoiceRows, DetailsInfo]:
    """One file's complete rows (flat, as :func:`.lm_eval.pad_rows` takes them) and what was read."""
    path = Path(path)
    if norm not in NORMS:
        raise TempcalError(f"{param('lm_eval_norm')} {norm}: expected one of {', '.join(NORMS)}")
    check_regular_file(path)
    with parquet_file(path, f"{path}: reading a lighteval details file", LightevalDetailsError) as parquet:
        _check_columns(path, parquet)
        _check_row_groups(path, parquet)
        rows, info = _read_rows(path, parquet, norm)
    if not info.rows:
        raise LightevalDetailsError(f"{path}: no rows")
    return rows, info


def _read_rows(path: Path, parquet: Any, norm: str) -> tuple[ChoiceRows, DetailsInfo]:
    info = DetailsInfo(path=str(path), task=task_from_filename(path, "details_", (".parquet",)), norm=norm)
    rows = ChoiceRows()
    for golds, choices, logprobs in _batches(path, parquet):
        for gold, texts, values in zip(golds, choices, logprobs, strict=True):
            info.rows += 1
            where = Where(str(path), info.rows, "row", LightevalDetailsError)
            row = _row(gold, texts, values, norm, where, info)
            if row is None:
                continue
            rows.add(*row)
            info.choice_counts[len(row[0])] = info.choice_counts.get(len(row[0]), 0) + 1
            if info.records * info.max_choices * 8 > MAX_PADDED_BYTES:
                raise where.error(f"{info.records:,} rows padded to {info.max_choices:,} choices would pass "
                                  f"{size_text(MAX_PADDED_BYTES)}, tempcal's limit on a SOURCE's padded rows")
    return rows, info


def _row(gold: Any, texts: Any, values: Any, norm: str, where: Where, info: DetailsInfo
         ) -> tuple[list[float], int] | None:
    """A row's (normalised) log-probabilities and label; None (counted) for an incomplete row."""
    if texts is None or len(texts) < 2:
        raise where.error(f"doc.choices holds {0 if texts is None else len(texts)} choices; a multiple-choice "
                          "row has at least two (a softmax over one choice carries no calibration)")
    k = len(texts)
    if k > MAX_CHOICES:
        raise where.error(f"{k:,} choices; tempcal reads rows of at most {MAX_CHOICES:,} choices")
    label = _gold(gold, k, where, info)
    if label is None:
        return None
    if values is None or len(values) != k:
        info.leave_out("logprobs_count", where.line)
        return None
    for i, value in enumerate(values):
        if value is None or math.isnan(value) or value == math.inf:
            raise where.error(f"model_response.logprobs[{i}] is {value}; expected a finite number or -inf")
    if values[label] == -math.inf:
        raise where.error(f"the gold choice ({label}) has log-probability -inf: its NLL would be infinite")
    return normalise([float(v) for v in values], [str(t).lstrip() for t in texts], norm, where), label


def _gold(gold: Any, k: int, where: Where, info: DetailsInfo) -> int | None:
    """The gold index (an integer or a one-element list); several are counted as incomplete (None)."""
    form = "list" if isinstance(gold, list) else "index"
    listed = gold if isinstance(gold, list) else [gold]
    if any(g is None for g in listed):
        raise where.error(f"doc.gold_index is {short(gold)}: missing")
    if not listed:
        raise where.error("doc.gold_index [] names no choice")
    bad = next((g for g in listed if not 0 <= g < k), None)
    if bad is not None:
        raise where.error(f"doc.gold_index {short(gold)} names no choice of the {k} in doc.choices")
    info.gold_forms[form] = info.gold_forms.get(form, 0) + 1
    if len(listed) > 1:
        info.leave_out("several_targets", where.line)
        return None
    return int(listed[0])


class LightevalKind(LmEvalKind):
    """lighteval details files; T and the normalisation are kept as for lm-eval logs (the sidecar)."""

    name = "lighteval"
    title = "lighteval details"

    def claims(self, paths: list[Path], options: SourceOptions) -> bool:
        return is_lighteval_details(paths[0])

    def open(self, paths: list[Path], options: SourceOptions, *, labels_optional: bool = False) -> OpenedSource:
        self.refuse_probs(options, f"{paths[0]} is a lighteval details file of log-probabilities")
        read = [read_details(path, options.lm_eval_norm) for path in paths]
        for _, info in read:
            if not info.records:
                raise LightevalDetailsError(f"{info.path}: none of its {info.rows} rows is complete "
                                            f"({_counts(info.incomplete)}); a details file of a log-likelihood "
                                            "multiple-choice task holds one gold index and one log-probability "
                                            "per choice")
        width = max(info.max_choices for _, info in read)
        rows = sum(info.records for _, info in read)
        if rows * width * 8 > MAX_PADDED_BYTES:
            raise LightevalDetailsError(f"{paths[0]}: {rows:,} rows of {len(paths)} files padded to {width:,} "
                                        f"choices would pass {size_text(MAX_PADDED_BYTES)}")
        incomplete = {reason: sum(info.incomplete[reason] for _, info in read) for reason in INCOMPLETE}
        return self.padded(paths, options, read, {"source_kind": self.name, "rows_incomplete": incomplete})

    def describe_details(self, paths: list[Path], options: SourceOptions) -> Any:
        """Per file: its task, rows, complete rows (``records``, as for lm-eval logs) and their choice counts, the
        rows left out by reason, and the gold index's forms (an integer or a list)."""
        infos = [read_details(path, options.lm_eval_norm)[1] for path in paths]
        return [{"file": info.path, "task": info.task, "rows": info.rows, "records": info.records,
                 "rows_incomplete": dict(info.incomplete), "choice_counts": counts_shown(info.choice_counts),
                 "gold_index": info.gold_forms} for info in infos]


def _counts(incomplete: dict[str, int]) -> str:
    """``2 with several gold indices, 1 without one log-probability per choice`` (reasons with rows only)."""
    return ", ".join(f"{n} {INCOMPLETE[reason]}" for reason, n in incomplete.items() if n) or "no rows"


__all__ = ["LightevalDetailsError", "LightevalKind", "is_lighteval_details", "read_details"]
