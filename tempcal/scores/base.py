"""The contract every OOD score follows: a small class that turns a chunk's shared intermediates into scores.

A scoring pass (:class:`~tempcal.scores.engine.ScorePass`) builds one
:class:`~tempcal.scores.shared.Intermediates` per chunk, shared by the scores; a score returns float64
``[T, n]`` (one row per temperature: a tenth of the launches of one call per temperature). Higher = more
in-distribution.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from .shared import Intermediates


class Score(ABC):
    """One training-free OOD score of logits at temperature ``tau``: set ``name``, ``label``, ``sums`` and
    ``top_k`` (what the pass must prepare), implement ``compute``; a score with parameters overrides ``configure``."""

    #: The name used by ``--score`` and in results.
    name: ClassVar[str]
    #: How tables and sentences name it.
    label: ClassVar[str]
    #: Per-temperature sums over classes this score needs besides ``r'`` (see ``Intermediates.SUMS``).
    sums: ClassVar[frozenset[str]] = frozenset()

    def configure(self, options: Mapping[str, Any]) -> Score:
        """This score set up with ``options`` (the ones it knows, e.g. ``gen_gamma``); by default itself."""
        return self

    def top_k(self, num_classes: int) -> int:
        """How many of each row's largest logits this score reads (found once per chunk for every tau); 0: none."""
        return 0

    @abstractmethod
    def compute(self, x: Intermediates) -> torch.Tensor:
        """Float64 scores ``[T, n]`` (row t at ``x.beta[t]``) from the chunk's shared intermediates."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
