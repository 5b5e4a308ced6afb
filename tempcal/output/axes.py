"""What every figure's axes share: one legend outside the panels, plain tick labels on log axes."""

from __future__ import annotations


def figure_legend(figure, axes: list, **options) -> None:
    """One legend outside every panel (beneath them unless ``loc`` says otherwise), so that it hides no bar, error
    bar or curve: each label once, from whichever panel draws it."""
    handles: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        figure.legend(list(handles.values()), list(handles), loc=options.pop("loc", "outside lower center"),
                      ncols=options.pop("ncols", len(handles)), frameon=False, **options)


def plain_log_ticks(axis) -> None:
    """Tick labels of a log axis as plain numbers (``1.1``, ``20``), never ``1.1x10^0``; matplotlib's choice of
    which ticks to label kept."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        def _num_to_string(self, x, vmin, vmax):
            return f"{x:.4g}"

    axis.set_major_formatter(Plain(labelOnlyBase=False))
    axis.set_minor_formatter(Plain(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


__all__ = ["figure_legend", "plain_log_ticks"]
