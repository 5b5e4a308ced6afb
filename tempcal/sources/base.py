"""What every kind of SOURCE gives the rest of tempcal, and what a new kind implements.

A source kind (a safetensors logits file or its shards, an ``.npz``, a model run over its
inputs, ...) is a :class:`SourceKind`: it says which paths it claims, opens them as an
:class:`OpenedSource` (logits behind the :class:`~tempcal.core.data.LogitsSource` protocol,
the T stored with them, the files T is written back into), and knows where its T is stored.
:func:`tempcal.sources.registry.open_source` picks the kind; nothing else looks at suffixes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TempcalError, param
from ..validation import IGNORE_INDEX

if TYPE_CHECKING:
    import torch

    from ..core.data import LogitsSource


@dataclass(frozen=True)
class SourceOptions:
    """How to read a SOURCE: tensor names, whether it holds probabilities, ignored labels, and model inputs.

    One object carries every kind's options, so a command opens its SOURCE, its ``--eval`` file and
    its OOD files the same way. Kinds read the fields that concern them.
    """

    logits_key: str = "logits"
    labels_key: str = "labels"
    probs: bool = False
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

    def __post_init__(self) -> None:
        if self.react is not None:
            check_react(self.react)
            if self.head is None and self.lm is None:
                raise TempcalError(f"{param('react')} clips hidden states before the output head: it needs "
                                   f"{param('head')}")

    def but(self, **changes: Any) -> SourceOptions:
        """A copy with ``changes``."""
        return replace(self, **changes)


@dataclass
class OpenedSource:
    """One opened SOURCE: its files, its logits as a chunked source, and the T stored with it.

    ``paths`` are the files T is written back into (empty for a model: ``--save-model`` does that).
    ``has_labels`` is False when labels were optional and absent (an OOD set): ``data.labels`` then
    holds placeholders.
    """

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

    def write_temperature(self, temperature: float, output: str | Path | None = None) -> list[Path]:
        """Store T with this SOURCE (or in a copy at ``output``); returns the paths written."""
        if output is not None and len(self.paths) > 1:
            raise TempcalError(f"{param('output')} takes a single SOURCE file; shards get T written into each of them")
        return [self.kind.write_temperature(path, temperature, output) for path in self.paths]

    def share(self) -> tuple[int, int]:
        """The rows ``[start, stop)`` this process reduces: all of them, or its rank's share under torch.distributed."""
        from ..core import distributed

        return distributed.share(self.data.num_samples)

    def local_rows(self, rows: Any) -> torch.Tensor:
        """Global row positions ``rows`` that fall in this process's share, relative to its start."""
        import torch

        start, stop = self.share()
        rows = torch.as_tensor(rows, dtype=torch.int64)
        return rows[(rows >= start) & (rows < stop)] - start


def check_react(percentile: Any) -> float:
    """ReAct's percentile P: a number with 0 < P <= 100."""
    import math
    import numbers

    value = float(percentile) if isinstance(percentile, numbers.Real) and not isinstance(percentile, bool) else math.nan
    if not (math.isfinite(value) and 0 < value <= 100):
        raise TempcalError(f"{param('react')} {percentile}: expected a percentile P with 0 < P <= 100")
    return value


class SourceKind(ABC):
    """One kind of SOURCE. Subclasses override :meth:`open`, and :meth:`claims` unless a suffix says it all."""

    name: str = ""
    suffixes: tuple[str, ...] = ()
    #: Whether several files (shards, a glob) make one SOURCE of this kind.
    shards: bool = False

    def claims(self, paths: list[Path], options: SourceOptions) -> bool:
        """Whether ``paths`` are a SOURCE of this kind (by default: the first path's suffix)."""
        return paths[0].suffix.lower() in self.suffixes

    @abstractmethod
    def open(self, paths: list[Path], options: SourceOptions, *, labels_optional: bool = False) -> OpenedSource:
        """Check the files (keys, dtypes, shapes; values are checked by the first scan) and open them."""

    def open_related(self, opened: OpenedSource, other: Any, *, labels_optional: bool = False) -> OpenedSource:
        """Another SOURCE beside ``opened`` (``--eval``, ``--ood``): by default a logits file of any kind."""
        from .registry import open_source

        return open_source(other, opened.options, labels_optional=labels_optional)

    def read_temperature(self, path: Path) -> tuple[float | None, list[str]]:
        """The T stored for ``path`` and warnings about it; by default in its sidecar ``FILE.tempcal.json``."""
        from ..io.sidecar import sidecar_temperature

        return sidecar_temperature(path)

    def write_temperature(self, path: Path, temperature: float, output: str | Path | None) -> Path:
        """Store T for ``path`` (or for a copy at ``output``); by default in a sidecar. Returns the path written."""
        from ..io.sidecar import write_sidecar, write_sidecar_copy

        if output is None:
            return write_sidecar(path, temperature)
        return write_sidecar_copy(path, temperature, Path(output))


__all__ = ["OpenedSource", "SourceKind", "SourceOptions", "check_react"]
