"""lm-evaluation-harness sample logs (``samples_<task>_<date>.jsonl[.gz]``) as SOURCE: row i is record i's choices'
log-likelihoods padded with ``-inf``; T in the sidecar with the ``--lm-eval-norm`` it was fitted under."""

from __future__ import annotations

import gzip
import os
import re
import zlib
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import DataError, StoredNote, TempcalError, param
from ..io.paths import sidecar_path
from ..io.sidecar import check_regular_file, sidecar_state
from .base import TASK, OpenedSource, RowGroups, SourceKind, SourceOptions, file_groups
from .bounded_lines import BoundedLines, OverLimit
from .lm_eval_records import (
    NORM_KEY,
    NORM_METRIC,
    NORMS,
    LmEvalLogError,
    ParsedRecord,
    Where,
    decode_line,
    load_record,
    parse_record,
    short,
)

if TYPE_CHECKING:
    import torch

LOG_SUFFIXES = (".jsonl", ".jsonl.gz")
#: The longest line read, and the most whitespace in a row between records (see :mod:`.bounded_lines`).
#: Records are kilobytes; one around an 8 MB context (about 2M tokens), held in ``doc`` and once per choice
#: in ``arguments``, is about 40 MB for 4 choices.
MAX_LINE_BYTES = 64 << 20
#: The largest padded matrix (records x the most choices x 8 bytes) a SOURCE of logs is read into.
MAX_PADDED_BYTES = 1 << 30
GZIP_MAGIC = b"\x1f\x8b"
#: ``<task>_<date>`` with lm-eval's (and lighteval's) ``datetime.now().isoformat().replace(":", "-")`` date.
_TASK_WITH_DATE = re.compile(r"^(?P<task>.+?)_\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?$")


def is_lm_eval_log(path: str | os.PathLike[str]) -> bool:
    """True for a name ending in ``.jsonl`` or ``.jsonl.gz`` (any case; the ``samples_`` prefix is not needed)."""
    return Path(path).name.lower().endswith(LOG_SUFFIXES)


def task_from_filename(path: str | os.PathLike[str], prefix: str = "samples_",
                       suffixes: tuple[str, ...] = LOG_SUFFIXES) -> str | None:
    """The task of ``samples_<task>_<date>.jsonl[.gz]`` (``samples_<task>.jsonl`` too), else None; lighteval's
    ``details_<task>_<date>.parquet`` with its ``prefix`` and ``suffixes``."""
    name = Path(path).name
    suffix = next((s for s in suffixes if name.lower().endswith(s)), None)
    if suffix is None or not name.startswith(prefix):
        return None
    stem = name[len(prefix): -len(suffix)]
    match = _TASK_WITH_DATE.match(stem)
    return match.group("task") if match else stem or None


@dataclass
class LogInfo:
    """What was read from one evaluation log: its task (from its name; None when the name does not follow the
    tool's), the normalisation, and how many rows have each number of choices."""

    path: str
    task: str | None
    norm: str
    choice_counts: dict[int, int] = field(default_factory=dict)

    @property
    def max_choices(self) -> int:
        return max(self.choice_counts, default=0)

    @property
    def records(self) -> int:
        """The rows read (of a lighteval file: its complete rows)."""
        return sum(self.choice_counts.values())


@dataclass
class LmEvalLogInfo(LogInfo):
    """What was read from one lm-eval log: counts, the forms met, and lm-eval's own metric as a check."""

    filter: str | None = None  # the lm-eval filter of every record ("none" for multiple choice)
    arguments_forms: dict[str, int] = field(default_factory=dict)  # "gen_args" (lm-eval >= 0.4.3) / "pairs"
    targets: dict[str, int] = field(default_factory=dict)  # "index" / "text" / "acc"
    check_agree: int = 0  # records whose acc / acc_norm / acc_bytes equals (argmax of the row == label)
    check_disagree: int = 0
    first_disagree_line: int | None = None
    widest_line: int | None = None  # the first record with the most choices

    @property
    def check_metric(self) -> str:
        return NORM_METRIC[self.norm]

    def add(self, row: ParsedRecord, line: int) -> None:
        """Count one record."""
        k = len(row.logits)
        if k > self.max_choices:
            self.widest_line = line
        self.choice_counts[k] = self.choice_counts.get(k, 0) + 1
        self.arguments_forms[row.arguments_form] = self.arguments_forms.get(row.arguments_form, 0) + 1
        self.targets[row.target_kind] = self.targets.get(row.target_kind, 0) + 1
        if row.check_agrees is True:
            self.check_agree += 1
        elif row.check_agrees is False:
            self.check_disagree += 1
            if self.first_disagree_line is None:
                self.first_disagree_line = line

    def warnings(self) -> list[str]:
        """A warning when lm-eval's own metric disagrees with the arg-max of some rows read."""
        if not self.check_disagree:
            return []
        return [f"{self.path}: {self.check_disagree} of {self.check_agree + self.check_disagree} records have a "
                f"'{self.check_metric}' that disagrees with the arg-max of the log-likelihoods read (first on line "
                f"{self.first_disagree_line}); the choice texts may not be the ones lm-eval scored"]


@dataclass
class ChoiceRows:
    """Rows of choices, kept compact (a flat float64 array and counts) until they are padded (:func:`pad_rows`)."""

    values: array = field(default_factory=lambda: array("d"))
    counts: array = field(default_factory=lambda: array("q"))
    labels: array = field(default_factory=lambda: array("q"))

    def add(self, logits: list[float], label: int) -> None:
        self.values.extend(logits)
        self.counts.append(len(logits))
        self.labels.append(label)


def read_lm_eval_log(path: str | os.PathLike[str], norm: str = "none"
                     ) -> tuple[torch.Tensor, torch.Tensor, LmEvalLogInfo]:
    """Logits ``float64 [N, Cmax]`` (padded with -inf), labels ``int64 [N]`` and what was read, from one log."""
    rows, info = _read_rows(Path(path), norm)
    return (*pad_rows([rows]), info)


def _read_rows(path: Path, norm: str) -> tuple[ChoiceRows, LmEvalLogInfo]:
    if norm not in NORMS:
        raise TempcalError(f"{param('lm_eval_norm')} {norm}: expected one of {', '.join(NORMS)}")
    name = str(path)
    info = LmEvalLogInfo(path=name, task=task_from_filename(path), norm=norm)
    rows = ChoiceRows()
    filter_seen: tuple[Any, int] | None = None
    doc_lines: dict[Any, int] = {}
    for line, data in _lines(path):
        where = Where(name, line)
        text = decode_line(data, where)
        if not text.strip():
            continue
        record = load_record(text, data, where)
        row = parse_record(record, norm, where)
        flt = record.get("filter")
        if filter_seen is None:
            filter_seen = (flt, line)
        elif flt != filter_seen[0]:  # lm-eval writes one record per document and filter: a mix repeats rows
            raise where.error(f"filter {short(flt)} differs from {short(filter_seen[0])} on line {filter_seen[1]}; "
                              "a sample log for tempcal holds the records of one filter")
        doc_id = record.get("doc_id")
        if isinstance(doc_id, (int, str)) and not isinstance(doc_id, bool):
            first = doc_lines.setdefault(doc_id, line)
            if first != line:
                raise where.error(f"doc_id {short(doc_id)} appears again (first on line {first}); a sample log "
                                  "holds each document once")
        rows.add(row.logits, row.label)
        info.add(row, line)
        _check_padded_size(info, where)
    if not info.records:
        raise LmEvalLogError(f"{name}: no records (an empty file); expected one lm-eval sample record per line")
    info.filter = filter_seen[0] if filter_seen else None
    return rows, info


def _check_padded_size(info: LmEvalLogInfo, where: Where) -> None:
    """Refuse, at the record that passes it, a log whose padded matrix would exceed :data:`MAX_PADDED_BYTES`."""
    rows, width = info.records, info.max_choices
    if rows * width * 8 > MAX_PADDED_BYTES:
        widest = "its" if info.widest_line == where.line else f"line {info.widest_line}'s"
        raise where.error(f"{rows:,} records padded to {widest} {width:,} choices would be {_matrix(rows, width)}")


def _check_combined_size(infos: list[LmEvalLogInfo]) -> None:
    """Refuse several logs whose rows, padded to the widest log's choices, exceed :data:`MAX_PADDED_BYTES`."""
    rows, widest = sum(info.records for info in infos), max(infos, key=lambda info: info.max_choices)
    if rows * widest.max_choices * 8 > MAX_PADDED_BYTES:
        raise LmEvalLogError(f"{widest.path}: line {widest.widest_line}: its {widest.max_choices:,} choices pad the "
                             f"{rows:,} records of {len(infos)} logs to {_matrix(rows, widest.max_choices)}")


def _matrix(rows: int, width: int) -> str:
    return (f"a {size_text(rows * width * 8)} matrix of float64 log-likelihoods; tempcal pads the rows of a SOURCE "
            f"to at most {size_text(MAX_PADDED_BYTES)} (multiple-choice records hold a few choices, not thousands)")


def pad_rows(parts: list[ChoiceRows]) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of every part, one after the other, padded with -inf to the most choices."""
    import numpy as np
    import torch

    counts = np.concatenate([np.frombuffer(p.counts, dtype=np.int64) for p in parts])
    values = np.concatenate([np.frombuffer(p.values, dtype=np.float64) for p in parts])
    logits = np.full((len(counts), int(counts.max())), -np.inf, dtype=np.float64)
    logits[np.arange(logits.shape[1])[None, :] < counts[:, None]] = values  # row-major: each row's values, in order
    labels = np.concatenate([np.frombuffer(p.labels, dtype=np.int64) for p in parts])
    return torch.from_numpy(logits), torch.from_numpy(labels.copy())


def padded_source(kind: SourceKind, paths: list[Path], parts: list[ChoiceRows], options: SourceOptions,
                  **fields: Any) -> OpenedSource:
    """The rows of ``parts`` padded with -inf (:func:`pad_rows`), opened as ``kind`` with the T stored for them."""
    from ..core.data import as_logits_data

    data = as_logits_data(*pad_rows(parts), ignore_index=None)
    return kind.with_stored(OpenedSource(paths, data, None, kind, options, **fields))


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Each line with content, numbered from 1, at most :data:`MAX_LINE_BYTES` long; gzip by suffix."""
    check_regular_file(path)
    try:
        raw = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise LmEvalLogError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with raw:
        compressed = raw.peek(2)[:2] == GZIP_MAGIC
        if path.name.lower().endswith(".gz") and not compressed:
            raise LmEvalLogError(f"{path}: not a gzip file (a .gz name, but no gzip header)")
        if compressed and not path.name.lower().endswith(".gz"):
            raise LmEvalLogError(f"{path}: holds gzip-compressed data; name it {path.name}.gz")
        stream: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw  # type: ignore[assignment]
        lines = BoundedLines(stream, MAX_LINE_BYTES)
        try:
            yield from lines
        except OverLimit as exc:
            raise LmEvalLogError(f"{path}: {_over_limit(exc)}") from None
        except EOFError:
            raise LmEvalLogError(f"{path}: truncated gzip data (the file ends inside the compressed stream, on "
                                 f"line {lines.line})") from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise LmEvalLogError(f"{path}: corrupt gzip data on line {lines.line} ({exc})") from None
        except OSError as exc:
            raise LmEvalLogError(f"{path}: cannot read line {lines.line} ({exc.strerror or exc})") from None


def _over_limit(exc: OverLimit) -> str:
    """The message for a line, or a run of blank lines, longer than the limit."""
    limit = f"{size_text(exc.limit)} (tempcal's limit on a line of an lm-eval log)"
    if not exc.blank:
        return (f"line {exc.line}: longer than {limit}; an lm-eval sample record is kilobytes, so this is not a "
                "sample log (or is damaged)")
    lines = f"line {exc.line}" if exc.first == exc.line else f"lines {exc.first}-{exc.line}"
    return (f"{lines}: more than {limit} of blank lines and whitespace in a row; an lm-eval log holds one record "
            "per line")


def counts_shown(counts: dict[int, int]) -> dict[str, int]:
    """Records per choice count, as the JSON of ``inspect`` shows them: keys as text, in numeric order."""
    return {str(k): v for k, v in sorted(counts.items())}


def size_text(nbytes: int) -> str:
    """A size in bytes as a message shows it: ``64 MiB``, ``1.5 GiB``, ``800 KiB``, ``12 bytes``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.3g} {unit}"
    return f"{nbytes} bytes"


class LmEvalKind(SourceKind):
    """lm-evaluation-harness sample logs; ``norm`` is the normalisation an opened log was read with."""

    name = "lm-eval"
    title = "lm-evaluation-harness sample log"
    shards = True

    def __init__(self, norm: str | None = None) -> None:
        self.norm = norm

    def open(self, paths: list[Path], options: SourceOptions, *, labels_optional: bool = False) -> OpenedSource:
        self.refuse_probs(options, f"{paths[0]} is an lm-evaluation-harness log of log-likelihoods")
        read = [_read_rows(path, options.lm_eval_norm) for path in paths]
        _check_combined_size([info for _, info in read])
        return self.padded(paths, options, read)

    def padded(self, paths: list[Path], options: SourceOptions, read: list[tuple[ChoiceRows, Any]],
               json: dict[str, Any] | None = None) -> OpenedSource:
        """Each file's rows (``read``: the rows and what was read, whose ``warnings()`` are kept) padded with -inf to
        the most choices, opened as this kind under ``options.lm_eval_norm`` with the T stored for them."""
        tasks = [info.task or Path(info.path).name for _, info in read]
        return padded_source(type(self)(options.lm_eval_norm), paths, [rows for rows, _ in read], options,
                             warnings=[message for _, info in read for message in info.warnings()],
                             file_rows=[info.records for _, info in read], file_names={TASK: tasks}, json=json or {})

    def open_related(self, opened: OpenedSource, other: Any, *, labels_optional: bool = False) -> OpenedSource:
        """Another log (``--eval``, ``--ood``) with fewer choices is padded to SOURCE's width (-inf: probability 0)."""
        from ..core.data import LogitsData

        related = super().open_related(opened, other, labels_optional=labels_optional)
        width, data = opened.data.num_classes, related.data
        if isinstance(related.kind, LmEvalKind) and isinstance(data, LogitsData) and data.num_classes < width:
            import torch

            pad = torch.full((data.num_samples, width - data.num_classes), float("-inf"), dtype=data.dtype)
            related.data = LogitsData(torch.cat([data.logits, pad], dim=1), data.labels, data.index)
        return related

    def describe_details(self, paths: list[Path], options: SourceOptions) -> Any:
        """Per log: its task, records, choice counts, filter and the forms of its arguments and targets."""
        infos = [_read_rows(path, options.lm_eval_norm)[1] for path in paths]
        return [{"file": info.path, "task": info.task, "records": info.records,
                 "choice_counts": counts_shown(info.choice_counts), "filter": info.filter,
                 "arguments_forms": info.arguments_forms, "targets": info.targets} for info in infos]

    def read_groups(self, opened: OpenedSource, key: str, option: str) -> RowGroups:
        """One group per log file, named by its task."""
        if key != TASK:
            raise TempcalError(f"{opened.name}: {self.title} files hold no tensors; {option} "
                               f"{TASK} groups their rows by each file's task")
        tasks = opened.file_names[TASK]
        if len(set(tasks)) < len(tasks):
            seen = next(t for t in tasks if tasks.count(t) > 1)
            raise DataError(f"{opened.name}: two logs of task '{seen}'; {option} {TASK} takes one log per task")
        return file_groups(opened, key)

    def read_temperature(self, path: Path) -> tuple[float | None, list[str]]:
        """The sidecar's T, unless it was fitted under another ``--lm-eval-norm`` than this log is read with."""
        stored, notes = super().read_temperature(path)
        fitted_norm = self._other_norm(self.stored_metadata(path))
        if stored is not None and fitted_norm is not None:
            flag = param("lm_eval_norm")
            notes.append(StoredNote(f"{sidecar_path(path)}: its temperature {stored!r} was fitted with {flag} "
                                    f"{fitted_norm}, so it is ignored here ({flag} {self.norm}); pass {flag} "
                                    f"{fitted_norm}, or fit again"))
            stored = None
        return stored, notes

    def temperature_place(self, path: Path) -> str:
        """The sidecar, and the normalisation its T was fitted under when that is not this run's."""
        state = sidecar_state(path)
        fitted_norm = self._other_norm(state.metadata)
        if state.state == "fresh" and fitted_norm is not None:
            flag = param("lm_eval_norm")
            return (f"the T in its sidecar {state.path} was fitted with {flag} {fitted_norm}, not {flag} "
                    f"{self.norm}: pass {flag} {fitted_norm}, or fit again")
        return super().temperature_place(path)

    def _other_norm(self, metadata: Mapping[str, str]) -> str | None:
        """The normalisation a stored T was fitted under, when it is not the one this log is read with."""
        fitted = metadata.get(NORM_KEY)
        return fitted if self.norm is not None and fitted not in (None, self.norm) else None

    def write_reading(self, path: Path, temperature: float, output: str | Path | None,
                      metadata: Mapping[str, str | None]) -> Path:
        """T, ``metadata`` and the normalisation T was fitted under, into the sidecar (of a copy at ``output``)."""
        return super().write_reading(path, temperature, output, {**metadata, NORM_KEY: self.norm})


__all__ = ["NORM_KEY", "LmEvalKind", "LmEvalLogError", "is_lm_eval_log", "read_lm_eval_log", "task_from_filename"]
