"""One pass's kernel: the mean NLL of ``softmax(beta * z)`` and its first four derivatives in ``beta``.

For one row of logits ``z`` (``-inf`` marks an impossible class) and its label ``y``,

    A(beta)   = log sum_c exp(beta z_c)              (the log-partition function)
    NLL(beta) = A(beta) - beta z_y.

The derivatives of ``A`` are the cumulants of ``z`` under ``p = softmax(beta z)``, so

    NLL'    = k1 - z_y = E_p[z] - z_y
    NLL''   = k2 = mu2                     (the variance, >= 0: the NLL is convex in beta)
    NLL'''  = k3 = mu3
    NLL'''' = k4 = mu4 - 3 mu2^2

with ``mu_k`` the central moments, all from one exp per logit (``p = softmax(beta (z - max z))``), taken about the
mean so that no power sum cancels. A chunk's result is a float64 vector of sums over its rows (:data:`FIELDS`:
``count, nll, d1..d4`` and the error bound's ``q = mu2^2``, ``q5 = sqrt(mu2^3 mu4)``), so chunks and ranks add up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

#: Order of the fields in a chunk's float64 sums.
FIELDS = ("count", "nll", "d1", "d2", "d3", "d4", "q", "q5")
#: How many sums :func:`raw_sums` gives a block.
RAW_FIELDS = 9
#: Scaled logits below -CLIP have probability exactly 0 in float32 and float64 alike.
CLIP = 2000.0


class Buffers(Protocol):
    """Reused chunk-sized buffers (:class:`tempcal.core.threads.Scratch`)."""

    def like(self, name: str, t: torch.Tensor) -> torch.Tensor: ...


class _Fresh:
    """New buffers every time (for callers that keep none)."""

    def like(self, name: str, t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t)


@dataclass(frozen=True)
class NllDerivatives:
    """Means over rows at one ``beta`` (all-reduced): the NLL, its derivatives in beta and two bound terms."""

    beta: float
    nll: float
    d1: float  # d NLL / d beta = mean(E_p[z] - z_y)
    d2: float  # mean Var_p[z]
    d3: float = 0.0  # mean third cumulant
    d4: float = 0.0  # mean fourth cumulant
    q: float = 0.0  # mean mu2^2
    q5: float = 0.0  # mean sqrt(mu2^3 mu4)

    @classmethod
    def from_sums(cls, beta: float, sums: torch.Tensor | Sequence[float]) -> NllDerivatives:
        """From float64 sums in the order of :data:`FIELDS` (count first)."""
        values = [float(v) for v in (sums.tolist() if isinstance(sums, torch.Tensor) else sums)]
        count = max(values[0], 1e-300)
        return cls(beta, *(v / count for v in values[1:8]))

    @property
    def grad(self) -> float:
        """dNLL/dbeta (the name the first L-BFGS fit used)."""
        return self.d1

    @property
    def curvature(self) -> float:
        """d2NLL/dbeta2."""
        return self.d2

    @property
    def derivatives(self) -> tuple[float, float, float, float]:
        return self.d1, self.d2, self.d3, self.d4


@dataclass(frozen=True)
class RowMoments:
    """Per-row moments of ``z`` under ``softmax(beta z)`` (compute dtype)."""

    top: torch.Tensor  # max z
    log_mass: torch.Tensor  # log sum_c exp(beta (z_c - top))
    mean: torch.Tensor  # E_p[z] - top  (<= 0)
    mu2: torch.Tensor  # central moments E_p[(z - E_p z)^k], k = 2, 3, 4
    mu3: torch.Tensor
    mu4: torch.Tensor


def row_moments(z: torch.Tensor, beta: float | torch.Tensor, labels: torch.Tensor, buffers: Buffers | None = None,
                *, top: torch.Tensor | None = None, impossible: bool | None = None) -> RowMoments:
    """Moments of each row of ``z`` [n, C] under ``softmax(beta z)`` (``beta``: a number or one per row): one exp per
    entry, centred sums. ``top`` (row maxima) and ``impossible`` (the chunk holds ``-inf``) save work when known."""
    if not isinstance(beta, torch.Tensor) and beta == 0:
        return _uniform_moments(z)
    buffers = buffers or _Fresh()
    b: float | torch.Tensor = beta.to(z.dtype)[:, None] if isinstance(beta, torch.Tensor) else float(beta)
    top = z.amax(1) if top is None else top
    x = torch.sub(z, top[:, None], out=buffers.like("d", z)).mul_(b)
    if impossible is False:
        x.clamp_(min=exp_floor(x.dtype))
    p = torch.softmax(x, 1, out=buffers.like("e", z))
    index = labels[:, None]
    log_mass = x.gather(1, index)[:, 0] - torch.log(p.gather(1, index)[:, 0])
    if impossible:
        x.nan_to_num_(neginf=0.0)  # p is 0 there; 0 * -inf would be NaN
    mean_x = dot_rows(p, x, buffers)
    if impossible is None and bool(torch.isnan(mean_x).any()):
        x.nan_to_num_(neginf=0.0)
        mean_x = dot_rows(p, x, buffers)
    if isinstance(b, float):  # u = z - E_p[z] in logit units, one fused sweep
        mean = mean_x / b
        u = torch.add(-mean[:, None], x, alpha=1.0 / b, out=x)
    else:
        mean = mean_x / b[:, 0]
        u = x.div_(b).sub_(mean[:, None])
    mu2, mu3, mu4 = _central(p, u, buffers)
    if not bool(torch.isfinite(mu4 + log_mass).all()):  # one check for two rare cases
        mu2, mu3, mu4, log_mass = _repair(z, b, top, mean, (mu2, mu3, mu4), log_mass, buffers)
    return RowMoments(top, log_mass, mean, mu2, mu3, mu4)


def exp_floor(dtype: torch.dtype) -> float:
    """The least exponent worth taking in ``dtype``: below it ``exp`` gives a subnormal or 0 (nothing that moves a
    sum that holds a 1), and the CPU's float32 ``exp`` takes a slow path there. Scaled logits ``beta
    (z - max z)`` are clamped to it first; a -inf (an impossible class) is left alone."""
    return -87.0 if dtype != torch.float64 else -708.0


def _repair(z: torch.Tensor, b: float | torch.Tensor, top: torch.Tensor, mean: torch.Tensor,
            central: tuple[torch.Tensor, torch.Tensor, torch.Tensor], log_mass: torch.Tensor, buffers: Buffers
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Huge finite mask values (e.g. -1e30) overflow ``u^2`` where ``p`` is exactly 0: recompute those moments
    from clipped logits. A true class whose ``p_y`` underflowed to 0: its log mass directly."""
    mu2, mu3, mu4 = central
    if not bool(torch.isfinite(mu4).all()):
        x = torch.sub(z, top[:, None]).mul_(b).clamp_(min=-CLIP)
        p = torch.softmax(x, 1)
        mu2, mu3, mu4 = _central(p, x.div_(b).sub_(mean[:, None]), buffers)
    bad = (~torch.isfinite(log_mass)).nonzero()[:, 0]
    if bad.numel():
        scale = b if isinstance(b, float) else b[bad]
        log_mass = log_mass.clone()
        log_mass[bad] = torch.logsumexp((z[bad] - top[bad, None]) * scale, 1)
    return mu2, mu3, mu4, log_mass


def _uniform_moments(z: torch.Tensor) -> RowMoments:
    """``beta = 0``: the uniform distribution over each row's finite entries."""
    finite = torch.isfinite(z)
    count = finite.sum(1).to(z.dtype)
    top = z.amax(1)
    d = torch.where(finite, z - top[:, None], torch.zeros((), dtype=z.dtype, device=z.device))
    p = finite.to(z.dtype) / count.clamp_min(1)[:, None]
    mean = (p * d).sum(1)
    mu2, mu3, mu4 = _central(p, d - mean[:, None], _Fresh())
    return RowMoments(top, torch.log(count), mean, mu2, mu3, mu4)


def _central(p: torch.Tensor, u: torch.Tensor, buffers: Buffers) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``sum_c p u^k`` for k = 2, 3, 4 with two products and three reductions; ``p`` is overwritten."""
    v = torch.mul(u, u, out=buffers.like("v", u))
    w = p.mul_(v)
    return w.sum(1), dot_rows(w, u, buffers), dot_rows(w, v, buffers)


def dot_rows(a: torch.Tensor, b: torch.Tensor, buffers: Buffers) -> torch.Tensor:
    """Row-wise ``sum a * b`` with no chunk-sized temporary (``vecdot`` allocates one): :func:`row_dot` where it is
    the faster, else a product in the reused buffer ``product``, summed."""
    if row_dot_pays(a):
        return row_dot(a, b)
    return torch.mul(a, b, out=buffers.like("product", a)).sum(1)


#: Up to this many classes a batched matrix product is the faster row-wise dot product on the CPU; from about 400
#: classes on it stops vectorising and is several times slower than a product and a sum.
ROW_DOT_MAX_CLASSES = 256
#: Below this many bytes of ``a`` the product and its sum stay in a core's cache and are the faster (about 1.6x at
#: 163 x 100 float32), and cost fewer interpreter calls.
ROW_DOT_MIN_BYTES = 1 << 20


def row_dot_pays(a: torch.Tensor) -> bool:
    """Whether :func:`row_dot` is the faster row-wise dot product for ``a`` [n, C]: on the CPU only (an
    accelerator's matrix products may be set to round float32 inputs), short rows, too many to stay in cache."""
    return (a.device.type == "cpu" and a.shape[-1] <= ROW_DOT_MAX_CLASSES
            and a.numel() * a.element_size() >= ROW_DOT_MIN_BYTES)


def row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise ``sum a * b`` of two tensors [n, C] as a batched matrix product: no temporary."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def row_terms(m: RowMoments, z_true: torch.Tensor, beta: float | torch.Tensor) -> torch.Tensor:
    """Float64 per-row values ``[1, NLL, d1, d2, d3, d4, q, q5]`` ([8, n])."""
    values = torch.stack([m.top, z_true, m.log_mass, m.mean, m.mu2, m.mu3, m.mu4]).to(torch.float64)
    top, true, log_mass, mean, mu2, mu3, mu4 = values
    gap = top - true  # top - z_y >= 0, exact in float64
    square = mu2 * mu2
    q5 = torch.sqrt(mu2.clamp_min(0) ** 3 * mu4.clamp_min(0))
    return torch.stack([torch.ones_like(top), log_mass + beta * gap, mean + gap, mu2, mu3, mu4 - 3 * square,
                        square, q5])


def raw_sums(m: RowMoments, z_true: torch.Tensor) -> torch.Tensor:
    """Float64 sums over a block's rows of ``log_mass, mean, mu2, mu3, mu4, top, z_y, mu2^2, q5``: what
    :func:`finished_sums` turns into :data:`FIELDS` once the blocks are added up (no host synchronisation)."""
    q5 = torch.sqrt(m.mu2.clamp_min(0) ** 3 * m.mu4.clamp_min(0))
    return torch.stack([m.log_mass, m.mean, m.mu2, m.mu3, m.mu4, m.top, z_true, m.mu2 * m.mu2, q5]
                       ).to(torch.float64).sum(1)


def finished_sums(raw: torch.Tensor, count: float, beta: float) -> torch.Tensor:
    """The sums of :data:`FIELDS` over ``count`` rows from their :func:`raw_sums`."""
    log_mass, mean, mu2, mu3, mu4, top, true, square, q5_sum = raw.unbind()
    gap = top - true  # the sums of top and z_y in float64: no rounding of their per-row difference
    count_sum = torch.full((), float(count), dtype=torch.float64, device=raw.device)
    return torch.stack([count_sum, log_mass + beta * gap, mean + gap, mu2, mu3, mu4 - 3 * square, square, q5_sum])


def chunk_sums(m: RowMoments, z_true: torch.Tensor, beta: float) -> torch.Tensor:
    """Float64 sums over the chunk's rows, in the order of :data:`FIELDS` (no host synchronisation)."""
    return finished_sums(raw_sums(m, z_true), m.top.shape[0], beta)


def row_raw_sums(z: torch.Tensor, y: torch.Tensor, beta: float, buffers: Buffers | None = None, *,
                 top: torch.Tensor | None = None, impossible: bool | None = None) -> torch.Tensor:
    """:func:`raw_sums` over a block of rows ``z`` [n, C]: a pass's threads add these up, and the caller finishes
    them once (fewer small operations per block, where the threads contend for the interpreter)."""
    y = y.to(torch.int64)
    z_true = z.gather(1, y[:, None])[:, 0]
    return raw_sums(row_moments(z, beta, y, buffers, top=top, impossible=impossible), z_true)


def row_cumulants(z: torch.Tensor, y: torch.Tensor, beta: float, buffers: Buffers | None = None, *,
                  top: torch.Tensor | None = None, impossible: bool | None = None) -> torch.Tensor:
    """Float64 sums (:data:`FIELDS`) over a chunk of rows ``z`` [n, C] (a binary logit already as ``[0, z]``)."""
    raw = row_raw_sums(z, y, beta, buffers, top=top, impossible=impossible)
    return finished_sums(raw, z.shape[0], beta)


def row_range(z: torch.Tensor, top: torch.Tensor, low: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row ``max - min`` over finite entries (the fit's error bound uses the largest one); ``low``: the rows'
    minima, when already known."""
    low = z.amin(1) if low is None else low
    odd = low == -math.inf
    if bool(odd.any()):
        rows = z[odd]
        inf = torch.full((), math.inf, dtype=z.dtype, device=z.device)
        low = low.clone()
        low[odd] = torch.where(torch.isfinite(rows), rows, inf).amin(1)
    return top - low


__all__ = ["FIELDS", "RAW_FIELDS", "Buffers", "NllDerivatives", "RowMoments", "chunk_sums", "dot_rows", "exp_floor",
           "finished_sums", "raw_sums", "row_cumulants", "row_moments", "row_range", "row_raw_sums", "row_terms"]
