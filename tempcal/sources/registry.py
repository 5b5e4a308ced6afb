"""The one way to open a SOURCE: expand globs, pick the kind that claims the paths, open it. A new kind is a
:class:`~tempcal.sources.base.SourceKind` subclass and one line in :data:`KINDS`."""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import PROBS_KEY, READING_KEYS, Info, TempcalError, positive_number, stored_probs
from .base import DEFAULT_KEYS, OpenedSource, SourceKind, SourceOptions, expand_sources


@dataclass(frozen=True)
class KindLine:
    """One kind of SOURCE in :data:`KINDS`: its module and class (imported when first asked) and what it may claim
    without opening anything: name endings, a folder, an option that selects it, a missing path."""

    module: str
    cls: str
    suffixes: tuple[str, ...] = ()
    folders: bool = False
    option: str | None = None
    missing: bool = False
    listed: bool = True

    @functools.cache  # noqa: B019 (the lines live as long as the program)
    def kind(self) -> SourceKind:
        """The kind itself, one instance per line, its module imported on first use."""
        return getattr(importlib.import_module(self.module), self.cls)()

    def asked(self, path: Path, options: SourceOptions) -> bool:
        """Whether ``path`` may be of this kind, told from its name, its options and whether it is a folder."""
        return ((self.option is not None and getattr(options, self.option) is not None)
                or path.name.lower().endswith(self.suffixes) or (self.folders and path.is_dir())
                or (self.missing and not path.exists()))


#: Every kind of SOURCE, in the order they are asked whether they claim a SOURCE's paths.
KINDS: list[KindLine] = [
    KindLine("tempcal.lm.source", "LmKind", option="lm"),
    KindLine("tempcal.sources.head", "HeadKind", option="head"),
    KindLine("tempcal.sources.model", "ModelKind", (".pt2", ".onnx", ".pt", ".pth", ".ts", ".torchscript"),
             listed=False),
    KindLine("tempcal.sources.numpy", "NpzKind", (".npz",)),
    KindLine("tempcal.sources.numpy", "NpyKind", (".npy",)),
    KindLine("tempcal.sources.torch_dict", "TorchDictKind", (".pt", ".pth")),
    KindLine("tempcal.sources.inspect_log", "InspectLogKind", (".eval", ".json"), folders=True),
    KindLine("tempcal.sources.confidence_table", "ConfidenceTableKind", (".csv", ".jsonl", ".parquet")),
    KindLine("tempcal.sources.lm_eval", "LmEvalKind", (".jsonl", ".jsonl.gz")),
    KindLine("tempcal.sources.lighteval", "LightevalKind", (".parquet",)),
    KindLine("tempcal.sources.safetensors", "SafetensorsKind", (".safetensors",), missing=True),
]

#: A SOURCE as callers give it: a path, a glob pattern, a list of them, or an already opened source.
Source = str | os.PathLike | Sequence[str | os.PathLike] | OpenedSource


def kind_of(paths: list[Path], options: SourceOptions | None = None) -> SourceKind:
    """The kind that claims ``paths``; shards must all be of a kind that takes several files."""
    options = options or SourceOptions()
    kind = _claimant(paths, options)
    if len(paths) > 1:
        other = next((p for p in paths if _claimant([p], options) is not kind), None) if kind.shards else paths[0]
        if other is not None:
            like = f"{kind.name} files like {paths[0]}" if other is not paths[0] else ".safetensors files"
            raise TempcalError(f"{other}: shards must be {like}")
    return kind


def _claimant(paths: list[Path], options: SourceOptions) -> SourceKind:
    for line in KINDS:
        if line.asked(paths[0], options) and (kind := line.kind()).claims(paths, options):
            return kind
    if paths[0].is_dir():
        raise TempcalError(f"{paths[0]}: is a folder, not a logits file (a Hugging Face model folder is given to "
                           f"--head, with the hidden states as SOURCE; several files are shards: list them or quote "
                           f"a glob such as '{paths[0]}/*.safetensors')")
    suffix = paths[0].suffix.lower()
    listed = [KINDS[-1], *KINDS[:-1]]  # the default kind's suffix first
    known = ", ".join(dict.fromkeys(s for line in listed if line.listed for s in line.suffixes))
    shown = f"suffix '{suffix}'" if suffix else "no suffix"
    raise TempcalError(f"{paths[0]}: unknown logits file type ({shown}; expected one of {known})")


def open_source(source: Source, options: SourceOptions | None = None, *, labels_optional: bool = False,
                **keys: Any) -> OpenedSource:
    """Open a SOURCE of any kind (an :class:`OpenedSource` is returned as it is), read as ``options`` (or keyword
    arguments, e.g. ``logits_key=...``) say; with ``labels_optional`` a file without labels opens (an OOD set)."""
    if isinstance(source, OpenedSource):
        return source
    options = (options or SourceOptions()).but(**keys)
    paths = expand_sources([source] if isinstance(source, (str, os.PathLike)) else list(source))
    if not paths:
        raise TempcalError("no SOURCE file given")
    kind = kind_of(paths, options)
    options, fitted_on_probs, notes = stored_reading(kind, paths[0], options)
    opened = kind.open(paths, options, labels_optional=labels_optional)
    opened.stored_probs = fitted_on_probs
    opened.warnings[:0] = notes
    return opened


SourceKind.open_any = staticmethod(open_source)


#: How the note on a stored reading names each remembered option.
_SAID = {"logits_key": "logits", "labels_key": "labels", "confidence": "confidence column", "correct": "correct column",
         "confidence_scale": "confidence scale"}


def _shown(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)


def stored_reading(kind: SourceKind, path: Path, options: SourceOptions) -> tuple[SourceOptions, bool, list[str]]:
    """``options`` completed by the reading the kind keeps beside ``path``'s T (for options neither given nor changed),
    whether that T was fitted on probabilities, and a note on what was taken and what given differs."""
    if not kind.remembered:
        return options, False, []
    metadata = kind.stored_metadata(path)
    fitted_on_probs = "probs" in kind.remembered and stored_probs(metadata.get(PROBS_KEY), f"{path}:")
    taken: dict[str, object] = {}
    overridden: list[str] = []
    for name, default in DEFAULT_KEYS.items():
        value = metadata.get(READING_KEYS[name]) if name in kind.remembered else None
        stored = positive_number(value) if value and isinstance(default, float) else value
        mine = getattr(options, name)
        if not stored:  # none kept, or a scale that is no number: unread
            continue
        if name not in options.given and mine == default:
            taken[name] = stored
        elif mine != stored:
            overridden.append(f"{_SAID[name]} {_shown(mine)} (fitted with {_shown(stored)})")
    if fitted_on_probs and options.probs is None:
        taken["probs"] = True
    said = ["the values as probabilities (log p)"] if "probs" in taken else []
    said += [f"{_SAID[name]} {_shown(taken[name])}" for name in DEFAULT_KEYS if name in taken]
    parts = [f"read as the stored T was fitted: {', '.join(said)}"] if said else []
    if overridden:
        parts.append(f"as given instead of as the stored T was fitted: {', '.join(overridden)}")
    notes: list[str] = [Info(f"{path}: {'; '.join(parts)}")] if parts else []
    return options.but(**taken), fitted_on_probs, notes


def read_stored_temperature(path: str | os.PathLike) -> tuple[float | None, list[str]]:
    """The T stored for ``path`` (safetensors metadata, a current sidecar, a calibrated model) and warnings."""
    path = Path(path)
    return kind_of([path]).read_temperature(path)


def write_stored_temperature(path: str | os.PathLike, temperature: float,
                             output: str | os.PathLike | None = None) -> Path:
    """Store T for a SOURCE file of any kind where that kind keeps it (metadata, or the sidecar), or for a copy at
    ``output``; returns the path written."""
    path = Path(path)
    return kind_of([path]).write_reading(path, temperature, None if output is None else Path(output), {})


__all__ = ["KINDS", "KindLine", "Source", "kind_of", "open_source", "read_stored_temperature",
           "write_stored_temperature"]
