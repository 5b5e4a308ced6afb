"""Maximum logit: ``maxlogit = max_c z_c / tau``.

Hendrycks, Basart, Mazeika, Zou, Kwon, Mostajabi, Steinhardt & Song, "Scaling Out-of-Distribution
Detection for Real-World Settings", ICML 2022.

Dividing every row by the same positive ``tau`` keeps their order, so the ranking, and with it
every ranking figure (AUROC, AUPR, FPR95), is the same at every temperature. (In float64 the
division is monotone; only values beyond float64's range, ``|z_max| / tau > 1.8e308``, become
``+/-inf`` and tie.)
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
