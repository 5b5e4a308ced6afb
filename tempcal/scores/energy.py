"""Energy score: ``energy = tau * logsumexp(z / tau)`` (minus the free energy; higher = more in-distribution).

Liu, Wang, Owens & Li, "Energy-based Out-of-distribution Detection", NeurIPS 2020.

``energy = z_max + tau * log1p(r)``, ``r = sum_{c != argmax} exp((z_c - z_max) / tau)`` in float64: nothing
overflows, ``z_max`` is exact, and a float32 ``log(s0)`` would be 0 for every ``r < 6e-8``.
"""

from __future__ import annotations

import torch

from .base import Score
from .shared import Intermediates


class Energy(Score):
    """``tau * logsumexp(z / tau)``."""

    name = "energy"
    label = "energy"

    def compute(self, x: Intermediates) -> torch.Tensor:
        return x.z1 + x.tau * x.log_s0


SCORE = Energy()
