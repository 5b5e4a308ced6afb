"""What one pass of the ECE search sums per chunk: equal-width bin sums at each temperature.

:func:`tempcal.core.ece_fit.minimise_ece` bounds the ECE on an interval of temperatures from the sums at its
two ends alone (count, confidence and correct per bin). They are sums over rows, so a pass computes every row's
confidence at all of its temperatures while the chunk is at hand and keeps only the sums: nothing per row
survives the chunk, and the sums all-reduce across processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from .bins import bin_edges, bin_index
from .distributed import all_reduce
from .scratch import Scratch

if TYPE_CHECKING:
    from .scan import Scan


class EceTerms:
    """Sums for the ECE search at ``betas``: ``per_bin`` ``[betas, 3, bins]`` (count, confidence, correct, binned
    as :meth:`Scan.calibration` bins)."""

    def __init__(self, betas: Sequence[float], bins: int, device: torch.device):
        self.betas = [float(b) for b in betas]
        self.edges = bin_edges(bins, device)
        self.per_bin = torch.zeros(len(self.betas), 3, bins, dtype=torch.float64, device=device)

    def add_chunk(self, d: torch.Tensor, correct: torch.Tensor, buffers: Scratch) -> None:
        """Add one chunk: ``d`` the logits minus their row maximum, ``correct`` whether the arg-max is right."""
        hit = correct.to(torch.float64)
        ones = torch.ones_like(hit)
        for k, beta in enumerate(self.betas):
            # The confidence exactly as the calibration pass forms it, so both put it in the same bin.
            e = torch.mul(d, beta, out=buffers.like("e", d)).exp_()
            confidence = e.sum(1).reciprocal().to(torch.float64)
            index = bin_index(confidence, self.edges)
            self.per_bin[k, 0].index_add_(0, index, ones)
            self.per_bin[k, 1].index_add_(0, index, confidence)
            self.per_bin[k, 2].index_add_(0, index, hit)


def bin_sums(scan: Scan, betas: Sequence[float], bins: int) -> torch.Tensor:
    """One pass of ``scan``: the per-bin count, confidence and correct sums ``[betas, 3, bins]`` at each beta,
    all-reduced across processes, on the CPU."""
    terms = EceTerms(betas, bins, scan.device)
    for z, _, row_max, _, correct, _ in scan.row_chunks():
        terms.add_chunk(torch.sub(z, row_max[:, None], out=scan.scratch.like("d", z)), correct, scan.scratch)
    return all_reduce(terms.per_bin).cpu()


__all__ = ["EceTerms", "bin_sums"]
