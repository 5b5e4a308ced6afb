"""Moving row chunks between the host and a CUDA device without reading a buffer before its copy lands.

:func:`to_device` copies asynchronously only from pinned host memory toward CUDA (toward the host a non-blocking
copy returns before the bytes arrive). :class:`PinnedStager` fills one pinned buffer while the other is copied on a
side stream, refilling a buffer only after its copy's event has completed.
"""

from __future__ import annotations

import torch

#: The number of pinned buffers a stager alternates between: one being filled, one being copied.
SLOTS = 2


def is_async_copy(source: torch.Tensor, device: torch.device) -> bool:
    """Whether copying ``source`` to ``device`` may be non-blocking: only pinned host memory toward CUDA."""
    return device.type == "cuda" and source.device.type == "cpu" and source.is_pinned()


def to_device(tensor: torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``tensor`` on ``device`` (in ``dtype``), readable at once by the host whenever ``device`` is the CPU."""
    device = torch.device(device)
    return tensor.to(device=device, dtype=dtype, non_blocking=is_async_copy(tensor, device))


class PinnedStager:
    """Host row blocks to one CUDA device through :data:`SLOTS` pinned buffers and a side stream on that device:
    the caller fills :meth:`buffers`, and :meth:`send` returns tensors the device's current stream may use at once."""

    def __init__(self, device: torch.device, logits_bytes: int, label_rows: int):
        if device.type != "cuda":
            raise ValueError(f"PinnedStager copies to a CUDA device, not {device}")
        self.device = device
        self.stream = torch.cuda.Stream(device=device)  # on the target: its events then guard that device's copies
        self.logits = [_pinned(max(logits_bytes, 1), torch.uint8) for _ in range(SLOTS)]
        self.labels = [_pinned(max(label_rows, 1), torch.int64) for _ in range(SLOTS)]
        self.copied: list = [None] * SLOTS
        self.turn = 0

    def buffers(self, rows: int, row_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next slot's logits bytes ``[rows * row_bytes]`` (uint8) and labels ``[rows]`` (int64), free to fill."""
        k = self.turn
        if self.copied[k] is not None:
            self.copied[k].synchronize()  # the host waits only for this slot's copy, issued a chunk ago
            self.copied[k] = None
        return self.logits[k][: rows * row_bytes], self.labels[k][:rows]

    def send(self, block: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy the current slot's ``block`` and ``labels`` on the side stream; the current stream waits for them on
        the GPU, converts the logits to ``dtype`` and owns the results."""
        k = self.turn
        with torch.cuda.stream(self.stream):
            z, y = _async_copy(block, self.device), _async_copy(labels, self.device)
            event = torch.cuda.Event()
            event.record(self.stream)
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        _used_on(z, current)  # allocated on the side stream, used on the current one
        _used_on(y, current)
        self.copied[k] = event
        self.turn = (k + 1) % SLOTS
        return z.to(dtype), y

    def close(self) -> None:
        """Wait for every copy in flight (the pinned buffers may then be freed)."""
        for event in self.copied:
            if event is not None:
                event.synchronize()
        self.copied = [None] * SLOTS


def _pinned(count: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(count, dtype=dtype, pin_memory=True)


def _async_copy(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A non-blocking copy of pinned ``host`` memory to ``device``, on the current stream."""
    return host.to(device=device, non_blocking=True)


def _used_on(tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
    """Tell the caching allocator that ``stream`` uses ``tensor`` (allocated on another stream)."""
    tensor.record_stream(stream)


__all__ = ["SLOTS", "PinnedStager", "is_async_copy", "to_device"]
