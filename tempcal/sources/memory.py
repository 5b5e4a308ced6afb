"""Shared by the SOURCE kinds read whole into memory (``.npz``, ``.npy``, ``.pt``): checks and the opened source.

These formats have no metadata, so their T lives in a sidecar ``FILE.tempcal.json``
(:mod:`tempcal.io.sidecar`), which :class:`~tempcal.sources.base.SourceKind` reads and writes by default.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import TempcalError
from ..io.sidecar import check_regular_file, sidecar_temperature
from .base import OpenedSource, SourceKind, SourceOptions

if TYPE_CHECKING:
    import torch

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK"  # a local file header, or an empty archive's end record
PICKLE_MAGIC = b"\x80"  # pickle protocol 2 and later: torch.save's legacy format


def in_memory_source(kind: SourceKind, path: Path, logits: torch.Tensor, labels: torch.Tensor | None,
                     options: SourceOptions, *, logits_name: str, labels_name: str) -> OpenedSource:
    """Checked logits (absent labels become zeros, as OOD sets may have none) and the sidecar's T."""
    import torch

    from ..core.data import as_logits_data

    has_labels = labels is not None
    if labels is None:  # one zero per row ([B, L] for token-level logits [B, L, V])
        shape = tuple(logits.shape[:2]) if logits.ndim == 3 else tuple(logits.shape[:1])
        labels = torch.zeros(shape, dtype=torch.int64)
    try:
        data = as_logits_data(logits, labels, probs=options.probs, logits_name=logits_name, labels_name=labels_name,
                              ignore_index=options.ignore_index)
    except TempcalError as exc:
        raise exc.prefixed(f"{path}: ") from None
    try:
        stored, warnings = sidecar_temperature(path)
    except TempcalError as exc:  # a broken sidecar: reported if its T is asked for; a fit can replace it
        return OpenedSource([path], data, None, kind, options, has_labels=has_labels, stored_problem=exc)
    return OpenedSource([path], data, stored, kind, options, warnings=warnings, has_labels=has_labels)


def checked_path(path: Path) -> Path:
    """``path``, after checking it is an existing regular file."""
    check_regular_file(path)
    return path


def missing(path: Path, what: str, key: str, keys: tuple[str, ...], option: str) -> TempcalError:
    """The error for an absent key: the keys present and the option that names another."""
    present = ", ".join(f"'{k}'" for k in keys) or "none"
    return TempcalError(f"{path}: no {what} '{key}' (keys present: {present}; choose one with {option})")


def magic(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(8)
    except OSError as exc:
        raise TempcalError(f"{path}: cannot read ({exc.strerror or exc})") from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
