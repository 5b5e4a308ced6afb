"""GEN, ``-sum over the M largest p_c of p_c^g (1 - p_c)^g`` (docs/commands.md), in a stable form: with ``p_2 = exp(a)
/ s0`` the second largest probability and ``L_c = beta (z_c - z2) <= 0`` (:mod:`tempcal.scores.shared`)::

    gen = -p_2^g * [ (r' / s0)^g  +  sum_{non-max c in top M} exp(g (L_c + log1p(-p_2 e^{L_c}))) ]

so ``1 - p_max`` is never formed as ``1 - p`` and ``p_c^g`` is ``exp(g L)`` (no float32 underflow). The top M
logits are found once per chunk; the maximum in that block, clamped to the second maximum's gap, is subtracted once."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import TempcalError, param, positive_number
from .shared import FLAT, FLOAT64, Intermediates, Score, beta_fits

#: Upper bound on elements of one [taus, rows, M] block of GEN terms (bounds the temporaries).
BLOCK_ELEMENTS = 1 << 18
DEFAULT_GAMMA = 0.1
DEFAULT_TOP = 100


class Gen(Score):
    """``-sum over the M largest p_c of p_c^g (1 - p_c)^g``."""

    name = "gen"
    label = "GEN"

    def __init__(self, gamma: float = DEFAULT_GAMMA, top: int = DEFAULT_TOP):
        self.gamma = check_gamma(gamma)
        self.top = check_top(top)

    def __repr__(self) -> str:
        return f"Gen(gamma={self.gamma}, top={self.top})"

    def configure(self, options: Mapping[str, Any]) -> Gen:
        return Gen(options.get("gen_gamma", self.gamma), options.get("gen_top", self.top))

    def top_k(self, num_classes: int) -> int:
        count = min(self.top, num_classes)
        return count if count >= 2 else 0  # M = 1: only the max term, which needs no top logits

    def compute(self, x: Intermediates) -> torch.Tensor:
        g = self.gamma
        log_p2 = x.a - x.log_s0
        bracket = torch.exp(g * (x.log_r_prime - x.log_s0))  # (1 - p_max)^g p_max^g / p_2^g = (r' / s0)^g
        if self.top_k(x.num_classes):
            bracket = bracket + self._non_max(x, torch.exp(log_p2))
        return -torch.exp(g * log_p2) * bracket

    def _non_max(self, x: Intermediates, p2: torch.Tensor) -> torch.Tensor:
        """``sum over the non-max top-M classes of exp(g (L + log1p(-p_2 e^L)))`` ([T, n] float64); rows flat at a
        temperature (every ``|L| <= FLAT``) sum relative to the second maximum's term."""
        gaps = x.top_gaps
        rows, k = gaps.shape
        g = self.gamma
        one_minus_p2 = torch.exp(g * torch.log1p(-p2))  # (1 - p_2)^g, the second maximum's term
        spread = -torch.where(torch.isfinite(gaps), gaps, torch.zeros((), dtype=gaps.dtype, device=gaps.device)
                              ).amin(1).to(FLOAT64)
        flat = x.beta * spread <= FLAT  # [T, n]
        total = torch.empty_like(p2)
        step = max(1, BLOCK_ELEMENTS // max(1, rows * k))
        for start in range(0, len(x.betas), step):
            part = slice(start, start + step)
            dtype = gaps.dtype if all(beta_fits(b, gaps.dtype) for b in x.betas[part]) else FLOAT64
            shape = (len(x.betas[part]), rows, k)
            logs = torch.mul(gaps.to(dtype)[None], x.beta[part].to(dtype)[:, :, None],
                             out=x.buffer("gen_L", shape, dtype))
            kinds = [kind for kind, wanted in ((True, bool(flat[part].any())), (False, not bool(flat[part].all())))
                     if wanted]
            for relative in kinds:
                if relative:  # p_2 <= 1/2, so the ratio is <= 1; p_2 = 1 only where (1 - p_2)^g is 0
                    ratio = (p2[part] / (1.0 - p2[part])).clamp_(max=1.0)
                    value = one_minus_p2[part] * (k - 1 + self._terms(logs, ratio, x, dtype, relative))
                else:
                    value = self._terms(logs, p2[part], x, dtype, relative) - one_minus_p2[part]
                if len(kinds) == 1:
                    total[part] = value
                else:  # rows of both kinds: each row takes its own kind's value
                    total[part] = torch.where(flat[part] if relative else ~flat[part], value, total[part])
        return total

    def _terms(self, logs: torch.Tensor, factor: torch.Tensor, x: Intermediates, dtype: torch.dtype,
               relative: bool) -> torch.Tensor:
        """Over the block (the clamped maximum's copy included), ``sum_c exp(g (L_c + log1p(-p_2 e^{L_c})))`` with
        ``factor`` p_2; ``relative``: ``sum_c expm1(g v_c)``, ``v_c = L_c + log1p(-p_2 e^{L_c}) - log1p(-p_2) <= 0``
        with ``factor`` p_2 / (1 - p_2): each term over the second maximum's, minus 1, which keeps the float32 digits
        where flat rows differ (``log1p(-p_2 expm1(L) / (1 - p_2)) = log1p(-p_2 e^L) - log1p(-p_2)``)."""
        terms = (torch.expm1 if relative else torch.exp)(logs, out=x.buffer("gen_W", logs.shape, dtype))
        terms.mul_(-factor.to(dtype)[:, :, None]).log1p_()
        terms.add_(logs).mul_(self.gamma)
        return (terms.expm1_() if relative else terms.exp_()).sum(-1).to(FLOAT64)


def check_gamma(gamma: Any) -> float:
    """GEN's exponent: a positive finite number."""
    value = None if isinstance(gamma, bool) else positive_number(gamma)
    if value is None:
        raise TempcalError(f"{param('gen_gamma')} {gamma}: expected a positive finite number")
    return value


def check_top(top: Any) -> int:
    """GEN's number of largest probabilities: a whole number >= 1."""
    value = float(top) if isinstance(top, numbers.Real) and not isinstance(top, bool) else math.nan
    if not (math.isfinite(value) and value == int(value) and value >= 1):
        raise TempcalError(f"{param('gen_top')} {top}: expected a whole number >= 1")
    return int(value)


SCORES = {"gen": Gen()}
