"""The scores that are one line of the chunk's shared values (:mod:`tempcal.scores.shared`), in float64:

* MSP, ``max_c softmax(z / tau)_c`` (Hendrycks & Gimpel, ICLR 2017; with a temperature, ODIN, ICLR 2018):
  ``exp(-log s0)``, as ``1 + r`` in float32 would tie every confident row;
* energy, ``tau * logsumexp(z / tau)`` (Liu, Wang, Owens & Li, NeurIPS 2020): ``z_max + tau * log s0``, so nothing
  overflows and ``z_max`` is exact;
* MaxLogit, ``max_c z_c / tau`` (Hendrycks et al., ICML 2022): the same ranking at every temperature;
* negative entropy, ``sum_c p_c ln p_c = beta * Q / s0 - log s0`` with ``Q = sum_{c != argmax} e_c d_c = exp(a) (q' -
  m r')``: two terms <= 0, so nothing cancels; ``-inf`` logits count 0."""

from __future__ import annotations

from typing import ClassVar

import torch

from .shared import Intermediates, Score


class MaxSoftmax(Score):
    """``max softmax(z / tau)``."""

    name = "msp"
    label = "MSP"

    def compute(self, x: Intermediates) -> torch.Tensor:
        return torch.exp(-x.log_s0)


class Energy(Score):
    """``tau * logsumexp(z / tau)``."""

    name = "energy"
    label = "energy"

    def compute(self, x: Intermediates) -> torch.Tensor:
        return x.z1 + x.tau * x.log_s0


class MaxLogit(Score):
    """``max(z) / tau``."""

    name = "maxlogit"
    label = "MaxLogit"

    def compute(self, x: Intermediates) -> torch.Tensor:
        return x.z1 / x.tau


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


SCORES = {score.name: score for score in (MaxSoftmax(), Energy(), MaxLogit(), NegativeEntropy())}
