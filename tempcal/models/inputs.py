"""Inputs files for a model SOURCE: safetensors with ``inputs`` ``[N, ...]`` and (optional) integer ``labels``.

The inputs are read in row slices, never all at once; the labels (N integers) are read whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import torch

from ..errors import DataError, TempcalError, param
from ..io.safetensors_header import check_unchanged, dtype_name, read_header, read_tensor
from ..validation import check_labels
from .base import error_line


class InputsFile:
    """A checked inputs file: the inputs tensor is read in row slices, the labels (if any) whole."""

    def __init__(self, path: str | os.PathLike, inputs_key: str = "inputs") -> None:
        self.path = Path(path)
        self.key = inputs_key
        self.header = read_header(self.path)
        if inputs_key not in self.header.tensors:
            read_tensor(self.header, inputs_key, option=param("inputs_key"))  # raises, listing the keys present
        info = self.header.tensors[inputs_key]
        if not info.shape:
            raise DataError(f"{self.path}: '{inputs_key}' is a scalar; expected inputs [N, ...] with one row per "
                            "sample")
        self.shape = tuple(info.shape)
        self.dtype = info.dtype
        if self.num_samples < 1:
            raise DataError(f"{self.path}: '{inputs_key}' holds no samples (shape {list(self.shape)})")

    @property
    def num_samples(self) -> int:
        return int(self.shape[0])

    def describe(self) -> str:
        return f"{self.path} '{self.key}' {list(self.shape)} {dtype_name(self.dtype)}"

    def labels(self, key: str = "labels", *, optional: bool = False) -> torch.Tensor | None:
        """Integer labels ``[N]`` (``[N, 1]`` is accepted); None when absent and ``optional``."""
        if key not in self.header.tensors and optional:
            return None
        labels = read_tensor(self.header, key, option=param("labels_key"))
        return check_labels(labels, (self.num_samples,), f"{self.path}: ", key, self.key)

    def batches(self, batch_size: int) -> Iterator[tuple[int, int, torch.Tensor]]:
        """``(start, stop, inputs[start:stop])`` read slice by slice from the file."""
        from safetensors import safe_open

        try:
            with safe_open(str(self.path), framework="pt") as f:
                rows = f.get_slice(self.key)
                for start in range(0, self.num_samples, batch_size):
                    stop = min(start + batch_size, self.num_samples)
                    yield start, stop, rows[start:stop]
        except Exception as exc:  # whatever the reader makes of a damaged file: one line
            raise TempcalError(f"{self.path}: cannot read tensor '{self.key}': {error_line(exc)}") from None
        check_unchanged(self.path, self.header.stamp, since="tempcal read its header")


__all__ = ["InputsFile"]
