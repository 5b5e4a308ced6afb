"""The validating scan's checks of one block: the reductions over every logit, the values refused, and the
per-row moments at T = infinity that the fit starts from (:meth:`tempcal.core.scan.Scan`'s first pass)."""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch

from ..errors import DataError
from .data import LogitsSource
from .distributed import all_reduce


class Reductions(NamedTuple):
    """A block's reductions over every logit, for the first scan: computed on the pass's threads."""

    row_sum: torch.Tensor
    row_max: torch.Tensor
    arg_max: torch.Tensor
    squares: torch.Tensor  # sum of z^2 per row
    low: torch.Tensor | None  # min z per row (the fit's start needs the rows' ranges)


def row_reductions(z: torch.Tensor, low: bool = False) -> Reductions:
    """The reductions over every logit of ``z``'s rows (``low``: their minima too)."""
    row_sum = z.sum(1)  # first, as the validating scan did before its blocks
    row_max, arg_max = torch.max(z, 1)
    squares = row_squares(z)
    return Reductions(row_sum, row_max, arg_max, squares, z.amin(1) if low else None)


def row_squares(z: torch.Tensor) -> torch.Tensor:
    """Each row's sum of squares, as its norm squared: one vectorised sweep with no temporary (2-3x faster than a
    product and a sum or ``vecdot``), within a few float32 ulps, which is enough for the start's spread."""
    return torch.linalg.vector_norm(z, dim=1).square_()


def uniform_moments(z: torch.Tensor, row_sum: torch.Tensor, row_max: torch.Tensor, has_neginf: torch.Tensor,
                     squares: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of ``z - max z`` over each row's finite entries (the fit's view at T = infinity)."""
    mean = row_sum / z.shape[1] - row_max
    # Only the fit's starting point uses the spread, so the one-read E[z^2] - E[z]^2 form is enough.
    squares = row_squares(z) if squares is None else squares
    var = (squares / z.shape[1] - (row_sum / z.shape[1]) ** 2).clamp_min(0)
    if bool(has_neginf.any()):
        rows = z[has_neginf]
        finite = torch.isfinite(rows)
        d = torch.where(finite, rows - row_max[has_neginf, None], torch.zeros((), dtype=z.dtype, device=z.device))
        count = finite.sum(1)
        mean[has_neginf] = d.sum(1) / count
        var[has_neginf] = ((d * d).sum(1) / count - mean[has_neginf] ** 2).clamp_min(0)
    return mean, var


def probability_like(z: torch.Tensor, row_max: torch.Tensor, row_sum: torch.Tensor) -> bool:
    """Every value in [0, 1] and (for several classes) every row summing to 1 within 1e-3."""
    if z.dim() == 1:
        return bool(((z >= 0) & (z <= 1)).all())
    if not bool((row_max <= 1).all() and ((row_sum - 1).abs() <= 1e-3).all()):
        return False
    return bool((z >= 0).all())


class Problems:
    """Counts each kind of bad value over the whole scan, so the error says how many and where first."""

    MESSAGES: ClassVar[dict[str, str]] = {
        "label": "label{s} outside {labels}",
        "nan": "row{s} with NaN logits",
        "posinf": "row{s} with +inf logits",
        "all-neginf": "row{s} whose logits are all -inf",
        "true-neginf": "row{s} whose true class has logit -inf (infinite NLL)",
    }

    def __init__(self, data: LogitsSource):
        self.data = data
        self.found: dict[str, list] = {}

    def __bool__(self) -> bool:
        return bool(self.found)

    def add(self, kind: str, start: int, mask: torch.Tensor, detail=None) -> None:
        count = int(mask.sum())
        if not count:
            return
        if kind not in self.found:
            first = int(mask.nonzero()[0, 0])
            extra = f" ({detail(first)})" if detail else ""
            index = self.data.original_index(start + first)
            self.found[kind] = [0, f"{index}{extra}", index]
        self.found[kind][0] += count

    def raise_first(self, device: torch.device) -> None:
        """Raise for the first kind of problem found on any rank, with the count over all ranks."""
        kinds = list(self.MESSAGES)
        counts = torch.tensor([self.found.get(k, [0])[0] for k in kinds], dtype=torch.int64, device=device)
        firsts = torch.tensor([self.found[k][2] if k in self.found else 2**62 for k in kinds], dtype=torch.int64,
                              device=device)
        all_reduce(counts)
        all_reduce(firsts, "min")
        for kind, message, count, first_index in zip(kinds, self.MESSAGES.values(), counts.tolist(), firsts.tolist(),
                                                     strict=True):
            if count:
                mine = kind in self.found and self.found[kind][2] == first_index
                first = self.found[kind][1] if mine else str(first_index)
                labels = "0..1 (binary)" if self.data.binary else f"0..{self.data.num_classes - 1}"
                raise DataError(f"{count} {message.format(labels=labels, s='' if count == 1 else 's')}; "
                               f"first at index {first}")


__all__ = ["Problems", "Reductions", "probability_like", "row_reductions", "uniform_moments"]
