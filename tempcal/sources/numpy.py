"""``.npz`` archives and ``.npy`` pairs as SOURCE (``allow_pickle=False``; T in a sidecar); a ``.npy`` file's labels
live in a sibling (:func:`npy_labels_path`), so no single copy can hold T (``output`` is refused)."""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DataError, Note, TempcalError, param, shown
from ..io.paths import sidecar_path
from ..io.sidecar import check_regular_file
from .base import OpenedSource, SourceKind, SourceOptions
from .described import tensor_entry
from .memory import (
    NPY_MAGIC,
    ZIP_MAGIC,
    InMemoryKind,
    check_fits,
    checked_member,
    first_line,
    magic,
    missing,
)

if TYPE_CHECKING:
    import torch

#: netcal's names for the arrays, read when the default ones are absent.
NETCAL_KEYS = {"logits": "predictions", "labels": "ground_truth"}


class NpzKind(InMemoryKind):
    name = "npz"
    title = ".npz archive"

    def open(self, paths: list[Path], options: SourceOptions, *, labels_optional: bool = False) -> OpenedSource:
        path = paths[0]
        logits, labels, (logits_key, labels_key) = _read_npz(path, options.logits_key, options.labels_key,
                                                             not labels_optional)
        opened = self.open_arrays(path, logits, labels, options.but(logits_key=logits_key, labels_key=labels_key))
        taken = [f"'{new}' as the {name.removesuffix('_key')} ({param(name)})" for name, new, old in (
            ("logits_key", logits_key, options.logits_key), ("labels_key", labels_key, options.labels_key))
            if new != old]
        if taken:
            opened.warnings.insert(0, Note(f"{path}: read netcal's array names: {' and '.join(taken)}"))
        return opened

    def describe_tensors(self, paths: list[Path], options: SourceOptions) -> list[dict[str, Any]]:
        """Every array, from its header alone (nothing inflated)."""
        with _open_npz(paths[0]) as archive:
            return [tensor_entry(paths[0], key, header.shape, str(header.dtype), options)
                    for key, header in _headers(paths[0], archive).items()]

    def read_array(self, path: Path, key: str, option: str) -> torch.Tensor:
        """One array as a tensor, its declared size checked first."""
        with _open_npz(path) as archive:
            headers = _headers(path, archive)
            if key not in headers:
                raise missing(path, "array", key, tuple(headers), option)
            check_fits(path, f"array '{key}'", headers[key].nbytes)
            return _npz_member(archive, path, _npz_members(archive)[key], key, "labels")


def _netcal_key(keys: tuple[str, ...], given: str, default: str) -> str:
    """netcal's name for the array ``default`` when ``given`` is that default, absent, and netcal's is present."""
    netcal = NETCAL_KEYS[default]
    return netcal if given == default and default not in keys and netcal in keys else given


class NpyKind(InMemoryKind):
    name = "npy"
    title = ".npy logits file"
    group_values = SourceKind.group_values  # the file holds one array, without a name

    def open(self, paths: list[Path], options: SourceOptions, *, labels_optional: bool = False) -> OpenedSource:
        path = paths[0]
        check_regular_file(path)  # before the labels file is looked for
        logits, labels, labels_name = _read_npy_pair(path, options.logits_key, options.labels_key, not labels_optional)
        return self.open_arrays(path, logits, labels, options, logits_name=path.name, labels_name=labels_name)

    def describe_tensors(self, paths: list[Path], options: SourceOptions) -> list[dict[str, Any]]:
        """The logits array, and its labels file when there is one."""
        path = paths[0]
        labels = npy_labels_path(path, options.logits_key, options.labels_key)
        files = {"logits": path} | ({"labels": labels} if labels is not None and labels.is_file() else {})
        return [{**tensor_entry(file, file.name, header.shape, str(header.dtype), options), "role": role}
                for role, file in files.items() for header in [_npy_file(file)[0]]]

    def write_reading(self, path: Path, temperature: float, output: str | Path | None,
                      metadata: Mapping[str, str | None]) -> Path:
        if output is not None:
            raise TempcalError(f"{param('output')} {output}: a .npy logits file has no metadata and its labels live in "
                               f"a second file, so no single copy can hold T; leave out {param('output')} (T goes to "
                               f"{sidecar_path(path)}; {path.name} itself is not changed) or pass "
                               f"{param('no_write')}")
        return super().write_reading(path, temperature, None, metadata)


def _open_npz(path: Path) -> zipfile.ZipFile:
    """The ``.npz`` archive at ``path``, open; a single ``.npy`` array or any other file is refused."""
    head = magic(path)
    if head.startswith(NPY_MAGIC):
        raise TempcalError(f"{path}: holds a single .npy array, not an .npz archive of named arrays "
                           "(rename it to .npy, or save it with numpy.savez)")
    if not head.startswith(ZIP_MAGIC):
        raise TempcalError(f"{path}: not an .npz archive (no zip signature at its start)")
    try:
        return zipfile.ZipFile(path)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise TempcalError(f"{path}: not a readable .npz archive ({first_line(exc)})") from None


def _read_npz(path: Path, logits_key: str, labels_key: str, labels_required: bool
              ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[str, str]]:
    """The arrays named (netcal's names standing in for absent defaults), and the names read; each member's
    declared size is checked against the archive before any is read."""
    with _open_npz(path) as archive:
        members = _npz_members(archive)
        keys = tuple(members)
        logits_key, labels_key = _netcal_key(keys, logits_key, "logits"), _netcal_key(keys, labels_key, "labels")
        if logits_key not in members:
            raise missing(path, "array", logits_key, keys, param("logits_key"))
        if labels_key not in members and labels_required:
            raise missing(path, "array", labels_key, keys, param("labels_key"))
        wanted = {logits_key: "logits"} | ({labels_key: "labels"} if labels_key in members else {})
        declared = _headers(path, archive, list(wanted))
        check_fits(path, "arrays " + " and ".join(f"'{k}'" for k in wanted), sum(h.nbytes for h in declared.values()))
        arrays = {key: _npz_member(archive, path, members[key], key, role) for key, role in wanted.items()}
    return arrays[logits_key], arrays.get(labels_key), (logits_key, labels_key)


def _headers(path: Path, archive: zipfile.ZipFile, keys: list[str] | None = None) -> dict[str, _NpyHeader]:
    """The .npy headers of the members ``keys`` (all by default), each checked against the archive's sizes."""
    size = os.fstat(archive.fp.fileno()).st_size if archive.fp is not None else path.stat().st_size
    members = _npz_members(archive)
    return {key: _member_header(path, archive, members[key], key, size) for key in keys or members}


def _npy_file(path: Path) -> tuple[_NpyHeader, int]:
    """An ``.npy`` file's header and size in bytes; an ``.npz`` archive or any other file is refused."""
    head = magic(path)
    if head.startswith(ZIP_MAGIC):
        raise TempcalError(f"{path}: is an .npz archive, not a single .npy array (rename it to .npz)")
    if not head.startswith(NPY_MAGIC):
        raise TempcalError(f"{path}: not an .npy array (no NumPy signature at its start)")
    try:
        with open(path, "rb") as f:
            return _npy_header(f, str(path)), os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise TempcalError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _npz_members(archive: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """Each array's name (the member's, less ``.npy``, as numpy names them) and its member."""
    return {info.filename.removesuffix(".npy"): info for info in archive.infolist() if not info.is_dir()}


@dataclass(frozen=True)
class _NpyHeader:
    """What an .npy header declares, and the bytes its data takes."""

    dtype: Any
    shape: tuple[int, ...]
    offset: int  # where the data starts
    nbytes: int


def _member_header(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo, key: str, size: int) -> _NpyHeader:
    """A member's .npy header, checked against the sizes the archive declares for it (nothing else is read)."""
    where = f"{path}: array '{key}' (member {shown(info.filename)})"
    checked_member(path, info, size, "save the arrays with numpy.savez, uncompressed, or as safetensors")
    try:
        with archive.open(info) as f:
            header = _npy_header(f, where)
    except (OSError, EOFError, zipfile.BadZipFile, RuntimeError) as exc:  # RuntimeError: an encrypted member
        raise TempcalError(f"{where}: cannot read ({first_line(exc)})") from None
    _check_declared(header, info.file_size, where)
    return header


def _npy_header(f: Any, where: str) -> _NpyHeader:
    """The .npy header at the start of ``f``: magic, version, dtype and shape, and no object arrays."""
    from numpy.lib import format as npy

    try:
        version = npy.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = npy.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, _, dtype = npy.read_array_header_2_0(f)
        else:
            raise ValueError(f"unknown .npy format version {version[0]}.{version[1]}")
    except (ValueError, SyntaxError, TypeError) as exc:
        if "magic string" in str(exc) or "reading magic" in str(exc):
            raise TempcalError(f"{where}: not an .npy array (no NumPy signature at its start)") from None
        raise TempcalError(f"{where}: not a readable .npy header ({first_line(exc)})") from None
    if dtype.hasobject:
        raise TempcalError(f"{where}: holds Python objects; tempcal never unpickles them (save a numeric array)")
    if any(n < 0 for n in shape):
        raise TempcalError(f"{where}: the header declares shape {shown(shape)}, with a negative dimension")
    return _NpyHeader(dtype, tuple(shape), f.tell(), math.prod(shape) * dtype.itemsize)


def _check_declared(header: _NpyHeader, size: int, where: str) -> None:
    """The data the header declares must be there: a larger claim is refused before memory is given to it."""
    held = size - header.offset
    if header.nbytes > held:
        raise TempcalError(f"{where}: the header declares shape {shown(header.shape)} of {header.dtype} "
                           f"({header.nbytes} bytes) but {held} bytes follow it (truncated or damaged)")


def _npz_member(archive: zipfile.ZipFile, path: Path, info: zipfile.ZipInfo, key: str, role: str) -> torch.Tensor:
    from numpy.lib import format as npy

    try:
        with archive.open(info) as f:
            array = npy.read_array(f, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise TempcalError(f"{path}: cannot read array '{key}' ({first_line(exc)})") from None
    return from_numpy(array, path, key, role)


def npy_labels_path(logits_path: str | os.PathLike, logits_key: str, labels_key: str) -> Path | None:
    """The labels file of a ``.npy`` logits file: ``labels_key`` when it ends in ``.npy``, else the sibling with the
    last ``logits_key`` in the name replaced (``val_logits.npy`` -> ``val_labels.npy``); None when there is none."""
    if labels_key.lower().endswith(".npy"):
        return Path(labels_key)
    logits_path = Path(logits_path)
    stem, suffix = logits_path.name[: -len(logits_path.suffix)], logits_path.suffix
    at = stem.rfind(logits_key) if logits_key else -1
    if at < 0:
        return None
    return logits_path.with_name(stem[:at] + labels_key + stem[at + len(logits_key):] + suffix)


def _read_npy_pair(path: Path, logits_key: str, labels_key: str, labels_required: bool
                   ) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    labels_path = npy_labels_path(path, logits_key, labels_key)
    if labels_path is None and labels_required:
        flag = param("labels_key")
        raise TempcalError(f"{path}: cannot tell which file holds the labels: the name does not contain "
                           f"'{logits_key}' ({param('logits_key')}) to replace by '{labels_key}' ({flag}); "
                           f"name the labels file with {flag} PATH.npy")
    if labels_path is not None and labels_path.resolve() == path.resolve():
        raise TempcalError(f"{path}: the labels file is the logits file itself; name the labels file with "
                           f"{param('labels_key')} PATH.npy")
    logits = _read_npy(path, "logits")
    labels = None
    if labels_path is not None and (labels_required or labels_path.exists()):
        if not labels_path.is_file():
            siblings = sorted(p.name for p in path.parent.glob("*.npy") if p != path)
            shown = ", ".join(siblings[:8]) + (", ..." if len(siblings) > 8 else "") if siblings else "none"
            flag = param("labels_key")
            raise TempcalError(f"{path}: no labels file {labels_path} (the labels of a .npy file are the sibling "
                               f"named with '{labels_key}' ({flag}) in place of '{logits_key}' "
                               f"({param('logits_key')}), or {flag} PATH.npy; other .npy files here: {shown})")
        labels = _read_npy(labels_path, "labels")
    return logits, labels, labels_path.name if labels_path is not None else labels_key


def _read_npy(path: Path, role: str) -> torch.Tensor:
    """The array, memory-mapped, after its header's declared size is checked against the file's."""
    import numpy as np

    header, size = _npy_file(path)
    _check_declared(header, size, str(path))
    try:
        try:
            # Copy-on-write memory map: pages are read when a chunk needs them, and the tensor stays writable.
            array = np.load(path, mmap_mode="c", allow_pickle=False)
        except OSError:  # a file system without mmap: the array is read whole
            check_fits(path, f"'{path.name}'", header.nbytes)
            array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:  # object arrays were refused by their header
        raise TempcalError(f"{path}: not a readable .npy array ({first_line(exc)})") from None
    return from_numpy(array, path, path.name, role)


def from_numpy(array: Any, path: Path, name: str, role: str) -> torch.Tensor:
    """A tensor sharing the array's memory where it can; numeric checks by name, in native byte order."""
    import numpy as np
    import torch

    expected = ("float16, float32 or float64" if role == "logits" else "an integer dtype")
    kind, size = array.dtype.kind, array.dtype.itemsize
    if kind not in "biufc" or (kind == "f" and size > 8):
        raise DataError(f"{path}: '{name}' has numpy dtype {array.dtype}; expected {expected}")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if kind == "u" and size > 1:
        array = array.astype(np.int64)  # values above int64 wrap negative and are reported as bad labels
    return torch.from_numpy(np.ascontiguousarray(array))
