"""Logits files beyond safetensors (``.npz``, ``.npy`` pairs, ``.pt`` tensor dicts) and T sidecars.

The format is chosen by suffix and the same ``--logits-key`` / ``--labels-key`` names apply:

* ``.safetensors``: read by :mod:`tempcal.io.safetensors_header`; T lives in the file's metadata.
* ``.npz``: the arrays named by the keys (netcal-style files: ``--logits-key predictions
  --labels-key ground_truth``). Read with ``allow_pickle=False``.
* ``.npy``: the file holds the logits; the labels are the sibling ``.npy`` file whose name
  has the labels key in place of the logits key (``val_logits.npy`` -> ``val_labels.npy``),
  or the file ``--labels-key PATH.npy`` names. Read with ``allow_pickle=False``. Its sidecar
  fingerprints the logits file only.
* ``.pt`` / ``.pth``: a dict of tensors saved by ``torch.save``, read by
  ``torch.load(weights_only=True)`` only: a file holding other Python objects is refused,
  never unpickled. TorchScript archives are models, not logits files, and are refused here.

Formats without metadata keep T in a sidecar ``FILE.tempcal.json`` beside the file,
written atomically, with the file's size, mtime and SHA-256 so that a sidecar left behind
by an older version of the file is noticed and its T ignored.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import warnings
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import DataError, TempcalError
from ..io.safetensors_header import TEMPERATURE_KEY, Header

if TYPE_CHECKING:
    import torch

    from ..core.data import LogitsData

#: File suffix -> format name. ``.pt``/``.pth`` files may also be TorchScript models (see the CLI's ``--inputs``).
SUFFIXES = {".safetensors": "safetensors", ".npz": "npz", ".npy": "npy", ".pt": "pt", ".pth": "pt"}
#: Formats whose T goes to a sidecar file rather than into the file itself.
SIDECAR_FORMATS = ("npz", "npy", "pt")
SIDECAR_SUFFIX = ".tempcal.json"
SIDECAR_VERSION = 1
#: Rows with this label are left out by default, as in ``torch.nn.functional.cross_entropy``.
IGNORE_INDEX = -100
HASH_BLOCK = 1 << 20
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK"  # a local file header, or an empty archive's end record
PICKLE_MAGIC = b"\x80"  # pickle protocol 2 and later: torch.save's legacy format


#: What a reader returns: the keys present, the logits, the labels (None when absent) and the labels' name.
_Read = tuple[tuple[str, ...], "torch.Tensor", "torch.Tensor | None", str]


def file_format(path: str | os.PathLike) -> str:
    """The format of ``path`` by its suffix (case-insensitive); an unknown suffix is a :class:`TempcalError`."""
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        known = ", ".join(SUFFIXES)
        shown = f"suffix '{suffix}'" if suffix else "no suffix"
        raise TempcalError(f"{path}: unknown logits file type ({shown}; expected one of {known})")
    return SUFFIXES[suffix]


def sidecar_path(path: str | os.PathLike) -> Path:
    """Where the T of a file without metadata is kept: ``FILE.tempcal.json`` beside it."""
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


# -- loading -------------------------------------------------------------------------


@dataclass(frozen=True)
class FileInfo:
    """What a metadata-less logits file tells besides its tensors: its keys and its sidecar's metadata."""

    path: Path
    format: str
    keys: tuple[str, ...]
    metadata: dict[str, str] = field(default_factory=dict)  # from a current sidecar; {} when none
    sidecar: Path | None = None  # the sidecar the metadata came from
    problem: str | None = None  # why the sidecar could not be read, raised when the stored T is asked for

    def stored_temperature(self) -> float | None:
        """The T a previous ``tempcal fit`` wrote into the sidecar, if any."""
        if self.problem:
            raise TempcalError(self.problem)
        return _parse_temperature(self.metadata, self.sidecar or sidecar_path(self.path))


@dataclass(frozen=True)
class LoadedLogits:
    """A loaded logits file of any format; ``header`` is a safetensors :class:`~tempcal.io.safetensors_header.Header`
    or a :class:`FileInfo`, both with ``.path`` and ``.stored_temperature()``."""

    header: Header | FileInfo
    data: LogitsData
    format: str
    has_labels: bool = True  # False: the labels were optional and absent, ``data.labels`` is all zeros
    warnings: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return self.header.path

    @property
    def stored_temperature(self) -> float | None:
        return self.header.stored_temperature()


def load_any(path: str | os.PathLike, *, logits_key: str = "logits", labels_key: str = "labels",
             probs: bool = False, labels_required: bool = True,
             ignore_index: int | None = IGNORE_INDEX) -> LoadedLogits:
    """Load a logits file of any supported format (by suffix), checked for keys, dtypes and shapes.

    Values are checked by the first :class:`~tempcal.core.scan.Scan`. With ``labels_required=False``
    (out-of-distribution files) absent labels become zeros and ``has_labels`` is False. Rows
    whose label is ``ignore_index`` are left out, as :func:`tempcal.core.data.as_logits_data` does.
    Problems are one-line :class:`TempcalError` messages that start with the file name.
    """
    kind = file_format(path)
    path = Path(path)
    if kind == "safetensors":
        return _load_safetensors(path, logits_key, labels_key, probs, labels_required, ignore_index)
    _check_regular_file(path)
    if kind == "npz":
        keys, logits, labels, labels_name = _read_npz(path, logits_key, labels_key, labels_required)
        logits_name = logits_key
    elif kind == "npy":
        keys, logits, labels, labels_name = _read_npy_pair(path, logits_key, labels_key, labels_required)
        logits_name = path.name
    else:
        keys, logits, labels, labels_name = _read_pt(path, logits_key, labels_key, labels_required)
        logits_name = logits_key
    try:
        metadata, notes = read_sidecar(path)
        problem = None
    except TempcalError as exc:  # reported when the stored T is asked for: a fit can still replace the sidecar
        metadata, notes, problem = {}, [], str(exc)
    info = FileInfo(path, kind, keys, metadata, sidecar_path(path) if metadata else None, problem)
    data = _as_data(path, logits, labels, probs, logits_name, labels_name, ignore_index)
    return LoadedLogits(info, data, kind, labels is not None, tuple(notes))


def _load_safetensors(path: Path, logits_key: str, labels_key: str, probs: bool,
                      labels_required: bool, ignore_index: int | None) -> LoadedLogits:
    from ..io.safetensors_header import load_logits, read_header, read_tensor

    header = read_header(path)
    has_labels = labels_key in header.tensors
    if (labels_required or has_labels) and ignore_index == IGNORE_INDEX:
        # The safetensors loader itself (it also records the file's stamp for a later write-back).
        loaded = load_logits(path, logits_key=logits_key, labels_key=labels_key, probs=probs)
        return LoadedLogits(loaded.header, loaded.data, "safetensors")  # type: ignore[arg-type]
    logits = read_tensor(header, logits_key, option="--logits-key")
    labels = read_tensor(header, labels_key, option="--labels-key") if has_labels or labels_required else None
    data = _as_data(path, logits, labels, probs, logits_key, labels_key, ignore_index)
    return LoadedLogits(header, data, "safetensors", has_labels=labels is not None)


def _as_data(path: Path, logits: Any, labels: Any, probs: bool, logits_name: str, labels_name: str,
             ignore_index: int | None) -> LogitsData:
    import torch

    from ..core.data import as_logits_data

    if labels is None:  # no labels: zeros, one per row ([B, L] for token-level logits [B, L, V])
        shape = tuple(logits.shape[:2]) if logits.ndim == 3 else tuple(logits.shape[:1])
        labels = torch.zeros(shape, dtype=torch.int64)
    try:
        return as_logits_data(logits, labels, probs=probs, logits_name=logits_name, labels_name=labels_name,
                              ignore_index=ignore_index)
    except TempcalError as exc:
        raise type(exc)(f"{path}: {exc}") from None


def _check_regular_file(path: Path) -> None:
    if not path.exists():
        raise TempcalError(f"{path}: no such file")
    if not path.is_file():
        raise TempcalError(f"{path}: not a regular file")


def _missing(path: Path, what: str, key: str, keys: tuple[str, ...], option: str) -> TempcalError:
    present = ", ".join(f"'{k}'" for k in keys) or "none"
    return TempcalError(f"{path}: no {what} '{key}' (keys present: {present}; choose one with {option})")


def _read_npz(path: Path, logits_key: str, labels_key: str, labels_required: bool) -> _Read:
    import numpy as np

    magic = _magic(path)
    if magic.startswith(NPY_MAGIC):
        raise TempcalError(f"{path}: holds a single .npy array, not an .npz archive of named arrays "
                           "(rename it to .npy, or save it with numpy.savez)")
    if not magic.startswith(ZIP_MAGIC):
        raise TempcalError(f"{path}: not an .npz archive (no zip signature at its start)")
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise TempcalError(f"{path}: not a readable .npz archive ({_first_line(exc)})") from None
    with archive:
        keys = tuple(archive.files)
        if logits_key not in keys:
            raise _missing(path, "array", logits_key, keys, "--logits-key")
        if labels_key not in keys and labels_required:
            raise _missing(path, "array", labels_key, keys, "--labels-key")
        logits = _npz_member(archive, path, logits_key, "logits")
        labels = _npz_member(archive, path, labels_key, "labels") if labels_key in keys else None
    return keys, logits, labels, labels_key


def _npz_member(archive: Any, path: Path, key: str, role: str) -> torch.Tensor:
    try:
        array = archive[key]
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise TempcalError(f"{path}: array '{key}' holds Python objects; tempcal never unpickles them "
                               "(save numeric arrays)") from None
        raise TempcalError(f"{path}: cannot read array '{key}' ({_first_line(exc)})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise TempcalError(f"{path}: cannot read array '{key}' ({_first_line(exc)})") from None
    return _from_numpy(array, path, key, role)


def npy_labels_path(logits_path: str | os.PathLike, logits_key: str = "logits", labels_key: str = "labels"
                    ) -> Path | None:
    """The labels file of a ``.npy`` logits file; None when it cannot be told from the names.

    ``labels_key`` ending in ``.npy`` is that path (relative to the working folder). Otherwise
    the last ``logits_key`` in the file's name is replaced by ``labels_key``, in the same folder:
    ``runs/val_logits.npy`` -> ``runs/val_labels.npy``.
    """
    if labels_key.lower().endswith(".npy"):
        return Path(labels_key)
    logits_path = Path(logits_path)
    stem, suffix = logits_path.name[: -len(logits_path.suffix)], logits_path.suffix
    at = stem.rfind(logits_key) if logits_key else -1
    if at < 0:
        return None
    return logits_path.with_name(stem[:at] + labels_key + stem[at + len(logits_key):] + suffix)


def _read_npy_pair(path: Path, logits_key: str, labels_key: str, labels_required: bool) -> _Read:
    labels_path = npy_labels_path(path, logits_key, labels_key)
    if labels_path is None and labels_required:
        raise TempcalError(f"{path}: cannot tell which file holds the labels: the name does not contain "
                           f"'{logits_key}' (--logits-key) to replace by '{labels_key}' (--labels-key); "
                           "name the labels file with --labels-key PATH.npy")
    if labels_path is not None and labels_path.resolve() == path.resolve():
        raise TempcalError(f"{path}: the labels file is the logits file itself; name the labels file with "
                           "--labels-key PATH.npy")
    logits = _read_npy(path, path.name, "logits")
    labels = None
    if labels_path is not None and (labels_required or labels_path.exists()):
        if not labels_path.is_file():
            siblings = sorted(p.name for p in path.parent.glob("*.npy") if p != path)
            shown = ", ".join(siblings[:8]) + (", ..." if len(siblings) > 8 else "") if siblings else "none"
            raise TempcalError(f"{path}: no labels file {labels_path} (the labels of a .npy file are the sibling "
                               f"named with '{labels_key}' (--labels-key) in place of '{logits_key}' "
                               f"(--logits-key), or --labels-key PATH.npy; other .npy files here: {shown})")
        labels = _read_npy(labels_path, labels_path.name, "labels")
    keys = (path.name,) if labels is None else (path.name, str(labels_path))
    return keys, logits, labels, labels_path.name if labels_path is not None else labels_key


def _read_npy(path: Path, name: str, role: str) -> torch.Tensor:
    import numpy as np

    magic = _magic(path)
    if magic.startswith(ZIP_MAGIC):
        raise TempcalError(f"{path}: is an .npz archive, not a single .npy array (rename it to .npz)")
    if not magic.startswith(NPY_MAGIC):
        raise TempcalError(f"{path}: not an .npy array (no NumPy signature at its start)")
    try:
        try:
            # Copy-on-write memory map: pages are read when a chunk needs them, and the tensor stays writable.
            array = np.load(path, mmap_mode="c", allow_pickle=False)
        except OSError:  # a file system without mmap
            array = np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "allow_pickle" in str(exc) or "Python objects" in str(exc):
            raise TempcalError(f"{path}: holds Python objects; tempcal never unpickles them "
                               "(save a numeric array)") from None
        raise TempcalError(f"{path}: not a readable .npy array ({_first_line(exc)})") from None
    except (OSError, EOFError) as exc:
        raise TempcalError(f"{path}: not a readable .npy array ({_first_line(exc)})") from None
    return _from_numpy(array, path, name, role)


def _from_numpy(array: Any, path: Path, name: str, role: str) -> torch.Tensor:
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


def _read_pt(path: Path, logits_key: str, labels_key: str, labels_required: bool) -> _Read:
    import pickle

    import torch

    magic = _magic(path)
    zipped = magic.startswith(ZIP_MAGIC)
    if not zipped and not magic.startswith(PICKLE_MAGIC):
        raise TempcalError(f"{path}: not a torch.save file (neither a zip archive nor a pickle at its start)")
    if zipped and is_torchscript(path):
        raise TempcalError(f"{path}: is a TorchScript model, not a dict of tensors; pass a model with "
                           "--inputs DATA.safetensors, or save its logits with "
                           "torch.save({'logits': ..., 'labels': ...}, PATH)")
    try:
        # weights_only=True: tensors, numbers, strings and containers only; never arbitrary objects.
        with warnings.catch_warnings():  # damaged files make torch warn before failing; the error says it all
            warnings.simplefilter("ignore")
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=zipped)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        found = re.search(r"GLOBAL (\S+)", text)
        if found is None:
            detail = text.split("WeightsUnpickler error:", 1)[-1].strip().splitlines()
            reason = detail[0] if "WeightsUnpickler error:" in text and detail else _first_line(exc)
            raise TempcalError(f"{path}: not a readable torch.save file of tensors ({reason}); tempcal reads .pt "
                               "files with torch.load(weights_only=True) only") from None
        hint = " (numpy arrays: save torch tensors or an .npz instead)" if "numpy" in found.group(1) else ""
        raise TempcalError(f"{path}: refused: it needs the Python object {found.group(1)}{hint}; tempcal reads .pt "
                           "files with torch.load(weights_only=True) only and never unpickles arbitrary objects"
                           ) from None
    except Exception as exc:  # the weights-only unpickler fails on damaged files with assorted exceptions
        raise TempcalError(f"{path}: not a readable torch.save file ({type(exc).__name__}: "
                           f"{_first_line(exc)})") from None
    if not isinstance(loaded, Mapping):
        raise TempcalError(f"{path}: holds a {type(loaded).__name__}, not a dict of tensors "
                           "(save it with torch.save({'logits': ..., 'labels': ...}, PATH))")
    keys = tuple(str(k) for k in loaded)
    if logits_key not in loaded:
        raise _missing(path, "tensor", logits_key, keys, "--logits-key")
    if labels_key not in loaded and labels_required:
        raise _missing(path, "tensor", labels_key, keys, "--labels-key")
    logits = _pt_member(loaded[logits_key], path, logits_key)
    labels = _pt_member(loaded[labels_key], path, labels_key) if labels_key in loaded else None
    return keys, logits, labels, labels_key


def _pt_member(value: object, path: Path, key: str) -> torch.Tensor:
    import torch

    if not isinstance(value, torch.Tensor):
        raise TempcalError(f"{path}: '{key}' is a {type(value).__name__}, not a tensor")
    if value.layout != torch.strided:
        value = value.to_dense()
    return value


def is_torchscript(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a TorchScript archive (it holds ``constants.pkl``: the test torch.load itself uses)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.rsplit("/", 1)[-1] == "constants.pkl" for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _magic(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(8)
    except OSError as exc:
        raise TempcalError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- the stored temperature -------------------------------------------------------------


def _parse_temperature(metadata: Mapping[str, str], where: Path) -> float | None:
    from ..io.safetensors_header import parse_temperature

    return parse_temperature(metadata, f"{where}:")


def read_stored_temperature(path: str | os.PathLike) -> tuple[float | None, list[str]]:
    """The T stored for ``path`` (safetensors metadata, or a current sidecar) and any warnings about it."""
    path = Path(path)
    if file_format(path) == "safetensors":
        from ..io.safetensors_header import read_header

        return read_header(path).stored_temperature(), []
    _check_regular_file(path)
    metadata, notes = read_sidecar(path)
    return _parse_temperature(metadata, sidecar_path(path)), notes


def read_sidecar(path: str | os.PathLike) -> tuple[dict[str, str], list[str]]:
    """The metadata in ``path``'s sidecar, and warnings; ``{}`` when there is none or it is stale.

    A sidecar is current when the file's size matches and either its mtime or its SHA-256
    does (the hash is only computed when the mtime differs, e.g. after a copy).
    """
    path = Path(path)
    side = sidecar_path(path)
    if not side.exists():
        return {}, []
    record = _read_record(side)
    stat = path.stat()
    if record["size"] == stat.st_size and (record["mtime_ns"] == stat.st_mtime_ns
                                           or record["sha256"] == file_sha256(path)):
        return dict(record["metadata"]), []
    return {}, [f"{side}: was written for a different {path.name} (the file changed since); its stored "
                "temperature is ignored (run tempcal fit again)"]


def _read_record(side: Path) -> dict[str, Any]:
    try:
        record = json.loads(side.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TempcalError(f"{side}: cannot read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise TempcalError(f"{side}: not a tempcal sidecar (not UTF-8 JSON); fix or delete it") from None
    ok = (isinstance(record, dict) and isinstance(record.get("metadata"), dict)
          and all(isinstance(k, str) and isinstance(v, str) for k, v in record["metadata"].items())
          and all(isinstance(record.get(k), int) and not isinstance(record.get(k), bool) for k in ("size", "mtime_ns"))
          and isinstance(record.get("sha256"), str))
    if not ok:
        raise TempcalError(f"{side}: not a tempcal sidecar (expected 'metadata', 'size', 'mtime_ns' and 'sha256'); "
                           "fix or delete it")
    return dict(record)


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(HASH_BLOCK):
                digest.update(block)
    except OSError as exc:
        raise TempcalError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return digest.hexdigest()


def write_sidecar(path: str | os.PathLike, temperature: float, *, metadata: Mapping[str, str] | None = None) -> Path:
    """Store ``temperature`` for ``path`` in its sidecar (atomically); other metadata of a current sidecar is kept.

    Returns the sidecar's path. A malformed or stale existing sidecar is replaced.
    """
    from ..io.writeback import format_temperature

    path = Path(path)
    if not (math.isfinite(temperature) and temperature > 0):
        raise TempcalError(f"temperature must be a positive number, got {temperature!r}")
    _check_regular_file(path)
    side = sidecar_path(path)
    if metadata is None:
        try:
            metadata = read_sidecar(path)[0]
        except TempcalError:
            metadata = {}
    stat = path.stat()
    record = {
        "tempcal_sidecar": SIDECAR_VERSION,
        "file": path.name,
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": file_sha256(path),
        "metadata": {**metadata, TEMPERATURE_KEY: format_temperature(temperature)},
    }
    text = json.dumps(record, indent=2) + "\n"
    # Write through a symbolic link to the file it names, keeping the link (as safetensors write-back does).
    destination = Path(os.path.realpath(side)) if side.is_symlink() else side
    mode = (destination.stat().st_mode if destination.exists() else stat.st_mode) & 0o666
    _atomic_replace(destination, lambda f: f.write(text.encode("utf-8")), mode)
    return side


def write_stored_temperature(source: str | os.PathLike, temperature: float,
                             output: str | os.PathLike | None = None) -> Path:
    """Store T for a logits file of any format; returns the path written.

    safetensors: into the metadata (of ``output``, a copy, when given). ``.npz``/``.pt``: into
    the sidecar; with ``output``, SOURCE is copied byte for byte to ``output`` (same suffix)
    and the copy gets the sidecar. ``.npy``: the sidecar only (``output`` is refused: the
    labels live in a second file).
    """
    kind = file_format(source)
    source = Path(source)
    if kind == "safetensors":
        from ..io.writeback import write_temperature

        return write_temperature(source, temperature, output)
    if output is None:
        return write_sidecar(source, temperature)
    output = Path(output)
    if kind == "npy":
        raise TempcalError(f"--output {output}: a .npy logits file has no metadata and its labels live in a second "
                           f"file, so no single copy can hold T; leave out --output (T goes to "
                           f"{sidecar_path(source)}; {source.name} itself is not changed) or pass --no-write")
    if output.suffix.lower() != source.suffix.lower():
        raise TempcalError(f"--output {output}: must have the suffix of SOURCE ({source.suffix}); tempcal copies "
                           "the file and stores T in the copy's sidecar")
    _check_regular_file(source)
    try:
        metadata, _ = read_sidecar(source)
    except TempcalError:
        metadata = {}
    if output.exists() and os.path.samefile(output, source):
        return write_sidecar(source, temperature, metadata=metadata)
    if output.is_dir():
        raise TempcalError(f"--output {output}: is a folder")
    destination = Path(os.path.realpath(output)) if output.is_symlink() else output

    def copy(out: BinaryIO) -> None:
        with open(source, "rb") as src:
            shutil.copyfileobj(src, out, HASH_BLOCK)

    _atomic_replace(destination, copy, source.stat().st_mode & 0o7777)
    return write_sidecar(output, temperature, metadata=metadata)


def _atomic_replace(destination: Path, write: Callable[[BinaryIO], object], mode: int) -> None:
    """Write via ``write(file)`` to a temporary file beside ``destination``, fsync, rename into place."""
    from ..io.atomic import write_atomic

    write_atomic(destination, write, what="", mode=mode)


__all__ = ["SIDECAR_SUFFIX", "SUFFIXES", "FileInfo", "LoadedLogits", "file_format", "file_sha256", "is_torchscript",
           "load_any", "npy_labels_path", "read_sidecar", "read_stored_temperature", "sidecar_path", "write_sidecar",
           "write_stored_temperature"]
