"""Negative entropy: ``entropy = sum_c p_c ln p_c`` (minus the Shannon entropy, in nats; ``0 ln 0 = 0``).

The classic predictive-uncertainty score (Shannon, 1948), the baseline that GEN (Liu et al.,
CVPR 2023, see :mod:`tempcal.scores.gen`) generalises. Higher (closer to 0) = more peaked = more
in-distribution.

With ``beta = 1 / tau``, ``d_c = z_c - z_max``, ``e_c = exp(beta d_c)``, ``s0 = sum e_c``::

    sum p ln p = sum_c (e_c / s0) (beta d_c - log s0) = beta * Q / s0 - log s0,
    Q = sum_{c != argmax} e_c d_c   (the maximum has d = 0)

Both terms are <= 0, so nothing cancels. ``Q`` comes from the chunk's sums relative to the second
maximum ``z2``: ``Q = exp(a) (q' - m r')`` with ``a = -beta m``, ``q' = sum e'_c d'_c``,
``d'_c = z_c - z2`` (see :mod:`tempcal.scores.shared`), so no float32 exponential underflows before
float64 itself would. Impossible classes (``-inf`` logits) have ``e = 0`` and count 0 (``0 ln 0 = 0``,
no NaN).
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
