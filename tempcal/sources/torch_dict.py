"""``.pt`` / ``.pth`` dicts of tensors as SOURCE (T in a sidecar), read with ``torch.load(weights_only=True)`` only,
after the storages the pickle declares are bounded from its opcodes (:func:`check_storages`), never running it."""

from __future__ import annotations

import io
import pickletools
import re
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import TempcalError, param, shown
from ..models.detect import archive_kind
from .base import OpenedSource, SourceOptions
from .described import tensor_entry
from .memory import (
    PICKLE_MAGIC,
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


class TorchDictKind(InMemoryKind):
    name = "pt"
    title = "torch.save dict of tensors"

    def open(self, paths: list[Path], options: SourceOptions, *, labels_optional: bool = False) -> OpenedSource:
        path = paths[0]
        loaded = load_pt_dict(path)
        logits = _pt_tensor(loaded, path, options.logits_key, param("logits_key"))
        has_labels = options.labels_key in loaded or not labels_optional
        labels = _pt_tensor(loaded, path, options.labels_key, param("labels_key")) if has_labels else None
        return self.open_arrays(path, logits, labels, options)

    def describe_tensors(self, paths: list[Path], options: SourceOptions) -> list[dict[str, Any]]:
        """Every entry of the dict: tensors with their shapes, anything else by its type."""
        import torch

        path = paths[0]
        return [tensor_entry(path, str(name), value.shape, str(value.dtype).removeprefix("torch."), options)
                if isinstance(value, torch.Tensor)
                else {**tensor_entry(path, str(name), None, type(value).__name__, options), "role": None}
                for name, value in load_pt_dict(path).items()]

    def read_array(self, path: Path, key: str, option: str) -> torch.Tensor:
        return _pt_tensor(load_pt_dict(path), path, key, option)


def load_pt_dict(path: Path) -> Mapping:
    """A ``torch.save`` dict, read with ``weights_only=True`` after its declared storage sizes are checked
    (tensors memory-mapped where the format allows)."""
    import pickle

    import torch

    head = magic(path)
    zipped = head.startswith(ZIP_MAGIC)
    if not zipped and not head.startswith(PICKLE_MAGIC):
        raise TempcalError(f"{path}: not a torch.save file (neither a zip archive nor a pickle at its start)")
    if zipped and archive_kind(path) == "torchscript":
        raise TempcalError(f"{path}: is a TorchScript model, not a dict of tensors; pass a model with "
                           f"{param('inputs')} DATA.safetensors, or save its logits with "
                           "torch.save({'logits': ..., 'labels': ...}, PATH)")
    check_storages(path, zipped)  # the sizes the pickle declares, bounded before torch allocates or maps them
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
            reason = detail[0] if "WeightsUnpickler error:" in text and detail else first_line(exc)
            raise TempcalError(f"{path}: not a readable torch.save file of tensors ({reason}); tempcal reads .pt "
                               "files with torch.load(weights_only=True) only") from None
        hint = " (numpy arrays: save torch tensors or an .npz instead)" if "numpy" in found.group(1) else ""
        raise TempcalError(f"{path}: refused: it needs the Python object {found.group(1)}{hint}; tempcal reads .pt "
                           "files with torch.load(weights_only=True) only and never unpickles arbitrary objects"
                           ) from None
    except Exception as exc:  # the weights-only unpickler fails on damaged files with assorted exceptions
        raise TempcalError(f"{path}: not a readable torch.save file ({type(exc).__name__}: "
                           f"{first_line(exc)})") from None
    if not isinstance(loaded, Mapping):
        raise TempcalError(f"{path}: holds a {type(loaded).__name__}, not a dict of tensors "
                           "(save it with torch.save({'logits': ..., 'labels': ...}, PATH))")
    return loaded


def _pt_tensor(loaded: Mapping, path: Path, key: str, option: str) -> torch.Tensor:
    """The tensor ``key`` of a loaded dict (dense); a missing key names the keys present and ``option``."""
    import torch

    if key not in loaded:
        raise missing(path, "tensor", key, tuple(str(k) for k in loaded), option)
    value = loaded[key]
    if not isinstance(value, torch.Tensor):
        raise TempcalError(f"{path}: '{key}' is a {type(value).__name__}, not a tensor")
    return value if value.layout == torch.strided else value.to_dense()


_MARK = object()
_PUTS = ("PUT", "BINPUT", "LONG_BINPUT")
_GETS = ("GET", "BINGET", "LONG_BINGET")


@dataclass(frozen=True)
class _Global:
    module: str
    name: str


@dataclass(frozen=True)
class Storage:
    """A storage a pickle refers to: its key, type (``FloatStorage``), element count and bytes (None: unknown)."""

    key: str
    type_name: str
    numel: int
    nbytes: int | None


class _Bounded:
    """A binary file read no further than ``size`` bytes: a length the pickle declares costs at most what is there."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.size = f, size

    def _left(self, n: int | None) -> int:
        left = max(0, self.size - self.f.tell())
        return left if n is None or n < 0 else min(n, left)

    def read(self, n: int | None = -1) -> bytes:
        return self.f.read(self._left(n))

    def readline(self, n: int | None = -1) -> bytes:
        return self.f.readline(self._left(n))


def check_storages(path: Path, zipped: bool) -> None:
    """Every storage the file declares fits in what holds it (its member; the file), and in memory when read."""
    size = path.stat().st_size
    try:
        if zipped:
            _check_zip(path, size)
        else:
            _check_legacy(path, size)
    except OSError as exc:
        raise TempcalError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _check_zip(path: Path, size: int) -> None:
    """Zip format: each storage ``K`` is the member ``ROOT/data/K``, stored uncompressed (torch maps it)."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise TempcalError(f"{path}: not a readable torch.save file ({first_line(exc)})") from None
    with archive:
        members = {info.filename: info for info in archive.infolist()}
        for info in members.values():
            checked_member(path, info, size, "torch.save writes its members uncompressed")
        pickles = [name for name in members if name.count("/") == 1 and name.endswith("/data.pkl")]
        if len(pickles) != 1:
            return  # not torch.save's layout: torch.load says what is wrong
        root = pickles[0].split("/")[0]
        try:
            storages = declared_storages(io.BytesIO(archive.read(pickles[0])), path, pickles[0])
        except (zipfile.BadZipFile, EOFError) as exc:
            raise TempcalError(f"{path}: cannot read {shown(pickles[0])} ({first_line(exc)})") from None
    for storage in storages:
        _check_member(path, storage, members.get(f"{root}/data/{storage.key}"), f"{root}/data/{storage.key}")


def _check_member(path: Path, storage: Storage, info: zipfile.ZipInfo | None, name: str) -> None:
    what = f"{path}: storage {shown(storage.key)} ({storage.numel} elements of {storage.type_name})"
    if info is None:
        raise TempcalError(f"{what}: the archive has no member {shown(name)} to hold it")
    if info.compress_type != zipfile.ZIP_STORED:
        raise TempcalError(f"{what}: member {shown(name)} is compressed; torch.save writes storages uncompressed "
                           "and torch.load maps them as they are")
    if storage.nbytes is not None and storage.nbytes > info.file_size:
        raise TempcalError(f"{what}: declares {storage.nbytes} bytes but member {shown(name)} holds "
                           f"{info.file_size} (truncated or damaged)")


def _check_legacy(path: Path, size: int) -> None:
    """Legacy format: four pickles (magic number, protocol, system, the object), then every storage's bytes."""
    with open(path, "rb") as raw:
        f = _Bounded(raw, size)
        for _ in range(3):
            declared_storages(f, path)
        storages = declared_storages(f, path)
    total = sum({s.key: s.nbytes or 0 for s in storages}.values())
    if total > size:
        raise TempcalError(f"{path}: its pickle declares {len(storages)} storages of {total} bytes in all, more than "
                           f"the {size} bytes of the file (truncated or damaged)")
    check_fits(path, "its storages", total)


def declared_storages(f: Any, path: Path, member: str | None = None) -> list[Storage]:
    """The storages one pickle (from ``f``'s position to its STOP; in ``member`` of a zip) names by persistent id;
    never runs it."""
    where = f"{path}: {shown(member)}" if member else str(path)
    stack: list[Any] = []
    memo: dict[Any, Any] = {}
    found: list[Storage] = []
    try:
        for op, arg, _ in pickletools.genops(f):
            pid = _step(stack, memo, op, arg)
            if pid is not None:
                found.append(_storage(pid, where))
            if op.name == "STOP":
                break
    except (ValueError, IndexError, KeyError, TypeError, EOFError, UnicodeDecodeError) as exc:
        inside = f"{shown(member)}: " if member else "its pickle: "
        raise TempcalError(f"{path}: not a readable torch.save file ({inside}{first_line(exc)})") from None
    return found


def _step(stack: list[Any], memo: dict[Any, Any], op: Any, arg: Any) -> Any:
    """Apply one opcode's effect on the stack and memo; a persistent id it consumes is returned."""
    name = op.name
    if name == "MARK":
        stack.append(_MARK)
    elif name in _PUTS or name == "MEMOIZE":
        memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1]
    elif name in _GETS:
        stack.append(memo.get(arg))
    elif name == "GLOBAL":
        module, _, attr = str(arg).partition(" ")
        stack.append(_Global(module, attr))
    else:
        items = _pop_mark(stack) if pickletools.markobject in op.stack_before else []
        count = sum(1 for x in op.stack_before if x not in (pickletools.markobject, pickletools.stackslice))
        if len(stack) < count:
            raise IndexError(f"opcode {name} at an empty stack")
        popped = stack[len(stack) - count:]
        del stack[len(stack) - count:]
        if name == "BINPERSID":
            stack.append(None)
            return popped[0] if isinstance(popped[0], tuple) and popped[0][:1] == ("storage",) else None
        stack.extend(_results(name, op, arg, items, popped))
    return None


def _pop_mark(stack: list[Any]) -> list[Any]:
    """The items above the topmost mark, removed with it."""
    for at in range(len(stack) - 1, -1, -1):
        if stack[at] is _MARK:
            items = stack[at + 1:]
            del stack[at:]
            return items
    raise IndexError("no mark on the stack")


def _results(name: str, op: Any, arg: Any, items: list[Any], popped: list[Any]) -> list[Any]:
    """What an opcode pushes: tuples and literal values as they are, anything else as an unknown (None)."""
    if name == "TUPLE":
        return [tuple(items)]
    if name in ("TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_TUPLE"):
        return [tuple(popped)]
    if name == "STACK_GLOBAL":
        return [_Global(str(popped[0]), str(popped[1]))]
    if not op.stack_before and len(op.stack_after) == 1 and op.arg is not None:
        return [arg]  # an integer, string or bytes literal
    return [None] * len(op.stack_after)


def _storage(pid: tuple, where: str) -> Storage:
    """``('storage', TYPE, KEY, LOCATION, NUMEL, ...)``, checked; its bytes from the type's element size."""
    padded = (*pid, None, None, None, None)
    kind, key, numel = padded[1], padded[2], padded[4]
    if not isinstance(key, str) or not isinstance(numel, int) or isinstance(numel, bool) or numel < 0:
        raise TempcalError(f"{where}: a storage is declared as {shown(pid)}, not (type, key, location, count)")
    type_name = kind.name if isinstance(kind, _Global) else "an unknown type"
    itemsize = _itemsize(kind) if isinstance(kind, _Global) and kind.module in ("torch", "torch.storage") else None
    return Storage(key, type_name, numel, None if itemsize is None else numel * itemsize)


def _itemsize(kind: _Global) -> int | None:
    """Bytes per element of the torch storage class ``kind`` names (None: not a storage class torch has)."""
    import torch

    if not kind.name.endswith("Storage"):
        return None
    cls = getattr(torch, kind.name, None)
    if cls is torch.UntypedStorage:  # its count is in bytes
        return 1
    with warnings.catch_warnings():  # typed storages are deprecated; their dtype is still what the file means
        warnings.simplefilter("ignore")
        dtype = getattr(cls, "dtype", None)
    return dtype.itemsize if isinstance(dtype, torch.dtype) else None
