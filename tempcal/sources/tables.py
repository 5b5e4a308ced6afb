"""Rows of a table file (``.csv``, ``.jsonl``, ``.parquet``), a few named columns at a time in bounded memory, values
raw (None when missing), and a copy written with one more column; a missing column is a :class:`TableError`."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..io.optional import require
from ..io.paths import atomic_path
from .bounded_lines import BoundedLines, OverLimit
from .memory import first_line

#: The longest JSON Lines row, and the longest CSV field, read.
MAX_LINE_BYTES = 16 << 20
MAX_FIELD_CHARS = 16 << 20
#: Rows per parquet record batch.
BATCH_ROWS = 65_536


class TableError(DataError):
    """Bad input in a table: one line naming the file (and the row, where it applies)."""

    columns: list[str] | None = None  # a missing column: the columns there are


def table_format(path: str | os.PathLike) -> str | None:
    """``csv``, ``jsonl`` or ``parquet`` by ``path``'s suffix (any case), else None."""
    suffix = Path(path).suffix.lower()
    return suffix[1:] if suffix in _FORMATS else None


def missing_columns(path: Path, wanted: Sequence[str], have: Sequence[str], options: Sequence[str]) -> TableError:
    """The error for columns not in the table: which option named which, and the columns there are."""
    absent = [f"'{name}' ({option})" for name, option in zip(wanted, options, strict=True) if name not in have]
    listed = ", ".join(f"'{c}'" for c in have[:50]) + (f" and {len(have) - 50} more" if len(have) > 50 else "")
    error = TableError(f"{path}: no column {', '.join(absent)}; its columns are {listed or 'none'}")
    error.columns = list(have)
    return error


def read_rows(path: Path, wanted: Sequence[str], options: Sequence[str]) -> Iterator[tuple[int, list[Any]]]:
    """``(row number from 1, [value of each wanted column])`` for every data row of the table at ``path`` (a name
    ending in a suffix of :data:`_FORMATS`, as every confidence table's does)."""
    return _FORMATS[path.suffix.lower()][0](path, wanted, options)


def _open_csv(path: Path) -> io.TextIOWrapper:
    csv.field_size_limit(MAX_FIELD_CHARS)
    try:
        return open(path, encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise TableError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _csv_rows(path: Path, wanted: Sequence[str], options: Sequence[str]) -> Iterator[tuple[int, list[Any]]]:
    row = 0
    with _open_csv(path) as f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if header is None:
                raise TableError(f"{path}: empty (no header row)")
            header = [h.strip() for h in header]
            if any(name not in header for name in wanted):
                raise missing_columns(path, wanted, header, options)
            at = [header.index(name) for name in wanted]
            for row, values in enumerate(reader, start=1):
                if not values:  # a blank line
                    continue
                yield row, [values[i] if i < len(values) and values[i].strip() != "" else None for i in at]
        except csv.Error as exc:
            raise TableError(f"{path}: row {row + 1}: not readable as CSV ({exc})") from None
        except UnicodeDecodeError:
            raise TableError(f"{path}: row {row + 1}: not UTF-8 text") from None


def _jsonl_rows(path: Path, wanted: Sequence[str], options: Sequence[str]) -> Iterator[tuple[int, list[Any]]]:
    try:
        raw = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise TableError(f"{path}: cannot read ({exc.strerror or exc})") from None
    row = 0
    with raw:
        try:
            for _, data in BoundedLines(raw, MAX_LINE_BYTES):
                row += 1
                try:
                    record = json.loads(data)
                except (ValueError, RecursionError):
                    raise TableError(f"{path}: row {row}: not a JSON object") from None
                if not isinstance(record, dict):
                    raise TableError(f"{path}: row {row}: not a JSON object")
                if row == 1 and any(name not in record for name in wanted):
                    raise missing_columns(path, wanted, list(record), options)
                yield row, [record.get(name) for name in wanted]
        except OverLimit:
            raise TableError(f"{path}: row {row + 1}: longer than {MAX_LINE_BYTES >> 20} MiB (tempcal's limit on a "
                             "row of a table)") from None


def parquet_file(path: Path, needed_for: str | None = None, error: type[DataError] = TableError) -> Any:
    """The open ``pyarrow.parquet.ParquetFile`` (``needed_for`` says what for when pyarrow is missing); not parquet,
    or unreadable, is an ``error`` naming the file."""
    pq = require("pyarrow.parquet", "logs", needed_for=needed_for or f"reading {path}")
    try:
        return pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises its own ArrowInvalid / OSError on a damaged file
        raise error(f"{path}: not a readable parquet file ({first_line(exc)})") from None


def _parquet_rows(path: Path, wanted: Sequence[str], options: Sequence[str]) -> Iterator[tuple[int, list[Any]]]:
    table = parquet_file(path)
    names = list(table.schema_arrow.names)
    if any(name not in names for name in wanted):
        raise missing_columns(path, wanted, names, options)
    batches = table.iter_batches(batch_size=BATCH_ROWS, columns=list(dict.fromkeys(wanted)))
    rows = (list(values) for batch in batches
            for values in zip(*[batch.column(name).to_pylist() for name in wanted], strict=True))
    yield from enumerate(rows, start=1)


def write_with_column(path: Path, output: Path, column: str, values: Sequence[float]) -> None:
    """Write the table at ``path`` to ``output`` (same format) with ``column`` added: ``values[i]`` on data row i,
    atomically (a temporary file beside ``output``, renamed over it)."""
    with atomic_path(output, what="--output") as temporary:
        _FORMATS[path.suffix.lower()][1](path, temporary, column, values)


def _write_csv(path: Path, temporary: Path, column: str, values: Sequence[float]) -> None:
    with _open_csv(path) as f, open(temporary, "w", encoding="utf-8", newline="") as out:
        reader, writer = csv.reader(f), csv.writer(out)
        writer.writerow([*next(reader), column])
        for row, value in zip((row for row in reader if row), values, strict=True):  # blank lines are no rows
            writer.writerow([*row, repr(float(value))])


def _write_jsonl(path: Path, temporary: Path, column: str, values: Sequence[float]) -> None:
    with open(path, "rb") as raw, open(temporary, "w", encoding="utf-8") as out:
        for (_, data), value in zip(BoundedLines(raw, MAX_LINE_BYTES), values, strict=True):
            record = json.loads(data)
            record[column] = float(value)
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def _write_parquet(path: Path, temporary: Path, column: str, values: Sequence[float]) -> None:
    import pyarrow as pa  # type: ignore[import-untyped]

    table = parquet_file(path)
    pq = require("pyarrow.parquet", "logs", needed_for=f"writing {temporary}")
    schema = table.schema_arrow.append(pa.field(column, pa.float64()))
    start = 0
    with pq.ParquetWriter(temporary, schema) as writer:
        for batch in table.iter_batches(batch_size=BATCH_ROWS):
            added = pa.array(values[start:start + batch.num_rows], type=pa.float64())
            start += batch.num_rows
            writer.write_batch(pa.RecordBatch.from_arrays([*batch.columns, added], schema=schema))


def columns_of(path: Path) -> list[str]:
    """The table's columns: a CSV's header, a JSON Lines table's first row's keys, a parquet file's schema."""
    try:
        next(read_rows(path, ["\x00"], ["-"]), None)
    except TableError as exc:
        if exc.columns is not None:
            return list(exc.columns)
        raise
    return []


#: Per table format's suffix: how its rows are read, and how a copy with one more column is written.
_FORMATS: dict[str, tuple[Callable[..., Iterator[tuple[int, list[Any]]]], Callable[..., None]]] = {
    ".csv": (_csv_rows, _write_csv), ".jsonl": (_jsonl_rows, _write_jsonl), ".parquet": (_parquet_rows, _write_parquet)}


__all__ = ["TableError", "columns_of", "read_rows", "table_format", "write_with_column"]
