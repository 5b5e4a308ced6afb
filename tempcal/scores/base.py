"""The contract every OOD score follows: a small class that turns a chunk's shared intermediates into scores.

A scoring pass reads each chunk of logits once (:class:`~tempcal.scores.engine.ScorePass`). For that
chunk it builds one :class:`~tempcal.scores.shared.Intermediates`: the temperature-free row values (max,
second max, their margin, the row's largest logits when a score asks for them), the per-temperature sums
over classes that need the chunk's exponentials (made inside the one loop over temperatures), and float64
values derived from those on first use and cached, so that scores asking for the same quantity share it.
A score reads what it needs and returns float64 values shaped ``[T, n]``: one row per temperature of the
pass, one column per sample. Higher always means more in-distribution.

Why ``[T, n]`` rather than one temperature at a time: the per-row float64 arithmetic is a few dozen small
operations per score; done once over all temperatures it costs a tenth of the launches (on a GPU, of the
kernel launches) that one call per temperature would. A single temperature is simply ``T = 1``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from .shared import Intermediates


class Score(ABC):
    """One training-free OOD score of classifier logits at temperature ``tau``.

    Subclasses set :attr:`name` and :attr:`label`, implement :meth:`compute`, and declare what the pass
    must prepare for them: :attr:`sums` (per-temperature sums over all classes beyond the always-made
    ``r'``) and :meth:`top_k` (how many of each row's largest logits they read). A score with
    parameters overrides :meth:`configure`.
    """

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
