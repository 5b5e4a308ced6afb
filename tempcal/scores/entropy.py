"""Negative entropy, ``sum_c p_c ln p_c = beta * Q / s0 - log s0`` with ``Q = sum_{c != argmax} e_c d_c =
exp(a) (q' - m r')`` (:mod:`tempcal.scores.shared`): two terms <= 0, so nothing cancels; ``-inf`` logits count 0."""

from __future__ import annotations

from typing import ClassVar

import torch

from .shared import Intermediates, Score


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


SCORES = {"entropy": NegativeEntropy()}
