"""Maximum softmax probability at temperature tau: ``max softmax(logits / tau)`` (Hendrycks & Gimpel, ICLR 2017).

With ``e = exp((z - max z) / tau)`` the largest entry of ``e`` is 1, so the score is ``1 / sum(e)``.
"""

from __future__ import annotations

import torch

from .base import ChunkAtTau, Score


class MaxSoftmax(Score):
    name = "msp"
    label = "MSP"

    def compute(self, chunk: ChunkAtTau) -> torch.Tensor:
        return chunk.s0.reciprocal().to(torch.float64)


SCORE = MaxSoftmax()
