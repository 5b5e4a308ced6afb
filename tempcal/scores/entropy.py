"""Negative entropy: ``entropy = sum_c p_c ln p_c`` (minus the Shannon entropy, in nats; ``0 ln 0 = 0``).

With ``d_c = z_c - z_max``, ``e_c = exp(beta d_c)``, ``s0 = sum e_c``: ``sum p ln p = beta * Q / s0 - log s0``,
``Q = sum_{c != argmax} e_c d_c = exp(a) (q' - m r')`` from the sums relative to the second maximum
(:mod:`tempcal.scores.shared`). Both terms are <= 0, so nothing cancels; ``-inf`` logits count 0.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from .base import Score
from .shared import Intermediates


class NegativeEntropy(Score):
    """``sum_c p_c ln p_c``."""

    name = "entropy"
    label = "entropy"
    sums: ClassVar[frozenset[str]] = frozenset({"q"})

    def compute(self, x: Intermediates) -> torch.Tensor:
        scale = x.exp_a
        # exp(a) = 0 only where beta * m overflows float64's exponent: Q = 0 there (and m may be inf).
        q = torch.where(scale > 0, scale * (x.q_prime - x.margin * x.r_prime), torch.zeros_like(scale))
        return x.beta * q / x.s0 - x.log_s0


SCORE = NegativeEntropy()
