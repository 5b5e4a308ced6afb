"""Tensors written chunk by chunk, never held whole, as safetensors, ``.npz`` or ``.npy``: every dtype and shape is
known before the first chunk, so the header goes first, into :func:`tempcal.io.paths.atomic_path`'s file."""

from __future__ import annotations

import math
import os
import sys
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ..errors import TempcalError
from .paths import atomic_path
from .safetensors_header import dtype_code, encode_header, laid_out

if TYPE_CHECKING:
    import torch

#: The suffixes a streamed output may have.
STREAMED_SUFFIXES = (".safetensors", ".npz", ".npy")


@dataclass(frozen=True)
class Planned:
    """One tensor to write: its name, dtype and shape, and the chunks of its rows (C order), produced on demand."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    chunks: Callable[[], Iterable[torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def output_format(path: str | os.PathLike, label: str) -> str:
    """The format of an output named ``path`` (its suffix), or a one-line error naming the ones written."""
    suffix = Path(path).suffix.lower()
    if suffix not in STREAMED_SUFFIXES:
        shown = f"suffix '{suffix}'" if suffix else "no suffix"
        raise TempcalError(f"{label}: {shown}; expected {', '.join(STREAMED_SUFFIXES)}")
    return suffix


def write_streamed(path: str | os.PathLike, planned: Sequence[Planned], *, metadata: Mapping[str, str] | None = None,
                   what: str = "output") -> Path:
    """Write ``planned`` tensors into ``path`` (format by suffix; ``.npy`` takes one tensor, and no format but
    safetensors keeps ``metadata``), streamed and atomically. Returns ``path``."""
    suffix = output_format(path, f"{what} {path}")
    if suffix == ".npy" and len(planned) != 1:
        raise TempcalError(f"{what} {path}: a .npy file holds one array, not {len(planned)}")
    with atomic_path(path, what=what) as temporary, open(temporary, "wb") as f:
        if suffix == ".safetensors":
            f.write(encode_header(laid_out((t.name, dtype_code(t.dtype), t.shape) for t in planned), metadata or {}))
            for tensor in planned:
                _write_data(f, tensor)
        elif suffix == ".npz":
            with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
                for tensor in planned:
                    with archive.open(f"{tensor.name}.npy", "w", force_zip64=True) as member:
                        _write_npy(member, tensor)  # type: ignore[arg-type]
        else:
            _write_npy(f, planned[0])
    return Path(path)


def _write_npy(f: BinaryIO, tensor: Planned) -> None:
    import numpy as np
    from numpy.lib import format as npy

    descr = npy.dtype_to_descr(np.dtype(str(tensor.dtype).removeprefix("torch.")).newbyteorder("<"))
    npy.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": tuple(tensor.shape)})
    _write_data(f, tensor)


def _write_data(f: BinaryIO, tensor: Planned) -> None:
    """Every chunk's bytes (little-endian, C order), checked against the bytes the header declared."""
    written = 0
    for chunk in tensor.chunks():
        block = chunk.detach().to("cpu", tensor.dtype).contiguous()
        array = block.numpy()
        if sys.byteorder != "little":  # pragma: no cover (no big-endian machine runs the tests)
            array = array.byteswap()
        f.write(array.reshape(-1).data.cast("B") if array.size else b"")
        written += array.nbytes
    if written != tensor.nbytes:
        raise TempcalError(f"'{tensor.name}': {written} bytes were computed where {tensor.nbytes} were declared "
                           f"({list(tensor.shape)} of {tensor.dtype}); nothing written")


__all__ = ["Planned", "output_format", "write_streamed"]
