"""What one pass of the ECE search sums per chunk: bin sums at each temperature and the drift between neighbours.

:func:`tempcal.core.ece_fit.minimise_ece` bounds the ECE on an interval of temperatures from its two ends:
the ECE at each end (equal-width bin sums) and the drift ``sum_i |conf_i(b) - conf_i(a)| + 2 k_i m_i``
(``k_i`` bin edges crossed, ``m_i`` the larger ``|correct_i - conf_i|`` of the two ends). Both are sums over
rows, so a pass computes every row's confidence at all of its temperatures while the chunk is at hand and
keeps only the sums: nothing per row survives the chunk, and the sums all-reduce across processes. The
temperatures come sorted, so each interval is a pair of neighbours and only the previous temperature's
confidences are held at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .bins import bin_edges, bin_index
from .scratch import Scratch


class EceTerms:
    """Sums for the ECE search at ``betas`` (sorted by temperature): ``per_bin`` ``[betas, 3, bins]`` (count,
    confidence, correct, binned as :meth:`Scan.calibration` bins) and ``drift`` ``[betas - 1]`` between neighbours."""

    def __init__(self, betas: Sequence[float], bins: int, device: torch.device):
        self.betas = [float(b) for b in betas]
        self.edges = bin_edges(bins, device)
        self.per_bin = torch.zeros(len(self.betas), 3, bins, dtype=torch.float64, device=device)
        self.drift = torch.zeros(max(len(self.betas) - 1, 0), dtype=torch.float64, device=device)

    def add_chunk(self, d: torch.Tensor, correct: torch.Tensor, buffers: Scratch) -> None:
        """Add one chunk: ``d`` the logits minus their row maximum, ``correct`` whether the arg-max is right."""
        hit = correct.to(torch.float64)
        previous: tuple[torch.Tensor, torch.Tensor] | None = None
        for k, beta in enumerate(self.betas):
            # The confidence exactly as the calibration pass forms it, so both put it in the same bin.
            e = torch.mul(d, beta, out=buffers.like("e", d)).exp_()
            confidence = e.sum(1).reciprocal().to(torch.float64)
            index = bin_index(confidence, self.edges)
            self.per_bin[k, 0].index_add_(0, index, torch.ones_like(confidence))
            self.per_bin[k, 1].index_add_(0, index, confidence)
            self.per_bin[k, 2].index_add_(0, index, hit)
            if previous is not None:
                before, before_index = previous
                slack = torch.maximum((hit - before).abs(), (hit - confidence).abs())
                crossed = (index - before_index).abs().to(torch.float64)
                self.drift[k - 1] += ((confidence - before).abs() + 2 * crossed * slack).sum()
            previous = (confidence, index)


__all__ = ["EceTerms"]
