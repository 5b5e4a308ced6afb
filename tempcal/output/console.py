"""Terminal rendering with rich: fit and report tables, a compact reliability view, and ood's tables.

Headers that hold a file's path are printed unwrapped (``soft_wrap``): a long path must not
break a line in the middle of a sentence, whatever the terminal's width.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..metrics.detection import ID_RECALL
from ..workflows.ood import OodReport, score_label
from .figures import DISPLAYED_METRICS, reads


def fit_table(report) -> Table:
    """Before/after metrics with the fitted T in the title."""
    fit = report.fit
    status = "converged" if fit.converged else "NOT converged"
    if fit.bound:
        status += f", at the {fit.bound} bound"
    table = Table(title=f"T = {report.temperature:.6g}  ({fit.objective} fit, {reads(fit.passes)}, {status})",
                  title_justify="left")
    table.add_column("metric")
    table.add_column("before (T = 1)", justify="right")
    table.add_column(f"after (T = {report.temperature:.4g})", justify="right")
    table.add_column("change", justify="right")
    for key, label, _ in DISPLAYED_METRICS:
        a, b = getattr(report.before, key), getattr(report.after, key)
        table.add_row(label, f"{a:.4f}", f"{b:.4f}", f"{b - a:+.4f}")
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


def fit_header(report) -> str:
    """What was fitted on what: SOURCE, classes, sizes and how the samples were split."""
    sizes = (f"fitted on {report.n_fit} samples, evaluated on {report.n_eval}"
             + (f" from {report.eval_source}" if report.eval_source else
                f" (stratified split, val-fraction {report.val_fraction:g}, seed {report.seed})"
                if report.val_fraction not in (None, 1) else " (the same samples)"))
    return f"{report.source}: {report.num_classes} classes; {sizes}"


def print_fit(report, console: Console) -> None:
    """The header, the before/after table, the reliability table and any extra estimators."""
    console.print(fit_header(report), soft_wrap=True)
    console.print(fit_table(report))
    console.print(reliability_table(report.before, report.after, report.temperature))
    if report.extras and any(report.extras):
        console.print(extras_table([report.before.tau, report.after.tau], report.extras))


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
    console.print(f"{result.source}: {result.count} samples, {result.num_classes} classes, {result.bins} bins",
                  soft_wrap=True)
    console.print(report_table(result))
    if result.extras and any(result.extras):
        console.print(extras_table([m.tau for m in result.results], result.extras))
    if len(result.results) == 1:
        console.print(single_reliability_table(result.results[0]))


# -- tempcal ood ----------------------------------------------------------------------------
def ood_table(report: OodReport, ood_file: str) -> Table:
    """One OOD file's figures, grouped by score, a row per tau. Marks: ``T`` the calibration temperature, ``*`` the
    score's best tau, ``**`` the best score and tau for this file, ``!`` a row failing the gate. With bootstrap
    intervals, they replace the mean scores (so that the table still fits 80 columns)."""
    from rich import box

    best = {(b.score, b.tau) for b in report.best if b.ood_file == ood_file}
    overall = next(b for b in report.best_overall if b.ood_file == ood_file)
    failing = {(g.score, g.tau) for g in report.gate_failures if g.ood_file == ood_file}
    intervals = report.bootstrap > 0
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=0)  # columns a space apart
    table.add_column("score", no_wrap=True)
    table.add_column("tau", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    headers = ["AUROC", "AUPR-In", "AUPR-Out", "FPR95"]
    headers += ["AUROC 95% CI", "FPR95 95% CI"] if intervals else ["mean ID", "mean OOD"]
    for header in headers:
        table.add_column(header, justify="right", no_wrap=True)
    for score in report.scores:
        rows = report.rows(ood_file, score)
        for k, m in enumerate(rows):
            key = (m.score, m.tau)
            marks = (("T" if m.tau == report.stored_temperature else "")
                     + ("**" if key == (overall.score, overall.tau) else "*" if key in best else "")
                     + ("!" if key in failing else ""))
            style = "red" if key in failing else "bold" if key in best else None
            extra = ([_interval(m.auroc_ci), _interval(m.fpr95_ci)] if intervals
                     else [_mean(m.mean_id), _mean(m.mean_ood)])
            table.add_row(score_label(score) if k == 0 else "", f"{m.tau:.4g}", marks, f"{m.auroc:.4f}",
                          f"{m.aupr_in:.4f}", f"{m.aupr_out:.4f}", f"{m.fpr95:.4f}", *extra, style=style,
                          end_section=k == len(rows) - 1)
    return table


def _interval(bounds: tuple[float, float] | None) -> str:
    return "" if bounds is None else f"{bounds[0]:.4f}-{bounds[1]:.4f}"


def _mean(value: float) -> str:
    """Four decimals for scores in [0, 1] (MSP), five significant digits for energies of any size."""
    return f"{value:.4f}" if abs(value) < 10 else f"{value:.5g}"


def ood_header(report: OodReport) -> list[str]:
    """What was scored: SOURCE, its classes and T, the temperatures, and ReAct's threshold or GEN's settings."""
    kind = "one binary logit" if report.binary else f"{report.num_classes} classes"
    stored = ("no stored calibration temperature" if report.stored_temperature is None
              else f"calibration T = {report.stored_temperature:.6g}")
    lines = [f"{report.source}: {kind}, {report.n_id} in-distribution samples, {stored}; "
             f"{len(report.taus)} temperatures ({report.taus_from})"]
    if report.react is not None:
        lines.append(f"ReAct: hidden states clipped at {report.react.threshold:.6g}, the "
                     f"{report.react.percentile:g}th percentile of the {report.react.count} values of "
                     f"{report.source} ({report.react.passes} reads)")
    if "gen" in report.scores:
        lines.append(f"GEN: gamma {report.score_options['gen_gamma']:g}, the "
                     f"{report.score_options['gen_top']} largest probabilities")
    if report.bootstrap:
        lines.append(f"95% bootstrap intervals from {report.bootstrap} resamples (seed {report.seed}), ID and OOD "
                     "resampled separately")
    return lines


def print_ood(report: OodReport, console: Console) -> None:
    """The header, a table per OOD file grouped by score, the best score and tau of each file beside the calibration
    T (sentences never hard-wrapped), and the legend."""
    for line in ood_header(report):
        console.print(line, soft_wrap=True)
    for path, n in zip(report.ood_files, report.n_ood, strict=True):
        console.print()
        console.print(Text(f"OOD {path} ({n} samples)", style="bold"), soft_wrap=True)
        console.print(ood_table(report, path))
        console.print(next(b.sentence for b in report.best_overall if b.ood_file == path), soft_wrap=True)
    console.print()
    legend = (f"in-distribution = positive; FPR95 = OOD fraction at or above the score that keeps {ID_RECALL:.0%} "
              "of ID; T = stored calibration temperature; * = the score's best AUROC; ** = the best of the file")
    if report.gate_failures:
        legend += "; ! = fails the gate"
    console.print(legend, soft_wrap=True)
