"""The one way to open a SOURCE: expand globs, pick the kind that claims the paths, open it.

To add a kind of SOURCE: a module with a :class:`~tempcal.sources.base.SourceKind` subclass, and one
line in :data:`KINDS` (earlier kinds are asked first; safetensors, the default, comes last).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import TempcalError
from .base import OpenedSource, SourceKind, SourceOptions
from .head import HeadKind
from .lm_eval import LmEvalKind
from .lm_texts import LmKind
from .model import ModelKind
from .numpy import NpyKind, NpzKind
from .safetensors import SafetensorsKind
from .torch_dict import TorchDictKind

#: Every kind of SOURCE, in the order they are asked whether they claim a SOURCE's paths.
KINDS: list[SourceKind] = [
    LmKind(),
    HeadKind(),
    ModelKind(),
    NpzKind(),
    NpyKind(),
    TorchDictKind(),
    LmEvalKind(),
    SafetensorsKind(),
]

#: A SOURCE as callers give it: a path, a glob pattern, a list of them, or an already opened source.
Source = str | os.PathLike | Sequence[str | os.PathLike] | OpenedSource


def expand_sources(sources: Sequence[str | os.PathLike]) -> list[Path]:
    """Paths, with glob patterns expanded in sorted order; a pattern that matches nothing is an error."""
    paths: list[Path] = []
    for source in sources:
        text = str(source)
        if any(ch in text for ch in "*?["):
            matches = sorted(glob.glob(text))
            if not matches:
                raise TempcalError(f"{text}: no file matches this pattern")
            paths.extend(Path(m) for m in matches)
        else:
            paths.append(Path(text))
    return paths


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
    for kind in KINDS:
        if kind.claims(paths, options):
            return kind
    suffix = paths[0].suffix.lower()
    known = ", ".join(s for k in KINDS for s in k.suffixes)
    shown = f"suffix '{suffix}'" if suffix else "no suffix"
    raise TempcalError(f"{paths[0]}: unknown logits file type ({shown}; expected one of {known})")


def open_source(source: Source, options: SourceOptions | None = None, *, labels_optional: bool = False,
                **keys: Any) -> OpenedSource:
    """Open a SOURCE of any kind (an :class:`OpenedSource` is returned as it is).

    ``options`` (or keyword arguments, e.g. ``logits_key=...``) say how to read it; with
    ``labels_optional`` a file without labels opens with placeholder labels (an OOD set).
    Values are checked later, by the first :class:`~tempcal.core.scan.Scan`.
    """
    if isinstance(source, OpenedSource):
        return source
    options = (options or SourceOptions()).but(**keys) if keys else (options or SourceOptions())
    paths = expand_sources([source] if isinstance(source, (str, os.PathLike)) else list(source))
    if not paths:
        raise TempcalError("no SOURCE file given")
    return kind_of(paths, options).open(paths, options, labels_optional=labels_optional)


def read_stored_temperature(path: str | os.PathLike) -> tuple[float | None, list[str]]:
    """The T stored for ``path`` (safetensors metadata, a current sidecar, a calibrated model) and warnings."""
    path = Path(path)
    return kind_of([path]).read_temperature(path)


def write_stored_temperature(path: str | os.PathLike, temperature: float,
                             output: str | os.PathLike | None = None) -> Path:
    """Store T for a SOURCE file of any kind, where that kind keeps it; returns the path written.

    safetensors: into the metadata (of ``output``, a copy, when given). ``.npz``/``.pt``: into the
    sidecar; with ``output``, the file is copied byte for byte and the copy gets the sidecar.
    ``.npy``: the sidecar only (``output`` is refused: the labels live in a second file).
    """
    path = Path(path)
    return kind_of([path]).write_temperature(path, temperature, None if output is None else Path(output))


__all__ = ["KINDS", "Source", "expand_sources", "kind_of", "open_source", "read_stored_temperature",
           "write_stored_temperature"]
