"""``--objective ece`` with folds and groups: every subset's ECE search from shared reads.

The global T is the plain ECE fit's; each fold's and group's search (``n_g ECE_g(T) + lam (ln T - ln T_0)^2`` toward
the global T, or T_k within fold k) covers the same range around the global NLL optimum. The global search's passes
also evaluate the temperatures the fold searches want, keeping each cell's bin sums (:class:`CellEceTerms`); then
the fold searches finish together, then every group's.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..core.certified import CertifiedFit
from ..core.ece_fit import EceSearch, bin_sums, rounding_of
from ..core.kernels import bin_edges, confidence_bins
from ..core.parallel import Scratch, all_reduce
from ..core.scan import RowBlock, Scan
from .cells import CellLayout, SubsetTemperatures, cell_stats, subset_keys

#: The most per-cell bin sums (temperatures x 3 x cells x bins, float64) one pass keeps; more temperatures
#: are split over several reads.
MAX_ENTRIES = 1 << 24


class CellEceTerms:
    """One pass's sums at ``betas``: per cell, the equal-width bin sums ``[betas, cells, 3, bins]``; over every row,
    the bin sums at ``own`` (indices into ``betas``) exactly as :func:`~tempcal.core.ece_fit.bin_sums` adds
    them."""

    def __init__(self, betas: Sequence[float], own: Sequence[int], bins: int, cells: int, device: torch.device):
        self.betas, self.own, self.bins = [float(b) for b in betas], list(own), bins
        self.edges = bin_edges(bins, device)
        self.per_cell = torch.zeros(len(self.betas), 3, cells * bins, dtype=torch.float64, device=device)
        self.per_bin = torch.zeros(len(self.own), 3, bins, dtype=torch.float64, device=device)

    def block_bins(self, b: RowBlock, scratch: Scratch) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]],
                                                                  int]:
        """A block's work over every logit (run on the pass's threads): its rows' correctness and each beta's bin
        index and confidence."""
        d = torch.sub(b.z, b.row_max[:, None], out=scratch.like("d", b.z))
        return b.correct, confidence_bins(d, self.betas, self.edges, scratch, b.has_neginf), b.start

    def add_block(self, correct: torch.Tensor, binned: list[tuple[torch.Tensor, torch.Tensor]], cell: torch.Tensor
                  ) -> None:
        """Add a block's :meth:`block_bins` into its cells' sums (and the global search's); blocks added in row
        order give the bits of one thread."""
        hit = correct.to(torch.float64)
        mine = {k: j for j, k in enumerate(self.own)}
        for k, (index, confidence) in enumerate(binned):
            ones = torch.ones_like(confidence)
            slot = index + cell * self.bins
            for row, values in enumerate((ones, confidence, hit)):
                self.per_cell[k, row].index_add_(0, slot, values)
                if k in mine:  # the global search's own sums, exactly as its own pass would add them
                    self.per_bin[mine[k], row].index_add_(0, index, values)


def cell_ece_pass(scan: Scan, betas: Sequence[float], own: Sequence[int], bins: int, layout: CellLayout
                  ) -> CellEceTerms:
    """One pass (:meth:`Scan.block_pass`: the blocks' confidences on the pass's threads, added into the cells in row
    order) of :class:`CellEceTerms`, all-reduced."""
    terms = CellEceTerms(betas, own, bins, layout.count, scan.device)
    for correct, binned, start in scan.block_pass(terms.block_bins, row_bytes=16 * len(terms.betas)):
        terms.add_block(correct, binned, layout.cells[start:start + correct.shape[0]])
    terms.per_cell, terms.per_bin = all_reduce(terms.per_cell).cpu(), all_reduce(terms.per_bin).cpu()
    return terms


@dataclass(frozen=True)
class _EceFit:
    """One subset's search: its group (None: every cell), the fold it leaves out (None: none), its search."""

    group: int | None
    fold: int | None
    search: EceSearch


class SharedEce:
    """The subset ECE searches of one scan (see the module docstring)."""

    def __init__(self, scan: Scan, layout: CellLayout, *, groups: bool, lam: float, bins: int):
        self.scan, self.layout, self.bins, self.lam = scan, layout, bins, lam
        counts = cell_stats(scan, layout)[0].view(layout.groups, layout.folds)
        #: Each subset's group, fold left out and rows, in :func:`subset_keys`' order.
        self.subsets = [(group, fold, int(_fit_sum(counts, group, fold, dims=(0, 1))))
                        for group, fold in subset_keys(layout, groups)]
        self.folds: list[_EceFit] = []
        self.centre: float | None = None

    def _start(self, centre: float) -> None:
        """The fold searches, over the same range around ``centre`` (the global NLL optimum) as the plain fit's."""
        self.centre = centre
        self.folds = [self._fit(group, fold, count) for group, fold, count in self.subsets if group is None]

    def _fit(self, group: int | None, fold: int | None, count: int, target: float | None = None) -> _EceFit:
        """A subset's search; with a ``target`` T, drawn toward it by the group prior."""
        assert self.centre is not None
        penalty = (self.lam / max(count, 1), math.log(target)) if target is not None and self.lam > 0 else None
        return _EceFit(group, fold, EceSearch(self.centre, count, rounding=rounding_of(self.scan), penalty=penalty))

    def terms(self, betas: list[float], bins: int) -> torch.Tensor:
        """The global search's pass at ``betas``, carrying the fold searches' wanted temperatures (in the same read
        while the per-cell sums fit in memory)."""
        if self.centre is None:  # the first pass is at the global search's initial grid, around the NLL optimum
            self._start(math.sqrt(1.0 / (betas[0] * betas[-1])))
        folds = [f for f in self.folds if f.search.wanted]
        parts = self._pass(folds, [-math.log(b) for b in betas]) if folds else []
        if len(parts) != 1:  # no fold search, or the per-cell sums took several reads: the global search's own pass
            return bin_sums(self.scan, betas, bins)
        return parts[0].per_bin

    def _pass(self, fits: list[_EceFit], own: list[float]) -> list[CellEceTerms]:
        """One read at ``own`` and every temperature ``fits`` want (more reads only when the per-cell sums of
        every temperature would not fit :data:`MAX_ENTRIES`); each fit takes its values."""
        thetas, position = _merged(own, [t for f in fits for t in f.search.wanted])
        g, k, bins = self.layout.groups, self.layout.folds, self.bins
        step = max(2, MAX_ENTRIES // (3 * g * k * bins))
        parts = []
        for first in range(0, max(len(thetas) - 1, 1), step - 1):  # neighbouring parts share a temperature
            part = thetas[first:first + step]
            mine = [position[t] - first for t in own if first <= position[t] < first + len(part)]
            parts.append(cell_ece_pass(self.scan, [math.exp(-t) for t in part], mine, bins, self.layout))
        per_cell = torch.cat([p.per_cell if j == 0 else p.per_cell[1:] for j, p in enumerate(parts)])
        per_cell = per_cell.view(len(thetas), 3, g, k, bins)
        for fit in fits:
            if fit.search.wanted:
                sums = _fit_sum(per_cell, fit.group, fit.fold, dims=(2, 3))  # [thetas, 3, bins]: its cells summed
                fit.search.take([sums[position[t]] for t in fit.search.wanted])
        return parts

    def finish(self, global_t: float) -> SubsetTemperatures:
        """The fold searches to their end, then every group's; their temperatures."""
        if self.centre is None:
            self._start(global_t)
        self._run(self.folds)
        fold_t = [f.search.result()[0] for f in self.folds]
        group_fits = [self._fit(group, fold, count, global_t if fold is None else fold_t[fold])
                      for group, fold, count in self.subsets if group is not None]
        self._run(group_fits)

        def result(fit: _EceFit) -> CertifiedFit:
            temperature, _, certified = fit.search.result()
            return CertifiedFit(1.0 / temperature, 0, certified, 0.0 if certified else math.inf, math.nan)

        open_fits = sum(not f.search.certified for f in [*self.folds, *group_fits])
        warnings = [f"{open_fits} subset ECE search(es) stopped before certifying their tolerance"] if open_fits else []
        return SubsetTemperatures.of([(f.group, f.fold, result(f)) for f in [*self.folds, *group_fits]], self.layout,
                                     warnings)

    def _run(self, fits: list[_EceFit]) -> None:
        while any(f.search.wanted for f in fits):
            self._pass(fits, [])


def _merged(own: list[float], others: list[float]) -> tuple[list[float], dict[float, int]]:
    """Sorted distinct temperatures, each given one's position; one of ``others`` within 1e-12 in log T of
    another is counted once, and ``own`` ones (the global search's) are kept exactly."""
    points = sorted(set(own))
    for t in sorted(set(others)):
        j = bisect.bisect_left(points, t)
        if not any(abs(p - t) <= 1e-12 for p in points[max(j - 1, 0):j + 1]):
            points.insert(j, t)
    position = {p: j for j, p in enumerate(points)}
    for t in others:
        if t not in position:
            j = bisect.bisect_left(points, t)
            position[t] = min((i for i in (j - 1, j) if 0 <= i < len(points)), key=lambda i: abs(points[i] - t))
    return points, position


def _fit_sum(values: torch.Tensor, group: int | None, fold: int | None, dims: tuple[int, int]) -> torch.Tensor:
    """A subset's sums over its cells: ``values`` with a group and a fold axis at ``dims``."""
    g_dim, k_dim = dims
    family = values.sum((g_dim, k_dim)) if group is None else values.select(g_dim, group).sum(k_dim - 1)
    if fold is None:
        return family
    left = (values.select(k_dim, fold).sum(g_dim) if group is None
            else values.select(g_dim, group).select(k_dim - 1, fold))
    return family - left


__all__ = ["CellEceTerms", "SharedEce", "cell_ece_pass"]
