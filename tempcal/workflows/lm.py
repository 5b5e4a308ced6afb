"""What ``--lm`` commands write once their figures are known: T's record, generation_config.json, the hidden states.

Nothing is written before the command's work has succeeded: the hidden states live in memory or in an
unnamed temporary file until :func:`write_lm_back` copies them to ``--save-hidden``.
"""

from __future__ import annotations

from typing import Any

from ..errors import TempcalError


def write_lm_back(report: Any, *, output: str | None = None, store: bool = True, generation: bool = False,
                  save_hidden: str | None = None, settings: dict[str, Any] | None = None
                  ) -> tuple[list[str], list[str]]:
    """Keep a fit of ``--lm``: the hidden states (``save_hidden``), T in ``MODEL/tempcal.json`` (or ``output``)
    unless ``store`` is False, and T as ``generation_config.json``'s temperature (``generation``). Returns the
    files that now hold T, and the lines saying what was written. (:func:`tempcal.workflows.fit.keep_fit` does
    this for a fit of any kind.)"""
    from ..sources.lm_texts import LmSource
    from .fit import keep_fit

    if not isinstance(report.opened, LmSource):
        raise TempcalError("write_lm_back takes the report of a fit with --lm")
    kept = keep_fit(report, output=output, store=store, generation=generation, save_hidden=save_hidden,
                    settings=settings)
    return kept.paths, kept.lines


def save_hidden_lines(opened: Any, save_hidden: str | None) -> list[str]:
    """``--save-hidden``: the hidden states and labels kept as a SOURCE for ``--head MODEL`` (nothing without it)."""
    if save_hidden is None or opened is None:
        return []
    return opened.keep_hidden(save_hidden)


__all__ = ["save_hidden_lines", "write_lm_back"]
