"""What a pass computes from each row block at one temperature, from one exp per logit, in float64 sums that blocks and
ranks add up: the NLL and its derivatives in ``beta`` (the fit's passes), the calibration figures and their bins."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ..errors import check_bins
from .parallel import Scratch

# -- the NLL and its derivatives in beta -------------------------------------------------------------------------------
# The fit pass's kernel: the mean NLL of ``softmax(beta * z)`` and its first four derivatives in ``beta``.
#
# For one row of logits ``z`` (``-inf`` marks an impossible class) and its label ``y``,
#
#     A(beta)   = log sum_c exp(beta z_c)              (the log-partition function)
#     NLL(beta) = A(beta) - beta z_y.
#
# The derivatives of ``A`` are the cumulants of ``z`` under ``p = softmax(beta z)``, so
#
#     NLL'    = k1 - z_y = E_p[z] - z_y
#     NLL''   = k2 = mu2                     (the variance, >= 0: the NLL is convex in beta)
#     NLL'''  = k3 = mu3
#     NLL'''' = k4 = mu4 - 3 mu2^2
#
# with ``mu_k`` the central moments, all from one exp per logit (``p = softmax(beta (z - max z))``), taken about the
# mean so that no power sum cancels. A chunk's result is a float64 vector of sums over its rows (:data:`FIELDS`:
# ``count, nll, d1..d4`` and the error bound's ``q = mu2^2``, ``q5 = sqrt(mu2^3 mu4)``), so chunks and ranks add up.

#: Order of the fields in a chunk's float64 sums.
FIELDS = ("count", "nll", "d1", "d2", "d3", "d4", "q", "q5")
#: How many sums :func:`raw_sums` gives a block.
RAW_FIELDS = 9
#: Scaled logits below -CLIP have probability exactly 0 in float32 and float64 alike.
CLIP = 2000.0


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


def row_moments(z: torch.Tensor, beta: float | torch.Tensor, labels: torch.Tensor, buffers: Scratch | None = None,
                *, top: torch.Tensor | None = None, impossible: bool | None = None) -> RowMoments:
    """Moments of each row of ``z`` [n, C] under ``softmax(beta z)`` (``beta``: a number or one per row): one exp per
    entry, centred sums. ``top`` (row maxima) and ``impossible`` (the chunk holds ``-inf``) save work when known."""
    if not isinstance(beta, torch.Tensor) and beta == 0:
        return _uniform_moments(z)
    buffers = buffers or Scratch()
    b: float | torch.Tensor = beta.to(z.dtype)[:, None] if isinstance(beta, torch.Tensor) else float(beta)
    top = z.amax(1) if top is None else top
    x = torch.sub(z, top[:, None], out=buffers.like("d", z)).mul_(b)
    if impossible is False:
        x.clamp_(min=exp_floor(x.dtype))
    p = _softmax_of_shifted(x, buffers.like("e", z))
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


def _softmax_of_shifted(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``softmax(x, 1)`` into ``out`` for rows whose largest entry is 0 (``beta (z - max z)``). On the CPU that is
    an exp, a row sum and a division, which nothing can overflow: 11-15x faster than ``torch.softmax`` on one thread
    for 10 classes, 1.1x at 100, the same at 1,000 (``benchmarks/softmax_rows.py``); elsewhere the fused kernel
    reads memory less."""
    if x.device.type != "cpu":
        return torch.softmax(x, 1, out=out)
    p = torch.exp(x, out=out)
    return p.div_(p.sum(1, keepdim=True))


def exp_floor(dtype: torch.dtype) -> float:
    """The least exponent worth taking in ``dtype``: below it ``exp`` gives a subnormal or 0 (nothing that moves a
    sum that holds a 1), and the CPU's float32 ``exp`` takes a slow path there. Scaled logits ``beta
    (z - max z)`` are clamped to it first; a -inf (an impossible class) is left alone."""
    return -87.0 if dtype != torch.float64 else -708.0


def _repair(z: torch.Tensor, b: float | torch.Tensor, top: torch.Tensor, mean: torch.Tensor,
            central: tuple[torch.Tensor, torch.Tensor, torch.Tensor], log_mass: torch.Tensor, buffers: Scratch
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
    mu2, mu3, mu4 = _central(p, d - mean[:, None], Scratch())
    return RowMoments(top, torch.log(count), mean, mu2, mu3, mu4)


def _central(p: torch.Tensor, u: torch.Tensor, buffers: Scratch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``sum_c p u^k`` for k = 2, 3, 4 with two products and three reductions; ``p`` is overwritten."""
    v = torch.mul(u, u, out=buffers.like("v", u))
    w = p.mul_(v)
    return w.sum(1), dot_rows(w, u, buffers), dot_rows(w, v, buffers)


#: Up to this many classes a batched matrix product is the faster row-wise dot product on the CPU; from about 400
#: classes on it stops vectorising and is several times slower than a product and a sum.
ROW_DOT_MAX_CLASSES = 256
#: Below this many bytes of ``a`` the product and its sum stay in a core's cache and are the faster (about 1.6x at
#: 163 x 100 float32), and cost fewer interpreter calls.
ROW_DOT_MIN_BYTES = 1 << 20


def dot_rows(a: torch.Tensor, b: torch.Tensor, buffers: Scratch) -> torch.Tensor:
    """Row-wise ``sum a * b`` with no chunk-sized temporary (``vecdot`` allocates one): a batched matrix product on the
    CPU for short rows too many to stay in cache (an accelerator's matrix products may be set to round float32
    inputs), else a product in the reused buffer ``product``, summed."""
    if (a.device.type == "cpu" and a.shape[-1] <= ROW_DOT_MAX_CLASSES
            and a.numel() * a.element_size() >= ROW_DOT_MIN_BYTES):
        return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)
    return torch.mul(a, b, out=buffers.like("product", a)).sum(1)


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


def row_raw_sums(z: torch.Tensor, y: torch.Tensor, beta: float, buffers: Scratch | None = None, *,
                 top: torch.Tensor | None = None, impossible: bool | None = None) -> torch.Tensor:
    """:func:`raw_sums` over a block of rows ``z`` [n, C]: a pass's threads add these up, and the caller finishes
    them once (fewer small operations per block, where the threads contend for the interpreter)."""
    y = y.to(torch.int64)
    z_true = z.gather(1, y[:, None])[:, 0]
    return raw_sums(row_moments(z, beta, y, buffers, top=top, impossible=impossible), z_true)


def row_cumulants(z: torch.Tensor, y: torch.Tensor, beta: float, buffers: Scratch | None = None, *,
                  top: torch.Tensor | None = None, impossible: bool | None = None) -> torch.Tensor:
    """Float64 sums (:data:`FIELDS`) over a chunk of rows ``z`` [n, C] (a binary logit already as ``[0, z]``)."""
    return finished_sums(row_raw_sums(z, y, beta, buffers, top=top, impossible=impossible), z.shape[0], beta)


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


# -- the calibration pass, the contract's bins and the ECE search's sums -----------------------------------------------
# What one calibration pass, and one pass of the ECE search, sum per chunk at each temperature, and what the
# calibration pass keeps per row when asked; and the contract's equal-width confidence bins, which every binned figure
# (ECE and its bins, RMS calibration error, the classwise ECE, the ECE search, the bootstrap) takes from here, so a
# confidence falls into the same bin everywhere. The ECE search's pass (:func:`tempcal.core.ece_fit.bin_sums`) sums
# those bins alone (:class:`EceTerms`); the calibration pass adds the NLL, Brier score and entropy per temperature.

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
    """Whatever else a pass computes from a block of rows: ``add`` gets the block's ``d = z - max z`` (compute dtype,
    on the scan's device), its labels and the position of its first row, to take at each of ``betas``. The blocks
    run on the pass's threads at once (disjoint rows, torch single-threaded on each): what ``add`` writes must
    take that."""

    def add(self, betas: Sequence[float], d: torch.Tensor, labels: torch.Tensor, start: int) -> None: ...


#: One block's figures: sums ``[betas, 5]``, each temperature's (bin index, confidence) per row, whether it is right.
BlockSums = tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]


class EceTerms:
    """Sums for the ECE search at ``betas``: ``per_bin`` ``[betas, 3, bins]`` (count, confidence, correct, binned
    as :meth:`Scan.calibration` bins)."""

    def __init__(self, betas: Sequence[float], bins: int, device: torch.device):
        self.betas = [float(b) for b in betas]
        self.edges = bin_edges(bins, device)
        self.per_bin = torch.zeros(len(self.betas), 3, bins, dtype=torch.float64, device=device)

    def add_block(self, binned: list[tuple[torch.Tensor, torch.Tensor]], correct: torch.Tensor) -> None:
        """Add a block's :func:`confidence_bins` at ``betas`` (``correct``: whether each arg-max is right); blocks
        added in row order give the bits of one thread."""
        hit = correct.to(torch.float64)
        for k, (index, confidence) in enumerate(binned):
            add_to_bins(self.per_bin[k], index, confidence, hit)


class CalibrationTerms(EceTerms):
    """The sums of :meth:`tempcal.core.scan.Scan.calibration` at ``betas``, chunk by chunk, over ``rows`` rows."""

    def __init__(self, betas: Sequence[float], bins: int, device: torch.device, rows: int,
                 keep: Sequence[str] = (), visitor: ChunkVisitor | None = None):
        super().__init__(betas, bins, device)
        self.acc = torch.zeros(len(self.betas), 5, dtype=torch.float64, device=device)
        unknown = set(keep) - set(KEPT)
        if unknown:
            raise ValueError(f"cannot keep {sorted(unknown)}; only {KEPT}")
        self.kept = {name: torch.empty(len(self.betas), rows, dtype=torch.float64, device=device) for name in keep}
        self.visitor = visitor

    def block_sums(self, z: torch.Tensor, y: torch.Tensor, row_max: torch.Tensor, gap: torch.Tensor,
                   correct: torch.Tensor, has_neginf: bool, scratch: Scratch, start: int) -> BlockSums:
        """One block's figures, its kept ones (and the visitor's) written in place: blocks may run on several threads
        at once; :meth:`add_sums` then adds them up in row order, as one thread would have."""
        acc = torch.zeros_like(self.acc)
        return acc, self._add(z, y, row_max, gap, correct, has_neginf, scratch, start, acc), correct

    def add_sums(self, block: BlockSums) -> None:
        acc, binned, correct = block
        self.acc += acc
        self.add_block(binned, correct)

    def _add(self, z: torch.Tensor, y: torch.Tensor, row_max: torch.Tensor, gap: torch.Tensor,
             correct: torch.Tensor, has_neginf: bool, scratch: Scratch, start: int, acc: torch.Tensor
             ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Add a chunk's sums into ``acc``; each temperature's bin index and confidences, for :meth:`add_block`."""
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
            binned.append((bin_index(confidence, self.edges), confidence))
            if "confidence" in self.kept:
                self.kept["confidence"][k, start:stop] = confidence
            if "energy" in self.kept:
                self.kept["energy"][k, start:stop] = row_max.to(torch.float64) + log_s0.to(torch.float64) / beta
        if self.visitor is not None:
            self.visitor.add(self.betas, d, y, start)
        return binned

    def results(self, acc: torch.Tensor, per_bin: torch.Tensor, count: int
                ) -> list[tuple[CalibrationSums, dict[str, torch.Tensor] | None]]:
        """Per temperature: the sums (``acc`` and ``per_bin`` reduced over ranks) and what was kept of this
        process's rows (views of the preallocated arrays; None when nothing was)."""
        return [(CalibrationSums(count, *acc[k].tolist(), *per_bin[k]),
                 {name: values[k] for name, values in self.kept.items()} if self.kept else None)
                for k in range(len(self.betas))]


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


def confidence_bins(d: torch.Tensor, betas: Sequence[float], edges: torch.Tensor, buffers: Scratch,
                    neginf: bool = True) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per beta, the equal-width bin index and float64 confidence of each row of ``d`` (logits minus their row
    maximum): the confidence exactly as the calibration pass forms it, so both put it in the same bin."""
    binned = []
    for beta in betas:
        confidence = scaled_exp(d, beta, buffers, neginf).sum(1).reciprocal().to(torch.float64)
        binned.append((bin_index(confidence, edges), confidence))
    return binned


__all__ = ["DEFAULT_BINS", "FIELDS", "KEPT", "RAW_FIELDS", "BlockSums", "CalibrationSums", "CalibrationTerms",
           "ChunkVisitor", "EceTerms", "NllDerivatives", "RowMoments", "add_to_bins", "bin_edges", "bin_index",
           "confidence_bins", "dot_rows", "exp_floor", "finished_sums", "raw_sums", "row_calibration",
           "row_cumulants", "row_moments", "row_range", "row_raw_sums", "row_terms"]
