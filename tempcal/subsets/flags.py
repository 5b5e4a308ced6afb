"""``--folds``, ``--group-by`` and ``--group-prior`` as the commands declare them (typer), kept apart from
:mod:`.options` so that the Python API's fits load no command-line code."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..errors import NON_NEGATIVE

Folds = Annotated[Optional[int], typer.Option(
    "--folds", metavar="K", min=2, help="Cross-fitting: T fitted on every row, 'after' out of fold over K seeded, "
    "class-stratified folds (K = N: leave-one-out). Not with --eval or --val-fraction.")]
GroupBy = Annotated[Optional[str], typer.Option(
    "--group-by", metavar="KEY", help="Per-group figures (fit: a T each): KEY is an integer tensor (a value per "
    "row), an evaluation log's task (inspect_ai: or model), a confidence table's COLUMN.")]
GroupPrior = Annotated[Optional[float], typer.Option(
    "--group-prior", metavar="LAM", help="How strongly each group's T is drawn toward the global T: LAM * (ln T - "
    "ln T_global)^2 is added to the group's NLL sum (0: independent fits; default 10, about as many rows' worth)."),
    NON_NEGATIVE]

__all__ = ["Folds", "GroupBy", "GroupPrior"]
