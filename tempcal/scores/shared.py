"""The contract of every OOD score (:class:`Score`: float64 ``[T, n]``, every temperature at once, a tenth of the
launches of a call per temperature) and what a chunk's scores share (:class:`Intermediates`, built once per chunk).

Notation, per row (``z`` the logits in the compute dtype, ``beta = 1 / tau``):

* ``z1`` the row maximum, ``z2`` the second largest logit counted with multiplicity (``z1`` when the maximum is
  tied or alone), ``m = z1 - z2 >= 0``;
* ``d'_c = min(z_c - z2, 0)``, ``e'_c = exp(beta d'_c)`` in [0, 1]; ``r' = sum_c e'_c - 1`` (>= 1, or 0 when
  only the maximum is possible), ``q' = sum_c e'_c d'_c`` when a score asks for it;
* float64 from there: ``a = -beta m``, ``r = exp(a) r'``, ``s0 = 1 + r``, ``p_max = 1 / s0``, ``p_2 = exp(a) / s0``.

Shifting by ``z2`` rather than ``z1`` keeps float32 chunks honest at saturation: relative to ``z1`` every non-max
``exp(beta d)`` underflows once ``beta m`` passes ~87 and ``1 + r`` rounds to 1 once ``r < 6e-8``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from ..core.parallel import Scratch

FLOAT64 = torch.float64
#: A row is "flat" at a temperature when every possible class has ``beta * |z_c - z2| <= FLAT``: its sums over
#: classes are then taken relative to 1, with ``expm1``, since such rows differ in second order only.
FLAT = 0.1


class Intermediates:
    """A chunk's shared values: row tensors float64 ``[n]``, ``beta`` and ``tau`` ``[T, 1]``, and float64 ``[T, n]``
    values made on first use."""

    def __init__(self, *, betas: list[float], z1: torch.Tensor, z2: torch.Tensor, r_sum: torch.Tensor,
                 q: torch.Tensor | None, top_gaps: torch.Tensor | None, num_classes: int, workspace: Scratch):
        device = z1.device
        self.workspace = workspace
        self.betas = betas
        self.num_classes = num_classes
        self.beta = torch.tensor(betas, dtype=FLOAT64, device=device)[:, None]
        self.tau = torch.tensor([1.0 / b for b in betas], dtype=FLOAT64, device=device)[:, None]
        self.z1 = z1.to(FLOAT64)
        self.z2 = z2.to(FLOAT64)
        self._r_sum = r_sum
        self._q = q
        self._top_gaps = top_gaps

    def buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Scratch memory for a score's large temporaries (contents undefined), reused across chunks."""
        return self.workspace.get(name, shape, dtype, self.z1.device)

    # -- temperature-free ------------------------------------------------------------------------
    @cached_property
    def margin(self) -> torch.Tensor:
        """``m = z1 - z2 >= 0`` in float64 (exact for float32 logits)."""
        return self.z1 - self.z2

    @property
    def top_gaps(self) -> torch.Tensor:
        """``min(v - z2, 0)`` for the row's k (scores' ``top_k``) largest logits ``v`` ([n, k], any order): the maximum
        becomes 0, a copy of the second maximum's gap, which a score that skips the maximum subtracts once."""
        if self._top_gaps is None:
            raise RuntimeError("no top logits were prepared: the score must declare top_k()")
        return self._top_gaps

    # -- per temperature, float64 [T, n] ------------------------------------------------------------
    @cached_property
    def r_prime(self) -> torch.Tensor:
        """``r' = sum_{c != argmax} exp(beta (z_c - z2))`` (>= 1, or 0 when only the maximum is possible)."""
        return (self._r_sum.to(FLOAT64) - 1.0).clamp_(min=0.0)

    @cached_property
    def log_r_prime(self) -> torch.Tensor:
        return torch.log(self.r_prime)

    @cached_property
    def a(self) -> torch.Tensor:
        """``a = -beta * m``, the log of the scale between the shifts by ``z2`` and by ``z1`` (<= 0)."""
        return -self.beta * self.margin

    @cached_property
    def exp_a(self) -> torch.Tensor:
        return torch.exp(self.a)

    @cached_property
    def log_r(self) -> torch.Tensor:
        """``log r``, r the sum over non-max classes of ``exp(beta (z_c - z1))``; ``-inf`` when r = 0."""
        return self.a + self.log_r_prime

    @cached_property
    def r(self) -> torch.Tensor:
        return torch.exp(self.log_r)

    @cached_property
    def log_s0(self) -> torch.Tensor:
        """``log s0 = log sum_c exp(beta (z_c - z1)) = log1p(r) = -log p_max``."""
        return torch.log1p(self.r)

    @cached_property
    def s0(self) -> torch.Tensor:
        return 1.0 + self.r

    @cached_property
    def q_prime(self) -> torch.Tensor:
        """``q' = sum_{c != argmax} exp(beta (z_c - z2)) (z_c - z2)`` (<= 0; impossible classes contribute 0)."""
        if self._q is None:
            raise RuntimeError("q was not summed: the score must list 'q' in its sums")
        return self._q.to(FLOAT64)


class Score(ABC):
    """One training-free OOD score of logits at temperature ``tau``: set ``name``, ``label``, ``sums`` and
    ``top_k`` (what the pass must prepare), implement ``compute``; a score with parameters overrides ``configure``."""

    #: The name used by ``--score`` and in results.
    name: ClassVar[str]
    #: How tables and sentences name it.
    label: ClassVar[str]
    #: Per-temperature sums over classes this score needs besides ``r'``: ``q`` (``Intermediates.q_prime``) or none.
    sums: ClassVar[frozenset[str]] = frozenset()

    def configure(self, options: Mapping[str, Any]) -> Score:
        """This score set up with ``options`` (the ones it knows, e.g. ``gen_gamma``); by default itself."""
        return self

    def top_k(self, num_classes: int) -> int:
        """How many of each row's largest logits this score reads (found once per chunk for every tau); 0: none."""
        return 0

    @abstractmethod
    def compute(self, x: Intermediates) -> torch.Tensor:
        """Float64 scores ``[T, n]`` (row t at ``x.beta[t]``) from the chunk's shared intermediates."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def beta_fits(beta: float, dtype: torch.dtype) -> bool:
    """True when ``beta = 1 / tau`` is a normal number of ``dtype`` (else the pass multiplies in float64)."""
    info = torch.finfo(dtype)
    return info.tiny <= beta <= info.max


__all__ = ["FLAT", "FLOAT64", "Intermediates", "Score", "beta_fits"]
