"""Terminal rendering of reports with rich: tables of metrics and a compact reliability view."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

METRICS = (("nll", "NLL", "{:.4f}"), ("ece", "ECE", "{:.4f}"), ("mce", "MCE", "{:.4f}"),
           ("brier", "Brier", "{:.4f}"), ("accuracy", "accuracy", "{:.4f}"), ("entropy", "entropy", "{:.4f}"),
           ("mean_confidence", "mean confidence", "{:.4f}"))


def fit_table(report) -> Table:
    """Before/after metrics with the fitted T in the title."""
    fit = report.fit
    status = "converged" if fit.converged else "NOT converged"
    if fit.bound:
        status += f", at the {fit.bound} bound"
    table = Table(title=f"T = {report.temperature:.6g}  ({fit.objective} fit, {fit.passes} passes, {status})",
                  title_justify="left")
    table.add_column("metric")
    table.add_column("before (T = 1)", justify="right")
    table.add_column(f"after (T = {report.temperature:.4g})", justify="right")
    table.add_column("change", justify="right")
    for key, label, fmt in METRICS:
        a, b = getattr(report.before, key), getattr(report.after, key)
        table.add_row(label, fmt.format(a), fmt.format(b), f"{b - a:+.4f}")
    return table


def reliability_table(before, after, temperature: float) -> Table:
    """Per-bin sample count, mean confidence, accuracy and their gap, before and after, side by side."""
    table = Table(title="reliability (equal-width bins; gap = accuracy - confidence)", title_justify="left",
                  show_edge=False, pad_edge=False)
    table.add_column("bin", no_wrap=True)
    for side in ("T = 1", f"T = {temperature:.4g}"):
        table.add_column(f"n\n{side}", justify="right")
        table.add_column("conf", justify="right")
        table.add_column("acc", justify="right")
        table.add_column("gap", justify="right")
    for a, b in zip(before.bins, after.bins, strict=True):
        if not (a.count or b.count):
            continue
        table.add_row(f"{a.lower:.2f}-{a.upper:.2f}", *_bin_cells(a), *_bin_cells(b))
    return table


def _bin_cells(b) -> list:
    if not b.count:
        return ["0", "", "", ""]
    gap = b.accuracy - b.confidence
    style = "green" if abs(gap) < 0.05 else ("red" if gap < 0 else "yellow")
    return [str(b.count), f"{b.confidence:.3f}", f"{b.accuracy:.3f}", Text(f"{gap:+.3f}", style=style)]


def fit_view(report) -> Group:
    sizes = (f"fitted on {report.n_fit} samples, evaluated on {report.n_eval}"
             + (f" from {report.eval_source}" if report.eval_source else
                f" (stratified split, val-fraction {report.val_fraction:g}, seed {report.seed})"
                if report.val_fraction not in (None, 1) else " (the same samples)"))
    return Group(Text(f"{report.source}: {report.num_classes} classes; {sizes}"), fit_table(report),
                 reliability_table(report.before, report.after, report.temperature))


def print_fit(report, console: Console) -> None:
    console.print(fit_view(report))
