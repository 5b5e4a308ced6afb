"""The pictures and model-card sections a command writes beside its results (``--plot``, ``--markdown``); each
function returns the lines saying what it wrote."""

from __future__ import annotations

from ..errors import param
from ..io.atomic import write_text_atomic

#: What every command says for each file it writes beside its results.
WROTE_PLOT, WROTE_MARKDOWN = "wrote the plot to {}", "wrote the Markdown section to {}"


def write_fit_files(report, *, plot: str | None = None, markdown: str | None = None) -> list[str]:
    """``fit``: reliability diagrams before and after; a model-card section linking to the plot."""
    lines = []
    if plot and getattr(report, "subsets", None) is not None and report.subsets.groups:
        from ..subsets.plots import fit_group_plot

        lines.append(WROTE_PLOT.format(fit_group_plot(report, plot)))
    elif plot:
        from ..subsets.plots import fit_panels
        from .plots import reliability_diagram

        lines.append(WROTE_PLOT.format(reliability_diagram(fit_panels(report), plot, source=report.source)))
    if markdown:
        from .markdown import fit_markdown

        lines.append(_write_markdown(markdown, fit_markdown(report, markdown, plot)))
    return lines


def write_report_files(result, *, plot: str | None = None, markdown: str | None = None) -> list[str]:
    """``report``: a reliability diagram (every temperature) or, for a sweep, metrics against tau; risk-coverage
    curves per temperature beneath either; with groups, each group's ECE beneath that; a model-card section."""
    lines = []
    if plot:
        from ..subsets.plots import report_drawing, report_group_figure, save_figure
        from .plots import new_figure

        if getattr(result, "group_rows", None):
            figure = report_group_figure(result)
        else:
            size, draw = report_drawing(result)
            figure = new_figure(figsize=size)
            draw(figure)
        lines.append(WROTE_PLOT.format(save_figure(figure, plot)))
    if markdown:
        from .markdown import report_markdown

        lines.append(_write_markdown(markdown, report_markdown(result, markdown, plot)))
    return lines


def write_ood_files(report, *, scores: str | None = None, plot: str | None = None,
                    markdown: str | None = None) -> list[str]:
    """``ood``: the per-sample scores file, the plot and a model-card section; the lines saying what was written."""
    lines = []
    if scores is not None:
        from .scores_file import save_scores

        lines.append(f"wrote per-sample scores to {save_scores(report, scores)}")
    if plot is not None:
        from .ood_plots import ood_plot

        lines.append(WROTE_PLOT.format(ood_plot(report, plot)))
    if markdown is not None:
        from .markdown import ood_markdown

        lines.append(_write_markdown(markdown, ood_markdown(report, markdown, plot)))
    return lines


def _write_markdown(path: str, text: str) -> str:
    """Write a model-card section atomically; the line saying so."""
    return WROTE_MARKDOWN.format(write_text_atomic(path, text, what=param("markdown")))


__all__ = ["write_fit_files", "write_ood_files", "write_report_files"]
