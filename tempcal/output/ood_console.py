"""Terminal rendering of ``tempcal ood`` with rich: one table per OOD file and score, at most 80 columns wide."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..workflows.ood import ID_RECALL, SCORE_NAMES, OodReport


def ood_table(report: OodReport, ood_file: str, score: str) -> Table:
    """Detection figures at each tau; ``T`` marks the stored calibration temperature, ``*`` the best AUROC."""
    best = next(b for b in report.best if b.ood_file == ood_file and b.score == score)
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("tau", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    for header in ("AUROC", "AUPR-In", "AUPR-Out", "FPR95", "mean ID", "mean OOD"):
        table.add_column(header, justify="right", no_wrap=True)
    for m in report.rows(ood_file, score):
        marks = ("T" if m.tau == report.stored_temperature else "") + ("*" if m.tau == best.tau else "")
        style = "bold" if m.tau == best.tau else None
        table.add_row(f"{m.tau:.4g}", marks, f"{m.auroc:.4f}", f"{m.aupr_in:.4f}", f"{m.aupr_out:.4f}",
                      f"{m.fpr95:.4f}", _mean(m.mean_id), _mean(m.mean_ood), style=style)
    return table


def _mean(value: float) -> str:
    """Four decimals for scores in [0, 1] (MSP), five significant digits for energies of any size."""
    return f"{value:.4f}" if abs(value) < 10 else f"{value:.5g}"


def print_ood(report: OodReport, console: Console) -> None:
    """The header, a table per OOD file and score, the legend, and the best-tau sentences (never hard-wrapped)."""
    kind = "one binary logit" if report.binary else f"{report.num_classes} classes"
    stored = ("no stored calibration temperature" if report.stored_temperature is None
              else f"calibration T = {report.stored_temperature:.6g}")
    console.print(f"{report.source}: {kind}, {report.n_id} in-distribution samples, {stored}; "
                  f"{len(report.taus)} temperatures ({report.taus_from})", soft_wrap=True)
    for path, n in zip(report.ood_files, report.n_ood, strict=True):
        for score in report.scores:
            console.print()
            console.print(Text(f"OOD {path} ({n} samples), {SCORE_NAMES[score]} score", style="bold"),
                          soft_wrap=True)
            console.print(ood_table(report, path, score))
    console.print()
    console.print(f"in-distribution = positive; FPR95 = OOD fraction at or above the score that keeps "
                  f"{ID_RECALL:.0%} of ID; T = stored calibration temperature; * = best AUROC", soft_wrap=True)
    for best in report.best:
        console.print(best.sentence, soft_wrap=True)
