"""What every kind of SOURCE gives the rest of tempcal (:class:`OpenedSource`: its logits and the T stored with them)
and what a new kind implements (:class:`SourceKind`); :mod:`tempcal.sources.registry` picks the kind."""

from __future__ import annotations

import json
import numbers
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import IGNORE_INDEX, READING_KEYS, DataError, TempcalError, param
from ..io.paths import check_named_once, expand
from .stored_groups import GROUP_KEY, GROUP_TEMPERATURES, MAX_GROUPS

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ..core.data import LogitsSource
    from ..errors import ProbabilitiesError
    from .described import Findings


@dataclass(frozen=True)
class SourceOptions:
    """How to read a SOURCE, one object for every kind (tensor names, probabilities, ignored labels, model inputs, ...),
    so a command opens its SOURCE, ``--eval`` and OOD files the same way; kinds read the fields they need."""

    logits_key: str = "logits"
    labels_key: str = "labels"
    #: True: the logits tensor holds probabilities (read as log p); False: logits, whatever they look like;
    #: None: as the stored T was fitted (``tempcal.probs``), and values that look like probabilities are refused.
    probs: bool | None = None
    ignore_index: int | None = IGNORE_INDEX
    # A model SOURCE: the inputs it runs over, and how.
    inputs: str | None = None
    inputs_key: str = "inputs"
    batch_size: int = 512
    output_key: str | int | None = None
    device: str = "auto"
    progress: Any = False  # True, False, or a rich Console for the model's progress bar
    # Hidden states and an output head: the head's file or folder, and the tensor names.
    head: str | None = None
    hidden_key: str = "hidden"
    head_weight_key: str = "weight"
    head_bias_key: str = "bias"
    softcap: float | None = None
    # An lm-evaluation-harness sample log: how each choice's log-likelihood is normalised (none, chars, bytes).
    lm_eval_norm: str = "none"
    # ReAct: clip hidden-state values at this percentile of the SOURCE's values before the head (with head only).
    react: float | None = None
    # A causal language model run over text files (``--lm``): SOURCE is then a text file (.txt or .jsonl).
    lm: str | None = None
    text_field: str = "text"
    max_length: int | None = None  # tokens per text (None: the model's limit)
    batch_tokens: int | None = None  # padded tokens per batch (None: by device)
    device_map: str | None = None  # passed to transformers (a model larger than one GPU)
    spill_dir: str | None = None  # where hidden states too large for memory go
    # The --group-by key the rows will be grouped by: a kind may need one (inspect_ai logs of several models).
    group_by: str | None = None
    # A confidence table (.csv, .jsonl, .parquet): the columns of the confidence and of whether the answer was right,
    # and what a confidence of 1 is written as (100: percentages).
    confidence: str | None = None
    correct: str | None = None
    confidence_scale: float = 1.0
    #: The remembered options (:data:`DEFAULT_KEYS`) named on the command line: they win over the reading stored with
    #: T even at their default value (any value other than the default wins in any case).
    given: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.react is not None:
            react = self.react
            if isinstance(react, bool) or not isinstance(react, numbers.Real) or not 0 < float(react) <= 100:
                raise TempcalError(f"{param('react')} {react}: expected a percentile P with 0 < P <= 100")
            if self.head is None and self.lm is None:
                raise TempcalError(f"{param('react')} clips hidden states before the output head: it needs "
                                   f"{param('head')}")

    def but(self, **changes: Any) -> SourceOptions:
        """A copy with ``changes``."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Keep:
    """What a fit asks to keep with its T; each kind reads what concerns it (see :meth:`OpenedSource.keep`)."""

    store: bool = True  # False (``--no-write``): no T is written (a model's logits still are, without it)
    output: str | Path | None = None  # a copy (a record) written instead of SOURCE's own place
    metadata: Mapping[str, str | None] = field(default_factory=dict)  # more kept beside T (the fitted split)
    group_key: str | None = None  # per-group temperatures (``--group-by KEY``)
    group_temperatures: Mapping[str, float] | None = None
    save_model: str | None = None  # a model: written calibrated here
    save_logits: str | None = None  # a model: its logits kept as a logits file
    generation: bool = False  # a language model: T as generation_config.json's temperature too
    save_hidden: str | None = None  # a language model: its hidden states kept as a SOURCE for --head
    settings: Mapping[str, Any] | None = None  # a language model's record: how the command was run
    results: Mapping[str, Any] | None = None  # ... and the figures it found


@dataclass
class Kept:
    """What :meth:`OpenedSource.keep` wrote: the files that now hold T, and the lines saying what was written."""

    paths: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def wrote_lines(temperature: float, paths: list[str], ask: Keep) -> list[str]:
    """The lines naming what was stored where: T, and the groups' temperatures (nothing when nothing was)."""
    if not paths:
        return []
    lines = [f"wrote tempcal.temperature = {temperature!r} into {', '.join(paths)}"]
    if ask.group_temperatures is not None:
        lines.append(f"wrote the temperatures of {len(ask.group_temperatures)} groups (tempcal.group_temperatures, "
                     f"by {ask.group_key}) into {', '.join(paths)}")
    return lines


@dataclass
class OpenedSource:
    """One opened SOURCE: ``paths`` (the files T is written back into; none for a model), its logits as a chunked
    source, and the T stored with it; ``has_labels`` is False for an OOD set read with placeholder labels."""

    paths: list[Path]
    data: LogitsSource
    stored: float | None
    kind: SourceKind
    options: SourceOptions
    warnings: list[str] = field(default_factory=list)
    has_labels: bool = True
    label: str | None = None  # how reports name it, when not by its files
    #: Why the stored T could not be read (a broken sidecar): raised when it is asked for, so a fit can replace it.
    stored_problem: TempcalError | None = None
    #: The stored T was fitted on log-probabilities (``tempcal.probs = "true"`` beside it).
    stored_probs: bool = False
    #: Rows each of ``paths`` gave, in order, and each one's name in the groupings by file its kind offers (an
    #: evaluation log's ``task``, inspect_ai's ``model`` too), when known.
    file_rows: list[int] = field(default_factory=list)
    file_names: dict[str, list[str]] = field(default_factory=dict)
    #: Keys the kind adds to every command's JSON (``source_kind``, ``rows_incomplete``).
    json: dict[str, Any] = field(default_factory=dict)

    @property
    def stored_temperature(self) -> float | None:
        """The T stored with this SOURCE by an earlier fit (None when there is none)."""
        if self.stored_problem is not None:
            raise self.stored_problem
        return self.stored

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        more = f" (+{len(self.paths) - 1} more shards)" if len(self.paths) > 1 else ""
        return f"{self.paths[0]}{more}"

    def open_related(self, other: Any, *, labels_optional: bool = False) -> OpenedSource:
        """Another file (or files) read the way this SOURCE is: an ``--eval`` or OOD set of the same model or
        format. An already opened source is returned as it is."""
        if isinstance(other, OpenedSource):
            return other
        return self.kind.open_related(self, other, labels_optional=labels_optional)

    def keep(self, temperature: float, ask: Keep) -> Kept:
        """Keep a fitted T where this kind keeps it, with what ``ask`` says to keep beside it (by default in each of
        SOURCE's files, or a copy at ``ask.output``, with how it was read and the groups' temperatures)."""
        if not ask.store:
            return Kept()
        extra = {**group_metadata(ask.group_key, ask.group_temperatures), **ask.metadata}
        paths = [str(p) for p in self.write_temperature(temperature, ask.output, extra)]
        return Kept(paths, wrote_lines(temperature, paths, ask))

    def write_temperature(self, temperature: float, output: str | Path | None = None,
                          extra: Mapping[str, str | None] | None = None) -> list[Path]:
        """Store T with this SOURCE (or in a copy at ``output``), with how it was read (probabilities, and the names,
        columns and scale not at their defaults) and ``extra`` metadata (None values remove keys); the paths written."""
        if output is not None and len(self.paths) > 1:
            raise TempcalError(f"{param('output')} takes a single SOURCE file; shards get T written into each of them")
        values = {"probs": "true" if self.options.probs else None}
        for name, default in DEFAULT_KEYS.items():
            value = getattr(self.options, name)
            values[name] = None if value == default else value if isinstance(value, str) else repr(float(value))
        reading = {READING_KEYS[name]: value for name, value in values.items() if name in self.kind.remembered}
        return [self.kind.write_reading(path, temperature, output, {**reading, **(extra or {})}) for path in self.paths]

    def temperature_place(self) -> str:
        """Where this SOURCE's T would be stored, for a message saying none is."""
        if self.paths:
            return self.kind.temperature_place(self.paths[0])
        return f"not a calibrated model: write one with tempcal fit {param('save_model')} PATH"

    def share(self) -> tuple[int, int]:
        """The rows ``[start, stop)`` this process reduces: all of them, or its rank's share under torch.distributed."""
        from ..core import parallel

        return parallel.share(self.data.num_samples)

    def local_rows(self, rows: Any) -> torch.Tensor:
        """Global row positions ``rows`` that fall in this process's share, relative to its start."""
        import torch

        start, stop = self.share()
        rows = torch.as_tensor(rows, dtype=torch.int64)
        return rows[(rows >= start) & (rows < stop)] - start


#: The tensor names a SOURCE is read with unless told otherwise, and a confidence table's columns and scale.
DEFAULT_KEYS: dict[str, Any] = {"logits_key": SourceOptions.logits_key, "labels_key": SourceOptions.labels_key,
                                "confidence": SourceOptions.confidence, "correct": SourceOptions.correct,
                                "confidence_scale": SourceOptions.confidence_scale}


def expand_sources(sources: Sequence[str | os.PathLike]) -> list[Path]:
    """Paths, with glob patterns expanded in sorted order (:func:`tempcal.io.paths.expand`: a path that exists is
    itself, ``[`` and all); a pattern that matches nothing is an error; the same file named twice is refused."""
    paths = [Path(p) for p in expand(sources, strict=True)]
    check_named_once(paths)
    return paths


# -- groups of rows (--group-by KEY), whatever the kind: names and checks, and the groups' T kept beside T ---------
#: The group key of lm-evaluation-harness logs: one group per log file.
TASK = "task"


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
        import numpy as np

        return np.bincount(self.index, minlength=self.count).astype(np.int64).tolist()


def named(key: str, values: np.ndarray, opened: OpenedSource, option: str, *, numeric: bool = True) -> RowGroups:
    """``opened``'s groups by ``values``, one per counted row: sorted distinct values as names (integers, or strings
    when not ``numeric``) and each row's index into them; more than MAX_GROUPS refused."""
    import numpy as np

    distinct, index = np.unique(values, return_inverse=True)
    if len(distinct) > MAX_GROUPS:
        raise DataError(f"{opened.name}: {option} {key} makes {len(distinct):,} groups; at most "
                        f"{MAX_GROUPS:,} are allowed")
    if index.size != opened.data.num_samples:
        raise DataError(f"{opened.name}: '{key}' ({option}) gives {index.size} values for {opened.data.num_samples} "
                        "rows")
    names = [str(int(v)) if numeric else str(v) for v in distinct]
    return RowGroups(key, names, index.reshape(-1).astype(np.int64), numeric=numeric)


def file_groups(opened: OpenedSource, key: str) -> RowGroups:
    """One group per name ``opened.file_names[key]`` gives a file (an evaluation log's task or model), each file's
    rows in its name's group."""
    import numpy as np

    names_of = opened.file_names[key]
    names = sorted(set(names_of))
    index = np.repeat(np.array([names.index(name) for name in names_of], dtype=np.int64), opened.file_rows)
    return RowGroups(key, names, index, numeric=False)


def checked(path: Path, key: str, tensor: torch.Tensor, labels_shape: Any, option: str) -> np.ndarray:
    """``tensor`` as flat int64 values, after checking its dtype and that its shape is the labels'."""
    import torch

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
    import torch

    inner = getattr(data, "hidden", data)
    for name in ("rows", "index"):
        rows = getattr(inner, name, None)
        if isinstance(rows, torch.Tensor):
            return rows.to(torch.int64).cpu()
    return None


def group_metadata(key: str | None, temperatures: Mapping[str, float] | None) -> dict[str, str | None]:
    """The write-back entries for per-group temperatures (None values remove stale ones)."""
    if key is None or temperatures is None:
        return {GROUP_KEY: None, GROUP_TEMPERATURES: None}
    return {GROUP_KEY: key, GROUP_TEMPERATURES: json.dumps({name: float(t) for name, t in temperatures.items()})}


class SourceKind(ABC):
    """One kind of SOURCE. Subclasses override :meth:`open`, and :meth:`claims` unless its registry line (suffixes,
    a folder, an option) says it all."""

    name: str = ""
    #: Whether several files (shards, a glob) make one SOURCE of this kind.
    shards: bool = False
    #: The ``SourceOptions`` fields (of :data:`READING_KEYS`) this kind keeps beside T (:meth:`write_reading`): later
    #: opens without those options read the file the same way.
    remembered: tuple[str, ...] = ()
    #: How ``tempcal inspect`` names this kind (its ``kind_name``; the ``name`` when empty).
    title: str = ""
    #: Whether ``tempcal inspect`` refuses a SOURCE whose first path is missing (a model's is checked by loading it).
    inspect_needs_file: bool = True
    #: Opens a SOURCE of whichever kind claims it: :func:`tempcal.sources.registry.open_source`, set by the registry
    #: as it is imported, so that kinds reach it without importing the registry that imports them.
    open_any: ClassVar[Callable[..., OpenedSource]]

    def claims(self, paths: list[Path], options: SourceOptions) -> bool:
        """Whether ``paths``, which this kind's registry line selected, are a SOURCE of this kind (by default: yes)."""
        return True

    @abstractmethod
    def open(self, paths: list[Path], options: SourceOptions, *, labels_optional: bool = False) -> OpenedSource:
        """Check the files (keys, dtypes, shapes; values are checked by the first scan) and open them."""

    def open_related(self, opened: OpenedSource, other: Any, *, labels_optional: bool = False) -> OpenedSource:
        """Another SOURCE beside ``opened`` (``--eval``, ``--ood``): by default a logits file of any kind."""
        return self.open_any(other, opened.options, labels_optional=labels_optional)

    #: A file of logits as they are stored (not computed by a model or a head): ``--probs`` reads its values as log p.
    logits_file = False

    def probabilities_refused(self, opened: OpenedSource) -> ProbabilitiesError:
        """Why values that look like probabilities, read without ``probs``, are refused: a logits file names its tensor
        and ``--probs``; any other kind's values come from a model, which gives logits."""
        from ..errors import AS_LOGITS, ProbabilitiesError, probabilities_refused

        if self.logits_file:
            return probabilities_refused(f"'{opened.options.logits_key}'", f"{opened.name}: ")
        return ProbabilitiesError(f"{opened.name}: every row of its logits looks like a probability vector (values "
                                  f"in [0, 1], each row summing to 1), and probabilities are read only from logits "
                                  f"files; use the model's output before its softmax, or pass {AS_LOGITS} to treat "
                                  "the values as logits")

    #: ``apply`` writes this kind in its own format (:meth:`apply_writer`), not as a tensor file.
    own_apply_format = False

    def apply_writer(self, opened: OpenedSource) -> Callable[[str | Path, Any], str] | None:
        """How ``apply`` writes this kind when not as a tensor file: ``write(output, probabilities of class 1)``
        returning the name written under; None by default."""
        return None

    # -- --group-by KEY: the groups of the counted rows (see tempcal.subsets.options) ---------------------------
    def read_groups(self, opened: OpenedSource, key: str, option: str) -> RowGroups:
        """The groups of ``opened``'s counted rows by the integer tensor ``key`` (:meth:`group_values`), cut to the
        rows that count; ``option`` names where KEY came from in messages."""
        if key == TASK and key not in self.tensor_names(opened):
            raise TempcalError(f"{option} {TASK} groups lm-evaluation-harness logs by their task; "
                               f"{opened.name} has no tensor '{TASK}'")
        values = self.group_values(opened, key, option)
        kept = kept_rows(opened.data)
        if kept is not None and kept.numel() and int(kept.max()) >= values.shape[0]:
            raise DataError(f"{opened.name}: '{key}' ({option}) has {values.shape[0]} values; the data has "
                            f"more rows")
        if kept is not None:
            values = values[kept.numpy()]
        return named(key, values, opened, option)

    def tensor_names(self, opened: OpenedSource) -> set[str]:
        """The tensors SOURCE's header lists, where the format has one (none by default)."""
        return set()

    def group_values(self, opened: OpenedSource, key: str, option: str) -> np.ndarray:
        """The flat integer values of tensor ``key`` over every row of every file, before rows are left out;
        by default this kind has no named tensors."""
        raise TempcalError(f"{opened.name}: {option} reads a named tensor of a .safetensors, .npz or .pt "
                           f"SOURCE (or of a model's inputs file); a {self.name} SOURCE has none")

    # -- what tempcal inspect says of this kind (see tempcal.workflows.inspect and .described) ---------------
    def describe_tensors(self, paths: list[Path], options: SourceOptions) -> list[dict[str, Any]]:
        """Every tensor (array) in SOURCE's files, from their headers where the format has them (none by default)."""
        return []

    def describes_unopened(self, options: SourceOptions) -> bool:
        """Whether inspect describes SOURCE from its files alone, without opening it as the other commands do."""
        return False

    def describe_sidecar(self, path: Path) -> dict[str, Any] | None:
        """The sidecar T is kept in: where, fresh or stale, and why (None for a kind that keeps T elsewhere)."""
        from ..io.sidecar import sidecar_state

        state = sidecar_state(self.sidecar_of(path))
        return {"path": str(state.path), "state": state.state, "detail": state.detail}

    def sidecar_of(self, path: Path) -> Path:
        """The file whose sidecar keeps ``path``'s T: itself by default."""
        return path

    def describe_stored(self, path: Path, opened: OpenedSource | None, sidecar: dict[str, Any] | None,
                        findings: Findings) -> dict[str, Any]:
        """The stored T as the other commands use it, what is recorded whatever its state, where, and how it was
        fitted; by default from the sidecar (recorded even when stale)."""
        from ..io.sidecar import sidecar_state
        from .described import stored_block

        path = self.sidecar_of(path)
        shown = f"{sidecar['path'] if sidecar else path}:"
        return stored_block("sidecar", sidecar_state(path).metadata, shown, shown, opened, findings.problems)

    def describe_details(self, paths: list[Path], options: SourceOptions) -> Any:
        """What else inspect shows of this kind (None by default); an error is kept as a problem."""
        return None

    def describe_hints(self, options: SourceOptions) -> list[str]:
        """What to pass to use a SOURCE of this kind, beyond what every kind is told (none by default)."""
        return []

    def read_temperature(self, path: Path) -> tuple[float | None, list[str]]:
        """The T stored for ``path`` and warnings about it; by default in its sidecar ``FILE.tempcal.json``."""
        from ..io.sidecar import sidecar_temperature

        return sidecar_temperature(self.sidecar_of(path))

    def refuse_probs(self, options: SourceOptions, what: str) -> None:
        """Refuse ``--probs`` for a SOURCE that is not a logits file: ``what`` says what it is instead."""
        if options.probs:
            raise TempcalError(f"{param('probs')} applies to logits files; {what}")

    def with_stored(self, opened: OpenedSource) -> OpenedSource:
        """``opened`` with the T stored for its first file and the notes about it added to its warnings; a broken
        sidecar is kept as its ``stored_problem``, raised if T is asked for (a fit replaces it)."""
        try:
            opened.stored, notes = self.read_temperature(opened.paths[0])
        except TempcalError as exc:
            opened.stored_problem = exc
        else:
            opened.warnings = [*opened.warnings, *notes]
        return opened

    def temperature_place(self, path: Path) -> str:
        """Where this kind keeps ``path``'s T, why none is there and what to do, as "has no stored temperature
        (...)" says it; by default its sidecar."""
        from ..io.sidecar import sidecar_state

        path = self.sidecar_of(path)
        state = sidecar_state(path)
        why = {"none": "there is none: run tempcal fit first",
               "stale": "it was written for a different version of the file, so its T is ignored: run tempcal fit "
                        "again",
               "fresh": "it holds none: run tempcal fit first",
               "broken": "it is not a readable sidecar: fix or delete it, or run tempcal fit again"}[state.state]
        return f"{path.name} has no metadata, so its T is kept in the sidecar {state.path}; {why}"

    def stored_metadata(self, path: Path) -> dict[str, str]:
        """The metadata kept with ``path``'s T (by default its current sidecar's; none when it is missing or broken)."""
        from ..io.sidecar import current_metadata

        return current_metadata(path) if path.is_file() else {}  # opening says what is wrong with the path

    def write_reading(self, path: Path, temperature: float, output: str | Path | None,
                      metadata: Mapping[str, str | None]) -> Path:
        """Store T with ``metadata`` on how the file was read (a None value removes its key), in one write;
        by default in a sidecar. Returns the path written."""
        from ..io.sidecar import write_sidecar, write_sidecar_copy

        if output is None:
            return write_sidecar(path, temperature, updates=metadata)
        return write_sidecar_copy(path, temperature, Path(output), updates=metadata)


__all__ = ["DEFAULT_KEYS", "TASK", "Keep", "Kept", "OpenedSource", "RowGroups", "SourceKind", "SourceOptions",
           "checked", "expand_sources", "file_groups", "group_metadata", "kept_rows", "named", "wrote_lines"]
