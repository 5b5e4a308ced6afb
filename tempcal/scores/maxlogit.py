"""Maximum logit: ``maxlogit = max_c z_c / tau``.

Hendrycks, Basart, Mazeika, Zou, Kwon, Mostajabi, Steinhardt & Song, "Scaling Out-of-Distribution
Detection for Real-World Settings", ICML 2022.

Dividing by the same ``tau > 0`` keeps the rows' order: every ranking figure is the same at every temperature.
"""

from __future__ import annotations

import torch

from .base import Score
from .shared import Intermediates


class MaxLogit(Score):
    """``max(z) / tau``."""

    name = "maxlogit"
    label = "MaxLogit"

    def compute(self, x: Intermediates) -> torch.Tensor:
        return x.z1 / x.tau


SCORE = MaxLogit()
