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
    files that now hold T, and the lines saying what was written."""
    from ..sources.lm_texts import LmSource

    opened = report.opened
    if not isinstance(opened, LmSource):
        raise TempcalError("write_lm_back takes the report of a fit with --lm")
    lines = save_hidden_lines(opened, save_hidden)
    holding: list[str] = []
    temperature = report.temperature
    if store:
        results = {"n_fit": report.n_fit, "n_eval": report.n_eval, "fit_method": report.fit.method,
                   "before": {"nll": report.before.nll, "ece": report.before.ece},
                   "after": {"nll": report.after.nll, "ece": report.after.ece}}
        [record] = opened.write_temperature(temperature, output, settings=settings, results=results)
        holding.append(str(record))
        lines.append(f"wrote temperature = {temperature!r} into {record}")
    if generation:
        path = opened.write_generation_config(temperature)
        holding.append(str(path))
        lines.append(f"wrote temperature = {temperature!r} into {path}")
    return holding, lines


def save_hidden_lines(opened: Any, save_hidden: str | None) -> list[str]:
    """``--save-hidden``: the hidden states and labels kept as a SOURCE for ``--head MODEL`` (nothing without it)."""
    if save_hidden is None or opened is None:
        return []
    path = opened.save_hidden(save_hidden)
    return [f"wrote the hidden states and labels to {path} (a SOURCE for --head {opened.lm.folder})"]


__all__ = ["save_hidden_lines", "write_lm_back"]
