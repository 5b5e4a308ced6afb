"""Maximum softmax probability (MSP): ``msp = max_c p_c``, ``p = softmax(z / tau)``.

Hendrycks & Gimpel, "A Baseline for Detecting Misclassified and Out-of-Distribution Examples in
Neural Networks", ICLR 2017; with a temperature, Liang et al., "Enhancing the Reliability of
Out-of-distribution Image Detection in Neural Networks" (ODIN), ICLR 2018.

``msp = 1 / (1 + r)`` with ``r`` the sum over the non-max classes of ``exp((z_c - z_max) / tau)``, computed in
float64 as ``exp(-log1p(r))``: in float32 ``1 + r`` rounds to 1 for every ``r < 6e-8``, so confident rows would tie.
"""

from __future__ import annotations

import torch

from .base import Score
from .shared import Intermediates


class MaxSoftmax(Score):
    """``max softmax(z / tau)``."""

    name = "msp"
    label = "MSP"

    def compute(self, x: Intermediates) -> torch.Tensor:
        return torch.exp(-x.log_s0)


SCORE = MaxSoftmax()
