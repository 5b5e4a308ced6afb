"""The scores-only pass: every score at every temperature from one read of each chunk; per chunk once the row values
(:mod:`tempcal.scores.shared`), per temperature only the C-wide sums, in float32 (float64 for float64 chunks)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..core.parallel import Scratch
from ..errors import TempcalError, param
from . import get_score
from .shared import FLAT, FLOAT64, Intermediates, Score, beta_fits

if TYPE_CHECKING:
    from ..core.scan import RowBlock, Scan


def as_classes(z: torch.Tensor) -> torch.Tensor:
    """``[N, C]`` logits as they are; a single binary logit (``[N]`` or ``[N, 1]``) as the two classes ``[0, z]``."""
    if z.dim() == 2 and z.shape[1] == 1:
        z = z[:, 0]
    if z.dim() == 1:
        return torch.stack([torch.zeros_like(z), z], dim=1)
    if z.dim() != 2 or z.shape[1] < 2:
        raise ValueError("logits must be [N, C] with C >= 2, or [N] or [N, 1] for one binary logit; "
                         f"got {list(z.shape)}")
    return z


def check_betas(betas: Iterable[float]) -> list[float]:
    """Inverse temperatures ``beta = 1 / tau`` as floats: positive, finite, and with a finite ``1 / beta``."""
    out = []
    for beta in betas:
        beta = float(beta)
        if not (math.isfinite(beta) and beta > 0 and math.isfinite(1.0 / beta)):
            tau = 1.0 / beta if math.isfinite(beta) and beta > 0 else beta
            raise TempcalError(f"{param('tau')} {tau!r}: the scores need a temperature whose inverse is a finite "
                               "number (tau from about 5.6e-309 up)")
        out.append(beta)
    if not out:
        raise TempcalError(f"{param('tau')}: at least one temperature is needed")
    return out


class ScorePass:
    """Every requested score at every temperature from one read of each chunk: ``ScorePass([get_score("msp")],
    betas=[2.0, 0.5]).chunk(z)`` is ``{"msp": float64 [2, n]}``."""

    def __init__(self, scores: Sequence[Score], betas: Iterable[float], workspace: Scratch | None = None):
        self.scores = list(scores)
        self.betas = check_betas(betas)
        self.sums: frozenset[str] = frozenset().union(*(s.sums for s in scores))
        self.workspace = workspace if workspace is not None else Scratch()

    def chunk(self, z: torch.Tensor, row_max: torch.Tensor | None = None,
              has_neginf: bool | None = None) -> dict[str, torch.Tensor]:
        """Float64 ``[T, n]`` values of every score for one chunk of validated logits (no NaN, no +inf, no
        all--inf row). ``row_max`` and ``has_neginf`` save a read when the caller knows them."""
        z = as_classes(z)
        if z.dtype != FLOAT64 and z.dtype != torch.float32:
            z = z.to(torch.float32)
        if has_neginf is None:
            has_neginf = bool(torch.isneginf(z).any())
        x = self._intermediates(z, row_max, has_neginf)
        return {score.name: score.compute(x) for score in self.scores}

    def _intermediates(self, z: torch.Tensor, row_max: torch.Tensor | None, has_neginf: bool) -> Intermediates:
        """The chunk's shared values: temperature-free row values once, then the one loop over temperatures."""
        z1 = z.amax(1) if row_max is None else row_max.to(z.dtype)
        top, z2 = self._top(z)
        if has_neginf:  # only the maximum is possible: shift by z1 instead (then r' = 0, m = 0)
            z2 = torch.where(z2 == -math.inf, z1, z2)
        ws = self.workspace
        d = torch.sub(z, z2[:, None], out=ws.get("d", z.shape, z.dtype, z.device)).clamp_(max=0)
        d_finite = d
        if has_neginf:  # e' d' would be 0 * -inf for impossible classes; and they have no gap to measure
            d_finite = torch.nan_to_num(d, neginf=0.0, out=ws.get("d_finite", z.shape, z.dtype, z.device))
        r_sum, q = self._sums(d, d_finite)
        gaps = None
        if top is not None:  # min(v - z2, 0) for the top logits v; all classes: that is d itself
            gaps = d if top is z else torch.sub(top, z2[:, None]).clamp_(max=0)
        return Intermediates(betas=self.betas, z1=z1, z2=z2, r_sum=r_sum, q=q, top_gaps=gaps,
                             num_classes=z.shape[1], workspace=ws)

    def _top(self, z: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The row's largest logits the scores ask for (None: none) and the second largest, once per chunk."""
        classes = z.shape[1]
        k = max(s.top_k(classes) for s in self.scores)
        if 2 <= k < classes:
            return self._largest(z, k)
        return (z if k >= classes else None), torch.topk(z, 2, dim=1).values[:, 1]

    def _sums(self, d: torch.Tensor, d_finite: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per temperature, ``sum e'`` (float64) and (when asked) ``sum e' d'``, ``e' = exp(beta d')``; rows flat
        there (``beta |d'| <= FLAT``) sum ``C + sum expm1(beta d')``, keeping the digits that tell them apart."""
        ws, rows, classes = self.workspace, d.shape[0], d.shape[1]
        r_sum = ws.get("r_sum", (len(self.betas), rows), FLOAT64, d.device)
        q = ws.get("q", (len(self.betas), rows), d.dtype, d.device) if "q" in self.sums else None
        spread = d_finite.amin(1).to(FLOAT64).neg_()  # the widest gap to a possible class per row, >= 0
        flat = torch.tensor(self.betas, dtype=FLOAT64, device=d.device)[:, None] * spread <= FLAT  # [T, n]
        any_flat, all_flat = flat.any(1).tolist(), flat.all(1).tolist()
        sum_d = d_finite.sum(1) if q is not None and any(any_flat) else None
        d64: tuple[torch.Tensor, torch.Tensor] | None = None
        for t, beta in enumerate(self.betas):
            if beta_fits(beta, d.dtype):
                dt, dft, e = d, d_finite, ws.get("e", d.shape, d.dtype, d.device)
            else:  # beta is not a normal float32 (tau < 3e-39 or > 8e37): this tau's products in float64
                d64 = d64 or (d.to(FLOAT64), d_finite.to(FLOAT64))
                dt, dft, e = d64[0], d64[1], torch.empty_like(d64[0])
            kinds = [kind for kind, wanted in ((True, any_flat[t]), (False, not all_flat[t])) if wanted]
            for relative in kinds:
                torch.mul(dt, beta, out=e)
                if relative:
                    total = e.expm1_().sum(1).to(FLOAT64).add_(classes)
                    moment = None if sum_d is None else e.mul_(dft).sum(1).add_(sum_d)  # sum (1 + expm1) d'
                else:
                    total = e.exp_().sum(1)
                    moment = None if q is None else e.mul_(dft).sum(1)  # e' d' over e', read for the last time
                if len(kinds) == 1:
                    r_sum[t].copy_(total)
                    if q is not None and moment is not None:
                        q[t].copy_(moment)
                else:  # rows of both kinds in this chunk: each row takes its own kind's value
                    chosen = flat[t] if relative else ~flat[t]
                    r_sum[t] = torch.where(chosen, total.to(FLOAT64), r_sum[t])
                    if q is not None and moment is not None:
                        q[t] = torch.where(chosen, moment, q[t])
        return r_sum, q

    def _largest(self, z: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k >= 2 largest logits of each row (any order) and the second largest; on a CPU with one torch
        thread numpy's ``partition`` takes about 60% of ``topk``'s time (with more, ``topk`` wins)."""
        classes = z.shape[1]
        if z.device.type == "cpu" and torch.get_num_threads() == 1:
            top = self.workspace.get("largest", z.shape, z.dtype, z.device).copy_(z)
            top.numpy().partition(classes - k, axis=1)
            top = top[:, classes - k:]
        else:
            top = torch.topk(z, k, dim=1, sorted=False).values
        return top, torch.topk(top, 2, dim=1).values[:, 1]


def scan_scores(scan: Scan, betas: Sequence[float], names: Sequence[str] = ("msp", "energy"),
                options: Mapping[str, Any] | None = None) -> list[dict[str, torch.Tensor]]:
    """Per-sample float64 OOD scores ``{name: [rows]}`` of ``scan``'s rows at each ``beta``, in one pass (a
    :class:`ScorePass` per thread of :meth:`Scan.block_pass`); ``options`` set up scores with parameters."""
    scores = [get_score(name, options) for name in names]
    scoring = ScorePass(scores, betas, workspace=scan.scratch)
    passes = {id(scan.scratch): scoring}  # one per thread of the block pass, each with that thread's buffers

    def block(b: RowBlock, scratch: Scratch) -> dict[str, torch.Tensor]:
        mine = passes.get(id(scratch))
        if mine is None:
            mine = passes[id(scratch)] = ScorePass(scores, scoring.betas, workspace=scratch)
        return mine.chunk(b.z, b.row_max, b.has_neginf)

    blocks = list(scan.block_pass(block))  # in row order
    empty = torch.empty(len(scoring.betas), 0, dtype=FLOAT64, device=scan.device)
    joined = {name: torch.cat([b[name] for b in blocks], dim=1) if blocks else empty for name in names}
    return [{name: values[k] for name, values in joined.items()} for k in range(len(scoring.betas))]


__all__ = ["ScorePass", "as_classes", "scan_scores"]
