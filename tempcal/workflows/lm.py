"""What ``--lm`` commands other than ``fit`` write once their figures are known: the hidden states.

Nothing is written before the command's work has succeeded: the hidden states live in memory or in an
unnamed temporary file until ``--save-hidden`` copies them (a fit keeps them through
:meth:`tempcal.sources.lm_texts.LmSource.keep`).
"""

from __future__ import annotations

from typing import Any


def save_hidden_lines(opened: Any, save_hidden: str | None) -> list[str]:
    """``--save-hidden``: the hidden states and labels kept as a SOURCE for ``--head MODEL`` (nothing without it)."""
    if save_hidden is None or opened is None:
        return []
    return opened.keep_hidden(save_hidden)


__all__ = ["save_hidden_lines"]
