"""Reading logits files: the safetensors header is checked against the file before any tensor is read."""

from __future__ import annotations

import itertools
import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import TempcalError

TEMPERATURE_KEY = "tempcal.temperature"
#: Bytes per element of each safetensors dtype.
DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
               "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
#: A header larger than this is refused before it is read (safetensors itself caps it at 100 MB).
MAX_HEADER_BYTES = 100_000_000


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

    @property
    def data_start(self) -> int:
        return 8 + self.header_bytes

    def stored_temperature(self) -> float | None:
        """The T a previous ``tempcal fit`` wrote into the metadata, if any."""
        text = self.metadata.get(TEMPERATURE_KEY)
        if text is None:
            return None
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise TempcalError(f"{self.path}: metadata '{TEMPERATURE_KEY}' is {text!r}, not a positive number")
        return value


def read_header(path: str | os.PathLike) -> Header:
    """Parse and check a safetensors header; any problem is a one-line :class:`TempcalError`."""
    path = Path(path)
    if not path.exists():
        raise TempcalError(f"{path}: no such file")
    if not path.is_file():
        raise TempcalError(f"{path}: not a regular file")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise TempcalError(f"{path}: not a safetensors file ({size} bytes, too short for a header)")
            (length,) = struct.unpack("<Q", prefix)
            if length > min(size - 8, MAX_HEADER_BYTES):
                raise TempcalError(f"{path}: not a safetensors file or truncated (header claims {length} bytes, "
                                   f"the file has {size - 8} after the length field)")
            raw = f.read(length)
    except OSError as exc:
        raise TempcalError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        parsed = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise TempcalError(f"{path}: not a safetensors file (header is not UTF-8 JSON)") from None
    if not isinstance(parsed, dict):
        raise TempcalError(f"{path}: not a safetensors file (header is not a JSON object)")
    metadata = parsed.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise TempcalError(f"{path}: safetensors metadata must map strings to strings")
    data_size = size - 8 - length
    tensors = {name: _tensor_info(path, name, entry, data_size) for name, entry in parsed.items()}
    spans = sorted((t.begin, t.end, name) for name, t in tensors.items() if t.end > t.begin)
    for (_, end_a, name_a), (begin_b, _, name_b) in itertools.pairwise(spans):
        if begin_b < end_a:
            raise TempcalError(f"{path}: tensors '{name_a}' and '{name_b}' overlap in the file")
    return Header(path, length, metadata, tensors, size)


def _tensor_info(path: Path, name: str, entry, data_size: int) -> TensorInfo:
    where = f"{path}: tensor '{name}'"
    if not isinstance(entry, dict):
        raise TempcalError(f"{where}: header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_SIZES:
        raise TempcalError(f"{where}: unknown dtype {dtype!r}")
    if not (isinstance(shape, list) and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                            for s in shape)):
        raise TempcalError(f"{where}: shape {shape!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and o >= 0
                                                                    for o in offsets)):
        raise TempcalError(f"{where}: data_offsets {offsets!r} is not [begin, end]")
    begin, end = offsets
    expected = math.prod(shape) * DTYPE_SIZES[dtype]
    if end < begin or end - begin != expected:
        raise TempcalError(f"{where}: shape {shape} of {dtype} needs {expected} bytes, "
                           f"data_offsets give {end - begin}")
    if end > data_size:
        raise TempcalError(f"{where}: data ends at byte {end} but the file holds {data_size} data bytes "
                           "(truncated?)")
    return TensorInfo(dtype, tuple(shape), begin, end)


def read_tensor(header: Header, key: str, *, option: str):
    """Load one tensor named ``key``; a missing key lists the keys present and the option to rename it."""
    if key not in header.tensors:
        present = ", ".join(f"'{k}'" for k in header.tensors) or "none"
        raise TempcalError(f"{header.path}: no tensor '{key}' (keys present: {present}; choose one with {option})")
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(header.path), framework="pt") as f:
            return f.get_tensor(key)
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise TempcalError(f"{header.path}: cannot read tensor '{key}': {str(exc).splitlines()[0]}") from None


@dataclass(frozen=True)
class LogitsFile:
    """A loaded logits file: its data, header and the T stored in its metadata (if any)."""

    header: Header
    data: object  # tempcal.data.LogitsData; typed loosely to keep this module torch-free at import

    @property
    def stored_temperature(self) -> float | None:
        return self.header.stored_temperature()


def load_logits(path: str | os.PathLike, *, logits_key: str = "logits", labels_key: str = "labels",
                probs: bool = False) -> LogitsFile:
    """Load and check a safetensors logits file (keys and shapes; values are checked by the first scan)."""
    from .data import as_logits_data

    header = read_header(path)
    logits = read_tensor(header, logits_key, option="--logits-key")
    labels = read_tensor(header, labels_key, option="--labels-key")
    try:
        data = as_logits_data(logits, labels, probs=probs, logits_name=logits_key, labels_name=labels_key)
    except TempcalError as exc:
        raise TempcalError(f"{path}: {exc}") from None
    return LogitsFile(header, data)
