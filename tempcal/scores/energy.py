"""Energy score, ``tau * logsumexp(z / tau)`` (Liu, Wang, Owens & Li, NeurIPS 2020): ``z_max + tau * log s0`` in
float64, so nothing overflows and ``z_max`` is exact."""

from __future__ import annotations

import torch

from .shared import Intermediates, Score


class Energy(Score):
    """``tau * logsumexp(z / tau)``."""

    name = "energy"
    label = "energy"

    def compute(self, x: Intermediates) -> torch.Tensor:
        return x.z1 + x.tau * x.log_s0


SCORES = {"energy": Energy()}
