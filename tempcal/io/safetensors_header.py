"""Safetensors headers, read and checked before any tensor is; T written back into the metadata, refused when the
file changed since it was read (its identity kept with the header; the check and the rename under ``flock``)."""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import math
import os
import shutil
import stat
import struct
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TEMPERATURE_KEY, TempcalError, format_temperature, shown, stored_temperature
from .paths import READ_FLAGS, atomic_path

try:
    import fcntl
except ImportError:  # not POSIX: no advisory locks; the unchanged-source check still runs
    fcntl = None  # type: ignore[assignment]

#: Each safetensors dtype: bytes per element and torch's name for it (the one table of them).
DTYPES: dict[str, tuple[int, str]] = {
    "BOOL": (1, "bool"), "U8": (1, "uint8"), "I8": (1, "int8"), "F8_E5M2": (1, "float8_e5m2"),
    "F8_E4M3": (1, "float8_e4m3fn"), "I16": (2, "int16"), "U16": (2, "uint16"), "F16": (2, "float16"),
    "BF16": (2, "bfloat16"), "I32": (4, "int32"), "U32": (4, "uint32"), "F32": (4, "float32"), "I64": (8, "int64"),
    "U64": (8, "uint64"), "F64": (8, "float64"),
}
#: The floating-point dtypes logits and hidden states may have.
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
#: A header larger than this is refused before it is read (safetensors itself caps it at 100 MB).
MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class FileStamp:
    """What identifies one version of a file: a change to any of these means it is not the file that was read."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStamp:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def change_to(self, now: FileStamp | None) -> str | None:
        """How the file changed from this stamp to ``now`` (None: it did not)."""
        if now == self:
            return None
        if now is None:
            return "it was removed"
        if (now.device, now.inode) != (self.device, self.inode):
            return "it was replaced by another file"
        if now.size != self.size:
            return f"its size went from {self.size} to {now.size} bytes"
        return "it was modified (new mtime)"


def check_unchanged(path: str | os.PathLike, stamp: FileStamp | None, *, since: str = "tempcal read it") -> None:
    """Refuse to go on when ``path`` (links followed) is no longer the file ``stamp`` was taken of."""
    if stamp is None:
        return
    try:
        now: FileStamp | None = FileStamp.of(os.stat(path))
    except OSError:
        now = None
    change = stamp.change_to(now)
    if change is not None:
        raise TempcalError(f"{path}: changed since {since} ({change}); nothing written, run tempcal again")


#: The stamp of each file (by real path) when this process last read its header or wrote it.
_LOADED: dict[str, FileStamp] = {}


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    begin: int  # offsets relative to the start of the data section
    end: int


@dataclass(frozen=True)
class Header:
    """A checked safetensors header: every tensor's bytes lie inside the file and do not overlap."""

    path: Path
    header_bytes: int  # length of the JSON header (the data section starts at 8 + header_bytes)
    metadata: dict[str, str]
    tensors: dict[str, TensorInfo]
    file_size: int
    #: The file's identity when the header was read (None for a header not read from a file).
    stamp: FileStamp | None = field(default=None, compare=False, repr=False)

    @property
    def data_start(self) -> int:
        return 8 + self.header_bytes

    def stored_temperature(self) -> float | None:
        """The T a previous ``tempcal fit`` wrote into the metadata, if any."""
        return stored_temperature(self.metadata.get(TEMPERATURE_KEY), f"{self.path}: metadata")

    def torch_dtype(self, key: str):
        """The torch dtype of tensor ``key``."""
        import torch

        return getattr(torch, DTYPES[self.tensors[key].dtype][1])


def dtype_name(dtype: str) -> str:
    """A safetensors dtype as torch names it ("F32" -> "float32"), for messages."""
    return DTYPES[dtype][1] if dtype in DTYPES else dtype


def dtype_code(dtype: object) -> str:
    """safetensors' code of a torch dtype (``torch.float32`` -> "F32")."""
    name = str(dtype).removeprefix("torch.")
    return next(code for code, (_, torch_name) in DTYPES.items() if torch_name == name)


def laid_out(tensors: Iterable[tuple[str, str, Sequence[int]]]) -> dict[str, TensorInfo]:
    """``(name, dtype code, shape)`` of tensors stored one after another, in order, from the data section's start."""
    infos, offset = {}, 0
    for name, code, shape in tensors:
        size = DTYPES[code][0] * math.prod(shape)
        infos[name] = TensorInfo(code, tuple(shape), offset, offset + size)
        offset += size
    return infos


def encode_header(tensors: Mapping[str, TensorInfo], metadata: Mapping[str, str] | None = None) -> bytes:
    """The 8-byte little-endian length plus the JSON header, padded with spaces to 8-byte alignment as safetensors
    writes it (``__metadata__`` first, left out when empty)."""
    entries: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    for name, info in tensors.items():
        entries[name] = {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": [info.begin, info.end]}
    text = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def read_header(path: str | os.PathLike, *, record: bool = True) -> Header:
    """Parse and check a safetensors header (its declared length against the file's size first); any problem is one
    line (:class:`TempcalError`). Its stamp is recorded (unless not ``record``): a later write-back refuses changes."""
    path = Path(path)
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise TempcalError(f"{path}: no such file") from None
        if exc.errno in (errno.EISDIR, errno.ENXIO):
            raise TempcalError(f"{path}: not a regular file") from None
        raise TempcalError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise TempcalError(f"{path}: not a regular file")
        with open(fd, "rb", closefd=True) as f:
            size = st.st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise TempcalError(f"{path}: not a safetensors file ({size} bytes, too short for a header)")
            (length,) = struct.unpack("<Q", prefix)
            if length > min(size - 8, MAX_HEADER_BYTES):
                raise TempcalError(f"{path}: not a safetensors file or truncated (header claims {length} bytes, "
                                   f"the file has {size - 8} after the length field)")
            raw = f.read(length)
            if len(raw) < length:
                raise TempcalError(f"{path}: changed while tempcal was reading it (now shorter than its header); "
                                   "run tempcal again")
    except OSError as exc:
        raise TempcalError(f"{path}: cannot read ({exc.strerror or exc})") from None
    parsed = _parse_json(path, raw)
    metadata = parsed.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise TempcalError(f"{path}: safetensors metadata must map strings to strings")
    data_size = size - 8 - length
    tensors = {name: _tensor_info(path, name, entry, data_size) for name, entry in parsed.items()}
    spans = sorted((t.begin, t.end, name) for name, t in tensors.items() if t.end > t.begin)
    for (_, end_a, name_a), (begin_b, _, name_b) in itertools.pairwise(spans):
        if begin_b < end_a:
            raise TempcalError(f"{path}: tensors {shown(name_a)} and {shown(name_b)} overlap in the file")
    stamp = FileStamp.of(st)
    if record:
        _LOADED[os.path.realpath(path)] = stamp
    return Header(path, length, metadata, tensors, size, stamp)


def _parse_json(path: Path, raw: bytes) -> dict:
    """The header as a dict; bad UTF-8, bad JSON, absurd nesting or number sizes and duplicate keys are refused."""

    def no_duplicates(pairs: list[tuple[str, object]]) -> dict:
        found = dict(pairs)
        if len(found) < len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise _Duplicate(key)
                seen.add(key)
        return found

    try:
        parsed = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except _Duplicate as exc:
        raise TempcalError(f"{path}: not a valid safetensors header (key {shown(exc.args[0])} appears twice)") from None
    except (ValueError, RecursionError):  # bad UTF-8 or JSON, integers past Python's digit limit, deep nesting
        raise TempcalError(f"{path}: not a safetensors file (header is not UTF-8 JSON)") from None
    if not isinstance(parsed, dict):
        raise TempcalError(f"{path}: not a safetensors file (header is not a JSON object)")
    return parsed


class _Duplicate(Exception):
    """A key the header holds twice (its one argument)."""


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _tensor_info(path: Path, name: str, entry, data_size: int) -> TensorInfo:
    where = f"{path}: tensor {shown(name)}"
    if not isinstance(entry, dict):
        raise TempcalError(f"{where}: header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise TempcalError(f"{where}: unknown dtype {shown(dtype)}")
    if not (isinstance(shape, list) and all(_is_count(s) for s in shape)):
        raise TempcalError(f"{where}: shape {shown(shape)} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise TempcalError(f"{where}: data_offsets {shown(offsets)} is not [begin, end]")
    begin, end = offsets
    expected = _byte_count(shape, DTYPES[dtype][0], data_size)
    if end < begin or end - begin != expected:
        needs = f"{expected}" if expected <= data_size else f"more than the {data_size} data"
        raise TempcalError(f"{where}: shape {shown(shape)} of {dtype} needs {needs} bytes, "
                           f"data_offsets give {end - begin}")
    if end > data_size:
        raise TempcalError(f"{where}: data ends at byte {end} but the file holds {data_size} data bytes "
                           "(truncated?)")
    return TensorInfo(dtype, tuple(shape), begin, end)


def _byte_count(shape: list[int], itemsize: int, limit: int) -> int:
    """Bytes a tensor of ``shape`` needs, or any number above ``limit`` once it exceeds it (a hostile shape costs
    no time)."""
    if 0 in shape:
        return 0
    count = itemsize
    for dim in shape:
        count *= dim
        if count > limit:
            return limit + 1
    return count


def read_tensor(header: Header, key: str, *, option: str):
    """Load one tensor named ``key``; a missing key lists the keys present and the option to rename it."""
    if key not in header.tensors:
        present = ", ".join(shown(k) for k in itertools.islice(header.tensors, 20)) or "none"
        if len(header.tensors) > 20:
            present += f" and {len(header.tensors) - 20} more"
        raise TempcalError(f"{header.path}: no tensor {shown(key)} (keys present: {present}; choose one with {option})")
    from safetensors import safe_open

    try:
        with safe_open(str(header.path), framework="pt") as f:
            tensor = f.get_tensor(key)
    except Exception as exc:  # whatever the reader makes of a hostile file, the user gets one line
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TempcalError(f"{header.path}: cannot read tensor {shown(key)}: {first}") from None
    check_unchanged(header.path, header.stamp, since="tempcal read its header")
    return tensor


# -- write-back: T into the metadata, the tensors' bytes copied unchanged -------------------------------------
COPY_BLOCK = 1 << 20
#: How long a write-back waits for another one's check-and-rename on the same file.
LOCK_WAIT_SECONDS = 30.0


def write_temperature(source: str | os.PathLike, temperature: float, output: str | os.PathLike | None = None,
                      *, expected: Header | None = None, metadata: Mapping[str, str | None] | None = None) -> Path:
    """Write ``temperature`` as ``tempcal.temperature`` into ``source`` (or a copy at ``output``), other metadata kept
    (``metadata`` set, a None value removing its key) and tensor bytes copied unchanged; the path written. Nothing is
    written when ``source`` changed since ``expected`` was read (by default: since this process last read or wrote)."""
    stamp = expected.stamp if expected is not None else _LOADED.get(os.path.realpath(source))
    check_unchanged(source, stamp)  # before parsing: "it changed" says more than "it is truncated"
    header = read_header(source, record=False)
    if stamp is not None and stamp.change_to(header.stamp) is not None:
        check_unchanged(source, stamp)
    kept = updated_metadata(header.metadata, metadata)
    kept[TEMPERATURE_KEY] = format_temperature(temperature)
    # SOURCE given as a link is the user's choice: T goes into the file it names. A link at ``output`` is refused.
    destination = Path(source if output is None else output)
    if output is None and destination.is_symlink():
        destination = Path(os.path.realpath(destination))
    copy_with_header(destination, header, encode_header(header.tensors, kept))
    return destination


def updated_metadata(metadata: Mapping[str, str], updates: Mapping[str, str | None] | None) -> dict[str, str]:
    """``metadata`` with ``updates`` applied: a string sets its key, None removes it."""
    return {key: value for key, value in {**metadata, **(updates or {})}.items() if value is not None}


def copy_with_header(destination: Path, header: Header, new_header: bytes) -> None:
    """Write ``new_header`` + the source's data section to ``destination`` atomically, under the source's lock;
    a new file gets SOURCE's mode plus the owner's write bit (a copy of a read-only source stays writable)."""
    mode = None if os.path.lexists(destination) else header.path.stat().st_mode & 0o7777 | 0o200
    with atomic_path(destination, what="", mode=mode,
                     guard=lambda: _unchanged_under_lock(header)) as temporary, \
            open(temporary, "wb") as out, open(header.path, "rb") as src:
        check_unchanged(header.path, header.stamp, since="tempcal read it")
        out.write(new_header)
        src.seek(header.data_start)
        shutil.copyfileobj(src, out, COPY_BLOCK)
        if out.tell() != len(new_header) + header.file_size - header.data_start:
            raise TempcalError(f"{header.path}: changed while tempcal was copying it (its size changed); "
                               "nothing written, run tempcal again")
        out.flush()
        written = os.fstat(out.fileno())
    _LOADED[os.path.realpath(destination)] = FileStamp.of(written)


@contextlib.contextmanager
def _unchanged_under_lock(header: Header) -> Iterator[None]:
    """Hold the source's write-back lock (a bounded wait; closing the file releases it) and check it is still the
    version read: another tempcal cannot rename between this check and our rename."""
    with open(header.path, "rb") as src:
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while fcntl is not None:
            try:
                fcntl.flock(src.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TempcalError(f"{header.path}: another tempcal has held its write-back lock for over "
                                       f"{LOCK_WAIT_SECONDS:g} s; nothing written") from None
                time.sleep(0.005)
            except OSError:  # no locks on this file system (some network mounts)
                break
        check_unchanged(header.path, header.stamp, since="tempcal read it")
        yield
