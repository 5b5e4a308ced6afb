"""Out-of-distribution scores, one per module behind :class:`~tempcal.scores.base.Score`.

To add a score: write a module holding ``SCORE = YourScore()`` (a ``Score`` subclass) and add one
line to :data:`REGISTRY`. Modules are imported on first use, so the CLI can list the names
without importing torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Score

#: Every score's name and its module, in the order reports list them.
REGISTRY: dict[str, str] = {
    "msp": "msp",
    "energy": "energy",
}


def get_score(name: str) -> Score:
    """The score called ``name``; an unknown name is a ``KeyError``."""
    return import_module(f".{REGISTRY[name]}", __name__).SCORE


__all__ = ["REGISTRY", "get_score"]
