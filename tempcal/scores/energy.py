"""Energy at temperature tau: ``tau * logsumexp(logits / tau)`` (Liu et al., NeurIPS 2020; higher = more ID).

Computed as ``max z + tau * log(sum(exp((z - max z) / tau)))``, which never overflows.
"""

from __future__ import annotations

import torch

from .base import ChunkAtTau, Score


class Energy(Score):
    name = "energy"
    label = "energy"

    def compute(self, chunk: ChunkAtTau) -> torch.Tensor:
        return chunk.row_max.to(torch.float64) + torch.log(chunk.s0).to(torch.float64) / chunk.beta


SCORE = Energy()
