"""What one calibration pass, and one pass of the ECE search, sum per chunk at each temperature, and what the
calibration pass keeps per row when asked; and the contract's equal-width confidence bins, which every binned figure
(ECE and its bins, RMS calibration error, the classwise ECE, the ECE search, the bootstrap) takes from here, so a
confidence falls into the same bin everywhere.

Per row at ``beta``: the confidence, NLL, Brier score and entropy summed in float64, and the confidences binned in
the contract's bins. ``keep=("confidence",)`` writes every row's confidence into one ``[betas, rows]`` float64 array
for the rankings, and a ``visitor`` (conformal sets) is handed each chunk's ``d = z - max z``, in the same read.

The ECE search (:class:`EceTerms`, summed by :func:`tempcal.core.ece_fit.bin_sums`): its search bounds the ECE on an
interval of temperatures from the sums at its two ends alone (count, confidence and correct per bin). They are sums
over rows, so a pass computes every row's confidence at all of its temperatures while the chunk is at hand and keeps
only the sums: nothing per row survives the chunk, and the sums all-reduce across processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ..validation import check_bins
from .cumulants import dot_rows, exp_floor
from .threads import Scratch

#: The bins of every binned figure unless ``--bins`` (or ``bins=``) says otherwise.
DEFAULT_BINS = 15
#: What ``keep`` may name: the confidence (max softmax) and the energy ``T logsumexp(z / T)`` of every row.
KEPT = ("confidence", "energy")


def bin_edges(bins: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The contract's equal-width edges i/B, exactly (``torch.linspace`` misses some by one ulp); bins checked first."""
    return torch.arange(check_bins(bins) + 1, dtype=torch.float64, device=device) / bins


def bin_index(confidence: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Bin i holds confidences in (i/B, (i+1)/B]; the first also holds 0."""
    return (torch.searchsorted(edges, confidence, right=False) - 1).clamp_(0, edges.numel() - 2)


def add_to_bins(per_bin: torch.Tensor, index: torch.Tensor, confidence: torch.Tensor, hit: torch.Tensor) -> None:
    """Add rows to ``per_bin`` ``[3, bins]`` (count, confidence, correct) at their bin ``index``."""
    per_bin[0].index_add_(0, index, torch.ones_like(confidence))
    per_bin[1].index_add_(0, index, confidence)
    per_bin[2].index_add_(0, index, hit)


@dataclass(frozen=True)
class CalibrationSums:
    """Sums over samples at one temperature, with equal-width confidence bins."""

    count: int
    nll: float
    brier: float
    entropy: float
    correct: float
    confidence: float
    bin_count: torch.Tensor  # [bins] float64
    bin_confidence: torch.Tensor  # [bins] sum of confidences
    bin_correct: torch.Tensor  # [bins] sum of correct


class ChunkVisitor(Protocol):
    """Whatever else a pass computes from a chunk: ``add`` gets the chunk's ``d = z - max z`` (compute dtype, on
    the scan's device), its labels and the position of its first row, at the ``k``-th temperature ``beta``."""

    def add(self, k: int, beta: float, d: torch.Tensor, labels: torch.Tensor, start: int) -> None: ...


#: One block's figures: sums ``[betas, 5]``, each temperature's (bin index, confidence) per row, correctness.
BlockSums = tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]


class CalibrationTerms:
    """The sums of :meth:`tempcal.core.scan.Scan.calibration` at ``betas``, chunk by chunk, over ``rows`` rows."""

    def __init__(self, betas: Sequence[float], bins: int, device: torch.device, rows: int,
                 keep: Sequence[str] = (), visitor: ChunkVisitor | None = None):
        self.betas = [float(b) for b in betas]
        self.edges = bin_edges(bins, device)
        self.acc = torch.zeros(len(self.betas), 5, dtype=torch.float64, device=device)
        self.per_bin = torch.zeros(len(self.betas), 3, bins, dtype=torch.float64, device=device)
        unknown = set(keep) - set(KEPT)
        if unknown:
            raise ValueError(f"cannot keep {sorted(unknown)}; only {KEPT}")
        self.kept = {name: torch.empty(len(self.betas), rows, dtype=torch.float64, device=device) for name in keep}
        self.visitor = visitor
        self.position = 0

    def add_chunk(self, z: torch.Tensor, y: torch.Tensor, row_max: torch.Tensor, gap: torch.Tensor,
                  correct: torch.Tensor, has_neginf: bool, scratch: Scratch) -> None:
        """One chunk of :meth:`Scan.row_chunks` (the chunks come in order, so the rows' positions are known)."""
        self._add(z, y, row_max, gap, correct, has_neginf, scratch, self.position, self.acc, self.per_bin)
        self.position += z.shape[0]

    def block_sums(self, z: torch.Tensor, row_max: torch.Tensor, gap: torch.Tensor, correct: torch.Tensor,
                   has_neginf: bool, scratch: Scratch, start: int) -> BlockSums:
        """One block's figures, its kept ones written in place: blocks may run on several threads at once (without
        a visitor); :meth:`add_block` then adds them up in row order, as :meth:`add_chunk` would have."""
        acc = torch.zeros_like(self.acc)
        binned = self._add(z, None, row_max, gap, correct, has_neginf, scratch, start, acc, None)
        return acc, binned, correct.to(torch.float64)

    def add_block(self, block: BlockSums) -> None:
        acc, binned, hit = block
        self.acc += acc
        for k, (index, confidence) in enumerate(binned):
            add_to_bins(self.per_bin[k], index, confidence, hit)

    def _add(self, z: torch.Tensor, y: torch.Tensor | None, row_max: torch.Tensor, gap: torch.Tensor,
             correct: torch.Tensor, has_neginf: bool, scratch: Scratch, start: int, acc: torch.Tensor,
             per_bin: torch.Tensor | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Add a chunk's sums into ``acc`` and its bins into ``per_bin`` (None: each temperature's bin index and
        confidences are returned instead)."""
        stop = start + z.shape[0]
        d = torch.sub(z, row_max[:, None], out=scratch.like("d", z))
        hit = correct.to(torch.float64)
        d_finite = d.nan_to_num(neginf=0.0) if has_neginf else d
        binned = []
        for k, beta in enumerate(self.betas):
            nll, brier, entropy, confidence, log_s0 = row_calibration(scratch, d, d_finite, gap, beta)
            acc[k, 0] += nll.sum(dtype=torch.float64)
            acc[k, 1] += brier.sum(dtype=torch.float64)
            acc[k, 2] += entropy.sum(dtype=torch.float64)
            acc[k, 3] += hit.sum()
            acc[k, 4] += confidence.sum()
            index = bin_index(confidence, self.edges)
            if per_bin is None:
                binned.append((index, confidence))
            else:
                add_to_bins(per_bin[k], index, confidence, hit)
            if "confidence" in self.kept:
                self.kept["confidence"][k, start:stop] = confidence
            if "energy" in self.kept:
                self.kept["energy"][k, start:stop] = row_max.to(torch.float64) + log_s0.to(torch.float64) / beta
            if self.visitor is not None and y is not None:
                self.visitor.add(k, beta, d, y, start)
        return binned

    def results(self, acc: torch.Tensor, per_bin: torch.Tensor, count: int
                ) -> list[tuple[CalibrationSums, dict[str, torch.Tensor] | None]]:
        """Per temperature: the sums (``acc`` and ``per_bin`` reduced over ranks) and what was kept of this
        process's rows (views of the preallocated arrays; None when nothing was)."""
        out = []
        for k in range(len(self.betas)):
            nll, brier, entropy, correct_sum, confidence_sum = acc[k].tolist()
            sums = CalibrationSums(count, nll, brier, entropy, correct_sum, confidence_sum,
                                   per_bin[k, 0], per_bin[k, 1], per_bin[k, 2])
            kept = {name: values[k, :self.position] for name, values in self.kept.items()} if self.kept else None
            out.append((sums, kept))
        return out


def row_calibration(scratch: Scratch, d: torch.Tensor, d_finite: torch.Tensor, gap: torch.Tensor,
                    beta: float | torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each row's NLL, Brier score and entropy (in ``d``'s dtype, as the pass sums them), float64 confidence and
    ``log sum e`` (the energy's) at ``beta`` (a number, or one per row), from ``d = z - max z`` (``d_finite``: -inf
    made 0) and the true class's ``gap``; one exp per logit, in the scratch buffer ``e``."""
    b = beta[:, None] if isinstance(beta, torch.Tensor) else beta
    e = scaled_exp(d, b, scratch, neginf=d_finite is not d)
    s0 = e.sum(1)
    log_s0 = torch.log(s0)
    mean_d = dot_rows(e, d_finite, scratch) / s0
    p_true = torch.exp(beta * gap) / s0
    brier = dot_rows(e, e, scratch) / (s0 * s0) - 2 * p_true + 1
    return (log_s0 - beta * gap, brier.clamp_min(0), (log_s0 - beta * mean_d).clamp_min(0),
            s0.reciprocal().to(torch.float64), log_s0)



def scaled_exp(d: torch.Tensor, beta: float | torch.Tensor, scratch: Scratch, neginf: bool = True) -> torch.Tensor:
    """``exp(beta d)`` of ``d = z - max z`` in the scratch buffer ``e``. Without a -inf in ``d`` (``neginf``
    False), exponents below :func:`exp_floor` are raised to it first: what they add to a row's sum of at least 1
    is nothing, and it spares the CPU's slow path."""
    x = torch.mul(d, beta, out=scratch.like("e", d))
    return x.exp_() if neginf else x.clamp_(min=exp_floor(x.dtype)).exp_()


class EceTerms:
    """Sums for the ECE search at ``betas``: ``per_bin`` ``[betas, 3, bins]`` (count, confidence, correct, binned
    as :meth:`Scan.calibration` bins)."""

    def __init__(self, betas: Sequence[float], bins: int, device: torch.device):
        self.betas = [float(b) for b in betas]
        self.edges = bin_edges(bins, device)
        self.per_bin = torch.zeros(len(self.betas), 3, bins, dtype=torch.float64, device=device)

    def block_bins(self, d: torch.Tensor, buffers: Scratch, neginf: bool = True
                   ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each beta's bin index and confidence of a block's rows (``d``: the logits minus their row maximum;
        ``neginf``: whether it may hold -inf): the work over every logit, which blocks may do on several threads
        at once."""
        return confidence_bins(d, self.betas, self.edges, buffers, neginf)

    def add_block(self, binned: list[tuple[torch.Tensor, torch.Tensor]], correct: torch.Tensor) -> None:
        """Add a block's :meth:`block_bins` (``correct``: whether each arg-max is right); blocks added in row order
        give the bits of one thread."""
        hit = correct.to(torch.float64)
        for k, (index, confidence) in enumerate(binned):
            add_to_bins(self.per_bin[k], index, confidence, hit)


def confidence_bins(d: torch.Tensor, betas: Sequence[float], edges: torch.Tensor, buffers: Scratch,
                    neginf: bool = True) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per beta, the equal-width bin index and float64 confidence of each row of ``d`` (logits minus their row
    maximum): the confidence exactly as the calibration pass forms it, so both put it in the same bin."""
    binned = []
    for beta in betas:
        confidence = scaled_exp(d, beta, buffers, neginf).sum(1).reciprocal().to(torch.float64)
        binned.append((bin_index(confidence, edges), confidence))
    return binned


__all__ = ["DEFAULT_BINS", "KEPT", "BlockSums", "CalibrationSums", "CalibrationTerms", "ChunkVisitor", "EceTerms",
           "add_to_bins", "bin_edges", "bin_index", "confidence_bins", "row_calibration"]
