"""Shared by the SOURCE kinds read whole into memory (``.npz``, ``.npy``, ``.pt``): checks and the opened source;
their T lives in a sidecar ``FILE.tempcal.json``."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import TempcalError, param, shown
from ..io.sidecar import check_regular_file
from .base import OpenedSource, SourceKind, SourceOptions, checked

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ..core.data import LogitsData

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK"  # a local file header, or an empty archive's end record
PICKLE_MAGIC = b"\x80"  # pickle protocol 2 and later: torch.save's legacy format
#: A compressed archive member may inflate to this many times its compressed size (float logits compress
#: less than 2x, labels rarely past 20x; deflate's own limit is about 1,000x) ...
MAX_EXPANSION = 100
#: ... or to this many bytes, whatever its ratio (padded token labels compress very well, and are small).
EXPANSION_FLOOR = 256 << 20


class InMemoryKind(SourceKind):
    """A logits file read whole into memory: what these kinds share beyond the sidecar."""

    logits_file = True
    remembered = ("probs", "logits_key", "labels_key")  # kept in the sidecar beside T

    def read_array(self, path: Path, key: str, option: str) -> torch.Tensor:
        """The named array (tensor) ``key`` of the file; a missing one names those present and ``option``."""
        raise NotImplementedError

    def group_values(self, opened: OpenedSource, key: str, option: str) -> np.ndarray:
        """The array ``key``, checked against the labels' shape (none: an OOD set, where the row count decides)."""
        path = opened.paths[0]
        values = self.read_array(path, key, option)
        try:
            shape: tuple[int, ...] | None = tuple(self.read_array(path, opened.options.labels_key,
                                                                  param("labels_key")).shape)
        except TempcalError:
            shape = None
        return checked(path, key, values, shape, option)

    def open_arrays(self, path: Path, logits: torch.Tensor, labels: torch.Tensor | None, options: SourceOptions, *,
                    logits_name: str | None = None, labels_name: str | None = None) -> OpenedSource:
        """Checked logits (absent labels become zeros, as OOD sets may have none; named by the options' keys unless
        told otherwise) and the sidecar's T."""
        data, has_labels = in_memory_data(path, logits, labels, options, logits_name=logits_name or options.logits_key,
                                          labels_name=labels_name or options.labels_key)
        return self.with_stored(OpenedSource([path], data, None, self, options, has_labels=has_labels))


def in_memory_data(path: Path, logits: torch.Tensor, labels: torch.Tensor | None, options: SourceOptions, *,
                   logits_name: str, labels_name: str) -> tuple[LogitsData, bool]:
    """Logits held in memory, checked (as probabilities with ``options.probs``), and whether they have labels:
    absent ones become zeros, one per row (``[B, L]`` for token-level logits ``[B, L, V]``)."""
    import torch

    from ..core.data import as_logits_data

    has_labels = labels is not None
    if labels is None:
        shape = tuple(logits.shape[:2]) if logits.ndim == 3 else tuple(logits.shape[:1])
        labels = torch.zeros(shape, dtype=torch.int64)
    try:
        return as_logits_data(logits, labels, probs=options.probs, logits_name=logits_name, labels_name=labels_name,
                              ignore_index=options.ignore_index), has_labels
    except TempcalError as exc:
        raise exc.prefixed(f"{path}: ") from None


def missing(path: Path, what: str, key: str, keys: tuple[str, ...], option: str) -> TempcalError:
    """The error for an absent key: the keys present and the option that names another."""
    present = ", ".join(f"'{k}'" for k in keys) or "none"
    return TempcalError(f"{path}: no {what} '{key}' (keys present: {present}; choose one with {option})")


def magic(path: Path) -> bytes:
    """The first bytes of ``path``, after checking it is an existing regular file."""
    check_regular_file(path)
    try:
        with open(path, "rb") as f:
            return f.read(8)
    except OSError as exc:
        raise TempcalError(f"{path}: cannot read ({exc.strerror or exc})") from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def checked_member(path: Path, info: zipfile.ZipInfo, file_size: int, remedy: str) -> None:
    """A zip member's declared sizes, bounded before a byte of it is inflated: inside the file, and an
    uncompressed size a few times the compressed one (a zip bomb claims 1,000 times)."""
    name = shown(info.filename)
    if info.header_offset + info.compress_size > file_size:
        raise TempcalError(f"{path}: member {name} claims {info.compress_size} bytes at offset {info.header_offset}, "
                           f"past the end of the file ({file_size} bytes; truncated?)")
    if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
        raise TempcalError(f"{path}: member {name} is stored uncompressed but claims {info.file_size} bytes "
                           f"from {info.compress_size} (a damaged archive)")
    if info.file_size > max(EXPANSION_FLOOR, MAX_EXPANSION * info.compress_size):
        raise TempcalError(f"{path}: member {name} would inflate from {info.compress_size} to {info.file_size} "
                           f"bytes (more than {MAX_EXPANSION} times); refused before reading it ({remedy})")


def check_fits(path: Path, what: str, nbytes: int) -> None:
    """Refuse, before allocating, to read ``nbytes`` into memory when fewer are available."""
    from ..core import limits

    available = limits.available_bytes("cpu")
    if available is not None and nbytes > available:
        raise TempcalError(f"{path}: {what} need {nbytes} bytes in memory, more than the {available} available")
