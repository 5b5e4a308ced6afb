"""Maximum softmax probability, ``max_c softmax(z / tau)_c`` (Hendrycks & Gimpel, ICLR 2017; with a temperature,
ODIN, ICLR 2018): ``exp(-log s0)`` in float64, as ``1 + r`` in float32 would tie every confident row."""

from __future__ import annotations

import torch

from .shared import Intermediates, Score


class MaxSoftmax(Score):
    """``max softmax(z / tau)``."""

    name = "msp"
    label = "MSP"

    def compute(self, x: Intermediates) -> torch.Tensor:
        return torch.exp(-x.log_s0)


SCORES = {"msp": MaxSoftmax()}
