"""Maximum softmax probability (MSP): ``msp = max_c p_c``, ``p = softmax(z / tau)``.

Hendrycks & Gimpel, "A Baseline for Detecting Misclassified and Out-of-Distribution Examples in
Neural Networks", ICLR 2017; with a temperature, Liang et al., "Enhancing the Reliability of
Out-of-distribution Image Detection in Neural Networks" (ODIN), ICLR 2018.

With ``r`` the sum over the non-max classes of ``exp((z_c - z_max) / tau)``::

    msp = 1 / (1 + r)

computed from ``r`` in float64 as ``exp(-log1p(r))`` (which resolves the float64 grid just below 1
twice as finely as ``1 / (1 + r)``), never as ``1 / sum(exp(...))`` in the chunk's dtype: in float32 that
sum rounds to exactly 1 for every row with ``r < 6e-8``, so confident rows would all tie, while
float64 keeps rows with ``r = 1e-9`` and ``r = 2e-9`` apart (it ties only below ``r ~ 1e-16``, as any
float64 value of ``max p`` must). As ``tau -> 0``, ``log r -> -(z_max - z_2nd) / tau``: MSP ranks
rows by the top-2 margin.
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
