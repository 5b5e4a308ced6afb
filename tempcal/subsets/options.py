"""``--folds K``, ``--group-by KEY``, ``--group-prior LAM``: the checks the commands and the Python API share,
what ``fit`` fits besides the global T (:class:`Plan`) and asks besides (:class:`Asked`), and each row's group as
SOURCE's kind reads it (and, for ``apply``, each row's stored T). Nothing here imports torch or numpy as it loads:
``tempcal --help`` stays fast.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..errors import Note, TempcalError, param, shown_value

if TYPE_CHECKING:
    import torch

    from ..requests import FitRequest
    from ..sources.base import OpenedSource, RowGroups
    from ..sources.stored_groups import StoredGroups

#: The default ``group_prior``: a group's NLL is drawn toward the global T as if by this many rows' worth
#: of evidence (see the README's measurement: a group of 20 rows is not fitted to noise).
DEFAULT_GROUP_PRIOR = 10.0
#: The largest ``group_prior``: far past the point where every group's T is the global T to the fit's tolerance,
#: and below where the prior's derivatives (``lam / rows * ln T``) would overflow.
MAX_GROUP_PRIOR = 1e15


def check_prior(lam: Any) -> float:
    """``group_prior``: a number >= 0 (None: the default)."""
    if lam is None:
        return DEFAULT_GROUP_PRIOR
    try:
        value = float(lam) if isinstance(lam, (int, float)) and not isinstance(lam, bool) else float("nan")
    except OverflowError:  # an integer beyond any float
        value = float("inf")
    if not (0 <= value <= MAX_GROUP_PRIOR):
        raise TempcalError(f"{param('group_prior')} {shown_value(lam)}: expected a number from 0 (independent fits per "
                           f"group) to {MAX_GROUP_PRIOR:g} (every group at the global T already)")
    return value


def check_folds(k: Any, rows: int | None = None) -> int:
    """``folds``: a whole number K with 2 <= K, and K <= ``rows`` (the rows that count) once they are known."""
    whole = isinstance(k, numbers.Integral) and not isinstance(k, bool)
    if not whole or k < 2 or (rows is not None and k > rows):
        most = "" if rows is None else f" <= {rows} (the rows that count)"
        raise TempcalError(f"{param('folds')} {shown_value(k, quote=False)}: expected a whole number K with "
                           f"2 <= K{most}")
    return int(k)


@dataclass(frozen=True)
class Plan:
    """What to fit besides the global T: ``folds`` (K or None), the rows' groups, the prior's weight."""

    folds: int | None = None
    groups: RowGroups | None = None
    lam: float = DEFAULT_GROUP_PRIOR


@dataclass(frozen=True)
class Asked:
    """What ``fit`` or ``report`` asked for besides the subsets: the bins, the seed, the estimators, the bootstrap's
    resamples, the conformal miscoverage levels and (``fit``) the objective."""

    bins: int
    seed: int
    estimators: Sequence[str] = ()
    bootstrap: int = 0
    alphas: list[float] = field(default_factory=list)
    objective: str = "nll"

    def interval_fields(self, intervals: dict[str, tuple[float, float]]) -> dict:
        """Bootstrap intervals as the JSON shows them: ``*_ci`` per figure, and the resamples that drew them."""
        return {**{f"{name}_ci": list(interval) for name, interval in intervals.items()},
                "bootstrap": {"resamples": self.bootstrap, "seed": self.seed, "level": 0.95}}


def plan(folds: Any, group_prior: Any, eval_file: Any, val_fraction: Any) -> Plan:
    """``fit``'s plan from its arguments; ``folds`` refused with ``eval_file`` or a ``val_fraction``."""
    if folds is not None:
        folds = check_folds(folds)
        if eval_file is not None:
            raise TempcalError(f"{param('folds')} fits and reports on every row of SOURCE, out of fold; "
                               f"{param('eval')} names another evaluation set: give one or the other")
        if val_fraction is not None:
            raise TempcalError(f"{param('folds')} fits on every row, out of fold; {param('val_fraction')} "
                               "splits SOURCE once: give one or the other")
    return Plan(folds=folds, lam=check_prior(group_prior))


def settle_folds(request: FitRequest, given: Callable[[str], str | None]) -> FitRequest:
    """``--folds`` against ``--val-fraction`` and ``--eval``: on the command line together, or in the configuration
    file together, they are refused; across the two, the command line wins. ``given(name)`` says where a parameter
    came from (``"command line"``, ``"file"`` or None). Returns the request with its folds, its split (None: the
    default) and its evaluation file settled. ``--group-prior`` needs ``--group-by``."""
    if request.group_prior is not None and request.group_by is None:
        raise TempcalError("--group-prior weighs the per-group fits of --group-by KEY; give --group-by too")
    split = request.val_fraction if given("val_fraction") else None
    eval_file = request.eval_file
    if request.folds is None:
        return replace(request, split=split)
    for name, flag, value in (("val_fraction", "--val-fraction", split), ("eval_file", "--eval", eval_file)):
        if value is None:
            continue
        if given(name) == given("folds"):
            where = "" if given(name) == "command line" else " (both in the configuration file)"
            raise TempcalError(f"--folds K fits and reports on every row of SOURCE, out of fold; {flag} splits it "
                               f"otherwise: give one or the other{where}")
        if given("folds") == "file":
            return replace(request, folds=None, split=split, eval_file=eval_file)  # the command line wins
        split, eval_file = (None, eval_file) if name == "val_fraction" else (split, None)
    return replace(request, split=split, eval_file=eval_file)


def read_groups(opened: OpenedSource, key: str, *, option: str | None = None) -> RowGroups:
    """The groups of ``opened``'s counted rows by ``key`` (see the module docstring), as its kind reads them;
    ``option`` names where KEY came from in messages (default ``--group-by``; ``apply`` reads the stored key)."""
    return opened.kind.read_groups(opened, key, option or param("group_by"))


def row_temperatures(opened: OpenedSource, groups: StoredGroups, default: float,
                     warnings: list[str]) -> tuple[torch.Tensor, dict[str, float], torch.Tensor | None]:
    """Each row's T (float64): its group's stored T, or ``default`` (the global T) for a group none is stored for,
    with a warning; the T of every group the rows hold; and each row's group value (int64) as the tensor KEY holds
    it (None for lm-eval logs, grouped by task, which hold no such tensor)."""
    import torch

    from ..sources.stored_groups import GROUP_KEY

    rows = read_groups(opened, groups.key, option=f"the stored '{GROUP_KEY}'")
    index = torch.from_numpy(rows.index)
    per_group = [groups.temperatures.get(name, default) for name in rows.names]
    unstored = [name for name in rows.names if name not in groups.temperatures]
    if unstored:
        count = int(torch.isin(index, torch.tensor([rows.names.index(n) for n in unstored])).sum())
        warnings.append(Note(f"{opened.name}: {len(unstored)} group(s) of '{groups.key}' have no stored temperature "
                             f"(first: '{unstored[0]}'); their {count} rows take the global T = {default!r}"))
    # integer groups: their names are the values in decimal
    values = torch.tensor([int(name) for name in rows.names], dtype=torch.int64)[index] if rows.numeric else None
    return torch.tensor(per_group, dtype=torch.float64)[index], dict(zip(rows.names, per_group, strict=True)), values


__all__ = ["DEFAULT_GROUP_PRIOR", "MAX_GROUP_PRIOR", "Asked", "Plan", "check_folds",
           "check_prior", "plan", "read_groups", "row_temperatures", "settle_folds"]
