"""Chunk-sized buffers that every pass reuses instead of allocating fresh temporaries per chunk."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


class Scratch:
    """Chunk-sized buffers reused by every pass: fresh megabyte temporaries per chunk cost page faults
    that take as long as the arithmetic."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def like(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """Buffer ``name`` shaped like ``t`` (contents undefined), grown when ``t`` is larger."""
        return self.get(name, t.shape, t.dtype, t.device)

    def get(self, name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Buffer ``name`` of ``shape`` in ``dtype`` on ``device`` (contents undefined), grown when too small."""
        numel = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < numel or buffer.dtype != dtype or buffer.device != device:
            buffer = self._buffers[name] = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel].view(tuple(shape))


__all__ = ["Scratch"]
