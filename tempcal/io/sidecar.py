"""T for files without metadata of their own: a sidecar ``FILE.tempcal.json`` beside the file, written atomically,
recording the file's size, mtime and SHA-256, so that one left by an older version of the file is ignored."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import (
    TEMPERATURE_KEY,
    StoredNote,
    TempcalError,
    as_temperature,
    format_temperature,
    param,
    stored_temperature,
)
from .bounded_read import JsonLongInteger, JsonTooDeep, load_json
from .paths import NotRegularFile, TooLarge, check_target, read_regular, sidecar_path, write_atomic
from .safetensors_header import updated_metadata

SIDECAR_VERSION = 1
HASH_BLOCK = 1 << 20


def check_regular_file(path: str | os.PathLike) -> None:
    """A missing path, one that cannot be looked at, or a folder is a one-line error naming it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise TempcalError(f"{path}: no such file") from None
    except OSError as exc:  # a folder on the way that may not be searched, a name too long
        raise TempcalError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(mode):
        raise TempcalError(f"{path}: not a regular file")


def read_sidecar(path: str | os.PathLike) -> tuple[dict[str, str], list[str]]:
    """The metadata in ``path``'s sidecar, and warnings; ``{}`` when there is none or it is stale."""
    path = Path(path)
    side = sidecar_path(path)
    if not side.exists():
        return {}, []
    record = _read_record(side)
    if _is_current(record, path):
        return dict(record["metadata"]), []
    return {}, [StoredNote(f"{side}: was written for a different {path.name} (the file changed since); its stored "
                           "temperature is ignored (run tempcal fit again)")]


@dataclass(frozen=True)
class SidecarState:
    """A file's sidecar: ``state`` "none", "fresh" (written for this version of the file), "stale" (for another: its T
    is ignored) or "broken" (unreadable); ``metadata`` as recorded even when stale, ``detail`` why stale or broken."""

    path: Path
    state: str
    metadata: dict[str, str]
    detail: str | None = None


def sidecar_state(path: str | os.PathLike) -> SidecarState:
    """The state of ``path``'s sidecar, never raising for a stale or broken one (``tempcal inspect`` shows it)."""
    path = Path(path)
    side = sidecar_path(path)
    if not side.exists() and not side.is_symlink():
        return SidecarState(side, "none", {})
    try:
        check_target(side, str(side))
        record = _read_record(side)
        current = _is_current(record, path)
    except TempcalError as exc:
        return SidecarState(side, "broken", {}, str(exc))
    if not current:
        return SidecarState(side, "stale", dict(record["metadata"]), "it was written for a different version of "
                            f"{path.name} (size or contents changed since)")
    return SidecarState(side, "fresh", dict(record["metadata"]))


def _is_current(record: dict[str, Any], path: Path) -> bool:
    """The sidecar was written for this version of ``path``: the size matches, and the mtime or (computed only when
    the mtime differs) the SHA-256."""
    stat = path.stat()
    return record["size"] == stat.st_size and (record["mtime_ns"] == stat.st_mtime_ns
                                               or record["sha256"] == file_sha256(path))


def sidecar_temperature(path: str | os.PathLike) -> tuple[float | None, list[str]]:
    """The T stored in ``path``'s current sidecar (None when there is none), and warnings about it."""
    path = Path(path)
    check_regular_file(path)
    metadata, notes = read_sidecar(path)
    return stored_temperature(metadata.get(TEMPERATURE_KEY), f"{sidecar_path(path)}:"), notes


#: A sidecar holds a few keys: anything larger is not one of tempcal's.
MAX_SIDECAR_BYTES = 1 << 20
#: A sidecar nests two levels; JSON nested deeper than this is not one.
MAX_SIDECAR_DEPTH = 64
#: Integers of more digits are not a size or a time (the default of Python's own limit on reading an int).
MAX_SIDECAR_DIGITS = 4300


def _read_record(side: Path) -> dict[str, Any]:
    """The sidecar's JSON: a regular file (never a FIFO or device, opened without blocking) of at most
    :data:`MAX_SIDECAR_BYTES`, of bounded nesting and digits, holding the keys a sidecar has."""
    try:
        record = load_json(read_regular(side, MAX_SIDECAR_BYTES).decode("utf-8"), max_depth=MAX_SIDECAR_DEPTH,
                           max_int_digits=MAX_SIDECAR_DIGITS)
    except NotRegularFile:
        raise TempcalError(f"{side}: not a regular file, so not a tempcal sidecar; remove it") from None
    except TooLarge as exc:
        raise TempcalError(f"{side}: {exc.size_text}, more than a tempcal sidecar holds ({MAX_SIDECAR_BYTES}); "
                           "fix or delete it") from None
    except OSError as exc:
        raise TempcalError(f"{side}: cannot read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise TempcalError(f"{side}: not a tempcal sidecar (not UTF-8 JSON); fix or delete it") from None
    except (JsonTooDeep, JsonLongInteger) as exc:
        why = "nested too deeply" if isinstance(exc, JsonTooDeep) else "a number too long to read"
        raise TempcalError(f"{side}: not a tempcal sidecar ({why}); fix or delete it") from None
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


def write_sidecar(path: str | os.PathLike, temperature: float, *, metadata: Mapping[str, str] | None = None,
                  updates: Mapping[str, str | None] | None = None) -> Path:
    """Store ``temperature`` (and ``updates``; a None value removes its key) in ``path``'s sidecar, atomically, and
    return its path. Other metadata of a current sidecar is kept; a malformed or stale one is replaced."""
    path = Path(path)
    temperature = as_temperature(temperature)
    check_regular_file(path)
    side = sidecar_path(path)
    check_target(side, str(side))  # a planted link or device: refused before the file is hashed
    if metadata is None:
        metadata = current_metadata(path)
    metadata = updated_metadata(metadata, updates)
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
    mode = None if side.exists() else stat.st_mode & 0o666 | 0o200
    write_atomic(side, lambda f: f.write(text.encode("utf-8")), what="", mode=mode)
    return side


def write_sidecar_copy(source: Path, temperature: float, output: Path, *,
                       updates: Mapping[str, str | None] | None = None) -> Path:
    """Copy ``source`` byte for byte to ``output`` (same suffix) and give the copy a sidecar holding T (and
    ``updates``, as :func:`write_sidecar` sets them)."""
    if output.suffix.lower() != source.suffix.lower():
        raise TempcalError(f"{param('output')} {output}: must have the suffix of SOURCE ({source.suffix}); "
                           "tempcal copies the file and stores T in the copy's sidecar")
    check_regular_file(source)
    metadata = current_metadata(source)
    if not output.is_symlink() and output.exists() and os.path.samefile(output, source):
        return write_sidecar(source, temperature, metadata=metadata, updates=updates)
    check_target(output, f"{param('output')} {output}")
    check_target(sidecar_path(output), str(sidecar_path(output)))  # both refused before either is written

    def copy(out: BinaryIO) -> None:
        with open(source, "rb") as src:
            shutil.copyfileobj(src, out, HASH_BLOCK)

    mode = None if output.exists() else source.stat().st_mode & 0o7777 | 0o200
    write_atomic(output, copy, what=param("output"), mode=mode)
    return write_sidecar(output, temperature, metadata=metadata, updates=updates)


def current_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The metadata of ``path``'s current sidecar; none when it is missing, stale or broken (reported when its T is
    asked for, or about to be replaced)."""
    try:
        return read_sidecar(path)[0]
    except TempcalError:
        return {}


__all__ = ["current_metadata", "read_sidecar", "sidecar_state", "sidecar_temperature", "write_sidecar",
           "write_sidecar_copy"]
