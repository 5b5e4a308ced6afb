"""What every OOD score is computed from: one chunk of logits seen at one temperature, shared by all scores.

A score is a subclass of :class:`Score` that turns a :class:`ChunkAtTau` into one float64
number per row, higher meaning "more in-distribution". The chunk computes each shared
intermediate (``exp(beta * d)``, its row sum, ...) once, on first use, so every score at
every temperature comes from the same single read of the data.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch


class ChunkAtTau:
    """A chunk's logits at ``beta = 1/tau``, with the intermediates scores share computed lazily.

    ``d = z - max(z)`` per row (shared by every temperature, so it is passed in); ``e = exp(beta * d)``
    lives in ``buffer`` (reused chunk to chunk: fresh megabyte temporaries cost page faults).
    """

    def __init__(self, d: torch.Tensor, row_max: torch.Tensor, beta: float, buffer: torch.Tensor):
        self.d, self.row_max, self.beta = d, row_max, beta
        self._buffer = buffer
        self._e: torch.Tensor | None = None
        self._s0: torch.Tensor | None = None

    @property
    def e(self) -> torch.Tensor:
        """``exp(beta * d)``: unnormalised probabilities, 1 at each row's arg-max."""
        if self._e is None:
            self._e = torch.mul(self.d, self.beta, out=self._buffer).exp_()
        return self._e

    @property
    def s0(self) -> torch.Tensor:
        """``sum(e)`` per row (>= 1): the max softmax probability is ``1 / s0``."""
        if self._s0 is None:
            self._s0 = self.e.sum(1)
        return self._s0


class Score(ABC):
    """One OOD score: a name, how tables name it, and its per-row value from a chunk at one temperature."""

    name: ClassVar[str]
    label: ClassVar[str]

    @abstractmethod
    def compute(self, chunk: ChunkAtTau) -> torch.Tensor:
        """Float64 ``[rows]``, higher = more in-distribution."""
