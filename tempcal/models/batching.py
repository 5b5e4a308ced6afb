"""Exported programs that take only some batch sizes (a static export, a bounded ``Dim``), run on any number of rows
in chunks they accept (a short chunk padded by repeating its last row, the padding's outputs dropped).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.export import ExportedProgram

#: (lower, upper) batch sizes a program accepts; upper None for no bound.
Limits = tuple[int, int | None]


def batch_limits(program: ExportedProgram) -> Limits | None:
    """The batch sizes (dim 0 of the first input) ``program`` accepts, None when any size is."""
    names = set(program.graph_signature.user_inputs)
    first = next((n for n in program.graph.nodes if n.op == "placeholder" and n.name in names), None)
    value = None if first is None else first.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return None
    size = value.shape[0]
    if isinstance(size, int):
        return size, size
    expr = size.node.expr
    if expr not in program.range_constraints:
        return None
    bounds = program.range_constraints[expr]
    low, high = float(bounds.lower), float(bounds.upper)  # sympy integers, or torch's int_oo (float: inf)
    lower = int(low) if low > 2 else 0  # torch lets sizes 0 and 1 through below a lower bound of 2
    upper = None if math.isinf(high) else int(high)
    return None if lower == 0 and upper is None else (lower, upper)


def fit_batches(graph: torch.nn.Module, limits: Limits | None) -> torch.nn.Module:
    """``graph`` itself when it takes any batch size, else wrapped to run on batches it accepts."""
    return graph if limits is None else FittedBatches(graph, limits)


def run_batch_size(net: Any, batch_size: int) -> int:
    """The batch size to run ``net`` at: a static program's own, else ``batch_size`` cut to the upper bound."""
    limits = getattr(net, "batch_limits", None)
    if limits is None:
        return batch_size
    lower, upper = limits
    if upper is not None and lower == upper:
        return upper
    return batch_size if upper is None else min(batch_size, upper)


class FittedBatches(torch.nn.Module):
    """A program run on any number of rows, in chunks of sizes it accepts (see the module docstring)."""

    def __init__(self, program: torch.nn.Module, limits: Limits) -> None:
        super().__init__()
        self.program = program
        self.batch_limits = limits

    def forward(self, x: torch.Tensor) -> Any:
        lower, upper = self.batch_limits
        rows = int(x.shape[0])
        if lower <= rows and (upper is None or rows <= upper):
            return self.program(x)
        if rows == 0:
            raise ValueError(f"no rows to run (the program takes batches of {_shown(self.batch_limits)} rows)")
        step = rows if upper is None else upper
        parts = []
        for start in range(0, rows, step):
            chunk = x[start:start + step]
            kept = int(chunk.shape[0])
            if kept < lower:
                chunk = torch.cat([chunk, chunk[-1:].expand(lower - kept, *chunk.shape[1:])])
            parts.append((self.program(chunk), kept, int(chunk.shape[0])))
        return _joined(parts, self.batch_limits)


def _joined(parts: list[tuple[Any, int, int]], limits: Limits) -> Any:
    """The chunks' outputs as one: each batch-shaped output cut to the rows kept, then concatenated."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    flat = [(tree_flatten(out), kept, ran) for out, kept, ran in parts]
    spec = flat[0][0][1]
    joined = []
    for index in range(len(flat[0][0][0])):
        pieces = []
        for (leaves, _), kept, ran in flat:
            leaf = leaves[index]
            batched = isinstance(leaf, torch.Tensor) and leaf.dim() >= 1 and leaf.shape[0] == ran
            if not batched:
                if len(flat) == 1:
                    pieces = [leaf]
                    break
                raise ValueError(f"output {index} has no row per input, so batches of other sizes than the "
                                 f"program's {_shown(limits)} rows cannot be joined")
            pieces.append(leaf[:kept])
        joined.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces))
    return tree_unflatten(joined, spec)


def _shown(limits: Limits) -> str:
    lower, upper = limits
    if lower == upper:
        return str(lower)
    return f"{lower}..{upper}" if upper is not None else f"at least {lower}"


__all__ = ["FittedBatches", "Limits", "batch_limits", "fit_batches", "run_batch_size"]
