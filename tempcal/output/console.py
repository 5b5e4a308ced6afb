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


def report_table(result) -> Table:
    """One row per temperature; fits 80 columns. Marks the stored T and the sweep's NLL minimum."""
    from rich import box

    best = result.sweep_best
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=0)
    for name in ("tau", "NLL", "ECE", "MCE", "Brier", "acc", "conf", "entropy"):
        table.add_column(name, justify="right", no_wrap=True, min_width=7)
    table.add_column("", no_wrap=True, min_width=len(" stored, min NLL"))
    for m in result.results:
        notes = []
        if result.stored_temperature is not None and m.tau == result.stored_temperature:
            notes.append("stored")
        if best is not None and m.tau == best:
            notes.append("min NLL")
        table.add_row(f"{m.tau:.4g}", f"{m.nll:.4f}", f"{m.ece:.4f}", f"{m.mce:.4f}", f"{m.brier:.4f}",
                      f"{m.accuracy:.4f}", f"{m.mean_confidence:.4f}", f"{m.entropy:.4f}",
                      Text(" " + ", ".join(notes) if notes else "", style="bold"))
    return table


def single_reliability_table(metrics) -> Table:
    """Per-bin count, confidence, accuracy and gap at one temperature."""
    table = Table(title=f"reliability at tau = {metrics.tau:.4g}", caption="gap = accuracy - confidence",
                  title_justify="left", show_edge=False, pad_edge=False)
    for name in ("bin", "n", "conf", "acc", "gap"):
        table.add_column(name, justify="left" if name == "bin" else "right", no_wrap=True)
    for b in metrics.bins:
        if b.count:
            table.add_row(f"{b.lower:.2f}-{b.upper:.2f}", *_bin_cells(b))
    return table


def extras_table(taus: list[float], extras: list[dict]) -> Table:
    """Other estimators and bootstrap intervals, one row per temperature."""
    from rich import box

    names = [k for k in extras[0] if k != "bootstrap"]
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("tau", justify="right", no_wrap=True)
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
    for tau, row in zip(taus, extras, strict=True):
        cells = [f"[{row[n][0]:.4f}, {row[n][1]:.4f}]" if isinstance(row[n], list) else f"{row[n]:.4f}"
                 for n in names]
        table.add_row(f"{tau:.4g}", *cells)
    return table


def print_report(result, console: Console) -> None:
    console.print(f"{result.source}: {result.count} samples, {result.num_classes} classes, {result.bins} bins")
    console.print(report_table(result))
    if result.extras and any(result.extras):
        console.print(extras_table([m.tau for m in result.results], result.extras))
    if len(result.results) == 1:
        console.print(single_reliability_table(result.results[0]))
