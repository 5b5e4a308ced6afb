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

from .calibration_pass import bin_edges, bin_index
from .distributed import all_reduce
from .threads import Scratch

if TYPE_CHECKING:
    from .scan import RowBlock, Scan


class EceTerms:
    """Sums for the ECE search at ``betas``: ``per_bin`` ``[betas, 3, bins]`` (count, confidence, correct, binned
    as :meth:`Scan.calibration` bins)."""

    def __init__(self, betas: Sequence[float], bins: int, device: torch.device):
        self.betas = [float(b) for b in betas]
        self.edges = bin_edges(bins, device)
        self.per_bin = torch.zeros(len(self.betas), 3, bins, dtype=torch.float64, device=device)

    def add_chunk(self, d: torch.Tensor, correct: torch.Tensor, buffers: Scratch) -> None:
        """Add one chunk: ``d`` the logits minus their row maximum, ``correct`` whether the arg-max is right."""
        self.add_block(self.block_bins(d, buffers), correct)

    def block_bins(self, d: torch.Tensor, buffers: Scratch) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each beta's bin index and confidence of a block's rows (``d`` as :meth:`add_chunk` takes it): the work
        over every logit, which blocks may do on several threads at once."""
        return confidence_bins(d, self.betas, self.edges, buffers)

    def add_block(self, binned: list[tuple[torch.Tensor, torch.Tensor]], correct: torch.Tensor) -> None:
        """Add a block's :meth:`block_bins`; blocks added in row order give the bits of :meth:`add_chunk`."""
        hit = correct.to(torch.float64)
        ones = torch.ones_like(hit)
        for k, (index, confidence) in enumerate(binned):
            self.per_bin[k, 0].index_add_(0, index, ones)
            self.per_bin[k, 1].index_add_(0, index, confidence)
            self.per_bin[k, 2].index_add_(0, index, hit)


def confidence_bins(d: torch.Tensor, betas: Sequence[float], edges: torch.Tensor, buffers: Scratch
                    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per beta, the equal-width bin index and float64 confidence of each row of ``d`` (logits minus their row
    maximum): the confidence exactly as the calibration pass forms it, so both put it in the same bin."""
    binned = []
    for beta in betas:
        e = torch.mul(d, beta, out=buffers.like("e", d)).exp_()
        confidence = e.sum(1).reciprocal().to(torch.float64)
        binned.append((bin_index(confidence, edges), confidence))
    return binned


def bin_sums(scan: Scan, betas: Sequence[float], bins: int) -> torch.Tensor:
    """One pass of ``scan``: the per-bin count, confidence and correct sums ``[betas, 3, bins]`` at each beta,
    all-reduced across processes, on the CPU. The blocks' confidences are computed on the pass's threads and
    binned in row order (the sums of one thread, bit for bit)."""
    terms = EceTerms(betas, bins, scan.device)

    def block(b: RowBlock, scratch: Scratch) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        return terms.block_bins(torch.sub(b.z, b.row_max[:, None], out=scratch.like("d", b.z)), scratch), b.correct

    for binned, correct in scan.block_pass(block, row_bytes=16 * len(terms.betas)):  # int64 index, float64 value
        terms.add_block(binned, correct)
    return all_reduce(terms.per_bin).cpu()


__all__ = ["EceTerms", "bin_sums", "confidence_bins"]
