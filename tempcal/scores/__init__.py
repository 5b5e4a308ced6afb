"""Training-free OOD scores, each a :class:`~tempcal.scores.shared.Score` (higher = more in-distribution): a module
whose ``SCORES`` maps its name to it, and a line in the torch-free :data:`REGISTRY` (the CLI checks names by it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib import import_module
from typing import TYPE_CHECKING, Any

from ..errors import TempcalError, param

if TYPE_CHECKING:
    from .shared import Score

#: Every score's name and its module, in the order reports list them.
REGISTRY: dict[str, str] = {
    "msp": "msp", "energy": "energy", "maxlogit": "maxlogit", "entropy": "entropy", "gen": "gen",
}

#: Names that stand for several scores (``all``: every score in :data:`REGISTRY`).
GROUPS: dict[str, tuple[str, ...]] = {"both": ("msp", "energy")}


def score_names(spec: str | Iterable[str]) -> list[str]:
    """Score names from ``--score`` text: one name, ``both``, ``all``, or a comma-separated list (``"msp,gen"``);
    or a sequence of such texts. Groups are expanded, repeats dropped, the order kept; case and spaces ignored."""
    texts = [spec] if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for text in texts:
        for item in str(text).split(","):
            item = item.strip().lower()
            expanded = tuple(REGISTRY) if item == "all" else GROUPS.get(item, (item,))
            for name in expanded:
                if name not in REGISTRY:
                    choices = ", ".join([*REGISTRY, *GROUPS, "all"])
                    shown = f"'{item}'" if item else "an empty name"
                    raise TempcalError(f"{param('score')} {text}: {shown} is not a score; expected {choices} "
                                       "or a comma-separated list of them")
                if name not in names:
                    names.append(name)
    if not names:
        raise TempcalError(f"{param('score')}: no score given")
    return names


def get_score(name: str, options: Mapping[str, Any] | None = None) -> Score:
    """The score called ``name``, set up with ``options`` (e.g. ``gen_gamma``; each score reads its own and
    ignores the rest); an unknown name is a ``KeyError``."""
    score: Score = import_module(f".{REGISTRY[name]}", __name__).SCORES[name]
    return score.configure(options) if options else score


def score_label(name: str) -> str:
    """How tables and sentences name a score ("MSP", "energy", "GEN")."""
    return get_score(name).label


__all__ = ["GROUPS", "REGISTRY", "get_score", "score_label", "score_names"]
