"""The contract's equal-width confidence bins: bin i of B holds values in (i/B, (i+1)/B], the first also 0.

Every binned figure (the ECE and its bins, RMS calibration error, the classwise ECE, the ECE search and the
bootstrap) bins with these two functions, so a confidence falls into the same bin everywhere.
"""

from __future__ import annotations

import torch

from ..validation import check_bins

#: The bins of every binned figure unless ``--bins`` (or ``bins=``) says otherwise.
DEFAULT_BINS = 15


def bin_edges(bins: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The contract's equal-width edges i/B, exactly (``torch.linspace`` misses some by one ulp); bins checked first."""
    return torch.arange(check_bins(bins) + 1, dtype=torch.float64, device=device) / bins


def bin_index(confidence: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Bin i holds confidences in (i/B, (i+1)/B]; the first also holds 0."""
    return (torch.searchsorted(edges, confidence, right=False) - 1).clamp_(0, edges.numel() - 2)


__all__ = ["DEFAULT_BINS", "bin_edges", "bin_index"]
