"""The files of a Hugging Face model folder, read as untrusted input: JSON bounded, plain file names, and links
followed only inside the folder or, in the hub's cache, into the repository's ``blobs/``."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from ..errors import TempcalError, shown
from .bounded_read import JsonLongInteger, JsonTooDeep, load_json
from .paths import NotRegularFile, TooLarge, read_regular

#: Largest ``config.json`` read (configurations are a few kB; label maps of 20k classes about 1 MB).
MAX_CONFIG_BYTES = 16 << 20
#: Largest index read (the largest checkpoints' indexes, ~100k tensors, are about 15 MB).
MAX_INDEX_BYTES = 64 << 20
#: Most shard files an index may name.
MAX_SHARDS = 65_536
#: Deepest nesting of arrays and objects read (configurations nest a few levels).
MAX_DEPTH = 100
#: Most digits of an integer read (Python itself refuses past 4,300; configurations hold ids and sizes).
MAX_INT_DIGITS = 100
INDEX_NAME, SINGLE_NAME, CONFIG_NAME = "model.safetensors.index.json", "model.safetensors", "config.json"


def read_json(folder: Path, name: str, limit: int) -> Any:
    """The JSON file ``folder/name`` (see :func:`checkpoint_file`), at most ``limit`` bytes, its nesting and integers
    bounded (:data:`MAX_DEPTH`, :data:`MAX_INT_DIGITS`); any problem is one line naming the file and where in it."""
    path = checkpoint_file(folder, name)
    try:
        return load_json(read_regular(path, limit).decode("utf-8"), max_depth=MAX_DEPTH, max_int_digits=MAX_INT_DIGITS)
    except NotRegularFile:
        raise TempcalError(f"{path}: not a regular file") from None
    except TooLarge as exc:
        raise TempcalError(f"{path}: {exc.size_text}, more than the {limit} tempcal reads from a {name}") from None
    except OSError as exc:
        raise TempcalError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise TempcalError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except JsonTooDeep as exc:
        raise TempcalError(f"{path}: {exc.at}nested more than {MAX_DEPTH} levels deep") from None
    except JsonLongInteger as exc:
        raise TempcalError(f"{path}: {exc.at}an integer of more than {MAX_INT_DIGITS} digits") from None
    except json.JSONDecodeError as exc:
        raise TempcalError(f"{path}: line {exc.lineno} column {exc.colno}: not valid JSON ({exc.msg})") from None


def cache_blobs(folder: Path) -> Path | None:
    """The hub cache's ``blobs/`` of the repository whose snapshot ``folder`` (resolved) is, else None."""
    snapshots = folder.parent
    repo = snapshots.parent
    if snapshots.name == "snapshots" and repo.name.startswith("models--") and (repo / "blobs").is_dir():
        return (repo / "blobs").resolve()
    return None


def checkpoint_file(folder: Path, name: str) -> Path:
    """``folder/name``, checked to be a regular file, a link only to a file inside the folder or inside the cache
    repository's ``blobs/`` (:func:`cache_blobs`); returned as named, so that messages name the folder's file."""
    path = folder / name
    try:
        home = folder.resolve(strict=True)
        real = path.resolve(strict=True)
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        raise TempcalError(f"{path}: no such file" + (" (a link whose target is missing)" if path.is_symlink()
                                                      else "")) from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a loop of links
        raise TempcalError(f"{path}: cannot follow its path ({getattr(exc, 'strerror', None) or exc})") from None
    blobs = cache_blobs(home)
    if not (real.is_relative_to(home) or (blobs is not None and real.is_relative_to(blobs))):
        inside = f"{folder} or its cache repository's blobs/" if blobs is not None else str(folder)
        raise TempcalError(f"{path}: a link to {real}, outside {inside}; tempcal reads a model folder's own files only")
    if not stat.S_ISREG(mode):
        raise TempcalError(f"{path}: not a regular file")
    return path


def check_model_folder(folder: Path, option: str) -> None:
    """``folder`` names an existing folder (a model saved locally), else one line naming ``option`` and the folder."""
    if not folder.exists():
        raise TempcalError(f"{option} {folder}: no such folder (tempcal runs a model saved in a local folder; "
                           "download it first, e.g. with huggingface-cli download)")
    if not folder.is_dir():
        raise TempcalError(f"{option} {folder}: not a folder; MODEL is a Hugging Face model folder (config.json, "
                           "model.safetensors, the tokenizer's files)")


def weight_map(folder: Path) -> dict[str, str] | None:
    """Each tensor of a sharded checkpoint and its shard's file name (checked, not yet opened); None: no index."""
    index = folder / INDEX_NAME
    if not index.exists() and not index.is_symlink():
        return None
    parsed = read_json(folder, INDEX_NAME, MAX_INDEX_BYTES)
    found = parsed.get("weight_map") if isinstance(parsed, dict) else None
    if not isinstance(found, dict):
        raise TempcalError(f"{index}: not a safetensors index (no 'weight_map' object)")
    shards: set[str] = set()
    for tensor, file in found.items():
        if not _plain_name(file):
            raise TempcalError(f"{index}: 'weight_map' entry {shown(tensor)}: {shown(file)} is not the name of a "
                               "file in the folder")
        shards.add(file)
        if len(shards) > MAX_SHARDS:
            raise TempcalError(f"{index}: 'weight_map' names more than {MAX_SHARDS} shard files")
    return found


def _plain_name(file: object) -> bool:
    """A file name without a folder: no separator, no NUL, not ``.`` or ``..``."""
    return (isinstance(file, str) and file not in ("", ".", "..") and "/" not in file and "\\" not in file
            and "\x00" not in file)


__all__ = ["CONFIG_NAME", "INDEX_NAME", "MAX_CONFIG_BYTES", "SINGLE_NAME", "check_model_folder", "checkpoint_file",
           "read_json", "weight_map"]
