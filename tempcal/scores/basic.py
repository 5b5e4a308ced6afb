"""The four closed-form scores, each a line of the chunk's shared intermediates (:mod:`tempcal.scores.shared`).

* MSP, ``max_c p_c`` with ``p = softmax(z / tau)``: Hendrycks & Gimpel, "A Baseline for Detecting Misclassified and
  Out-of-Distribution Examples in Neural Networks", ICLR 2017; with a temperature, Liang et al., "Enhancing the
  Reliability of Out-of-distribution Image Detection in Neural Networks" (ODIN), ICLR 2018.
* Energy, ``tau * logsumexp(z / tau)`` (minus the free energy): Liu, Wang, Owens & Li, "Energy-based
  Out-of-distribution Detection", NeurIPS 2020.
* MaxLogit, ``max_c z_c / tau``: Hendrycks, Basart, Mazeika, Zou, Kwon, Mostajabi, Steinhardt & Song, "Scaling
  Out-of-Distribution Detection for Real-World Settings", ICML 2022. Dividing by the same ``tau > 0`` keeps the rows'
  order: every ranking figure is the same at every temperature.
* Negative entropy, ``sum_c p_c ln p_c`` (minus the Shannon entropy, in nats; ``0 ln 0 = 0``).

With ``r`` the sum over the non-max classes of ``exp((z_c - z_max) / tau)``, in float64: ``msp = exp(-log1p(r))`` (in
float32 ``1 + r`` rounds to 1 for every ``r < 6e-8``, so confident rows would tie) and ``energy = z_max + tau *
log1p(r)`` (nothing overflows, ``z_max`` is exact). With ``d_c = z_c - z_max``, ``e_c = exp(beta d_c)``, ``s0 = sum
e_c``: ``sum p ln p = beta * Q / s0 - log s0``, ``Q = sum_{c != argmax} e_c d_c = exp(a) (q' - m r')`` from the sums
relative to the second maximum; both terms are <= 0, so nothing cancels; ``-inf`` logits count 0.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from .base import Score
from .shared import Intermediates


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
