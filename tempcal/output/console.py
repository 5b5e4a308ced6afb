"""Terminal rendering with rich: fit, report and ood tables. Lines holding a path are never hard-wrapped
(``soft_wrap``); a table wider than the terminal becomes several (:func:`split_tables`), never a cut figure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any, cast

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..metrics.detection import ID_RECALL
from ..scores import score_label
from ..subsets.console import print_fit_groups, print_group_coverage, print_report_groups
from ..workflows.ood import OodReport
from . import ood_checks
from .figures import DISPLAYED_METRICS, min_nll_taus, threshold_text

#: The look of every table but the fit's: a rule under the header, no outer edge or padding.
PLAIN: dict[str, Any] = {"box": box.SIMPLE_HEAD, "show_edge": False, "pad_edge": False}


class TrimmedLines:
    """A text stream that writes each line without its trailing spaces (rich pads titles and table rows to the
    table's width): piped output, a CI log, holds no invisible blanks."""

    def __init__(self, out: Any):
        self.out, self.pending = out, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.out.write(line.rstrip(" ") + "\n")
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.out.write(self.pending)
            self.pending = ""
        self.out.flush()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:
        return getattr(self.out, "encoding", None) or "utf-8"


def output_console(out: Any, **options: Any) -> Console:
    """The console a command renders to (on ``out``, standard output), lines trimmed when it is no terminal."""
    return Console(file=out if out.isatty() else cast(IO[str], TrimmedLines(out)), **options)


@dataclass
class Column:
    """One column of a table: its header, its cells (one per row) and how they are laid out."""

    header: str
    cells: list = field(default_factory=list)
    justify: str = "right"
    min_width: int | None = None


@dataclass
class Rows:
    """How the rows of a table look: a style per row (or None) and the rows that end a section."""

    styles: Sequence[str | None] = ()
    section_ends: frozenset[int] = frozenset()


def _table(columns: Sequence[Column], rows: Rows, options: dict) -> Table:
    table = Table(**options)
    for column in columns:
        table.add_column(column.header, justify=column.justify, no_wrap=True,  # type: ignore[arg-type]
                         min_width=column.min_width)
    for k in range(len(columns[0].cells) if columns else 0):
        table.add_row(*(c.cells[k] for c in columns), style=rows.styles[k] if rows.styles else None,
                      end_section=k in rows.section_ends)
    return table


def split_tables(console: Console, columns: Sequence[Column], *, keys: int = 1, together: int = 1,
                 rows: Rows | None = None, **options) -> list[Table]:
    """The columns in as few tables as fit the console's width, each beginning with the first ``keys`` columns, the
    others in blocks of ``together``; ``options`` go to every table (a ``title`` to the first only)."""
    rows = rows or Rows()
    unbounded = console.options.update_width(1 << 20)  # a table's natural width, not the console's
    head, rest = list(columns[:keys]), list(columns[keys:])
    title = options.pop("title", None)
    parts: list[list[Column]] = [[]]
    for start in range(0, len(rest), together):
        block = rest[start:start + together]
        trial = head + parts[-1] + block
        if parts[-1] and console.measure(_table(trial, rows, options), options=unbounded).maximum > console.width:
            parts.append(block)
        else:
            parts[-1].extend(block)
    return [_table(head + part, rows, {**options, "title": title if k == 0 else None}) for k, part in
            enumerate(parts)]


def print_tables(console: Console, tables: Sequence[Table]) -> None:
    for table in tables:
        console.print(table)


def fit_table(report) -> Table:
    """Before/after metrics with the fitted T in the title."""
    fit = report.fit
    status = "converged" if fit.converged else "NOT converged"
    if fit.bound:
        status += f", at the {fit.bound} bound"
    conformal = f", +{report.conformal_reads} for conformal" if report.conformal_reads else ""
    table = Table(title=f"T = {report.temperature:.6g}  ({fit.objective} fit, {report.reads_label()}{conformal}, "
                        f"{status})", title_justify="left")
    table.add_column("metric")
    for header in (f"before ({report.before_basis.label()})", f"after ({report.after_basis.label()})", "change"):
        table.add_column(header, justify="right")
    for key, label, _ in (*DISPLAYED_METRICS, *FIT_DETAIL):
        a, b = getattr(report.before, key), getattr(report.after, key)
        table.add_row(label, f"{a:.4f}", f"{b:.4f}", f"{b - a:+.4f}")
    return table


#: The fit table's rows beyond :data:`DISPLAYED_METRICS`: the rest of the risk-coverage figures.
FIT_DETAIL = (("eaurc", "E-AURC", ""), ("augrc", "AUGRC", ""))


def conformal_tables(console: Console, report) -> list[Table]:
    """Each alpha and score's threshold, coverage and mean set size at T = 1 and at the fitted T."""
    pairs = list(zip(report.before.conformal, report.after.conformal, strict=True))
    columns = [Column("alpha", [f"{a.alpha:g}" for a, _ in pairs]),
               Column("score", [a.score.upper() for a, _ in pairs], justify="left")]
    for k, side in enumerate((report.before_basis.label(), report.after_basis.label())):
        columns += _set_columns(side, [pair[k] for pair in pairs])
    title = (f"conformal sets (q: the deployed threshold, at T = 1 and T = {report.temperature:.4g} from all "
             f"{report.n_fit:,} rows; coverage and mean size {report.after_basis.rows_label()}: each row's set from "
             "the other folds' threshold)" if report.folds is not None else
             f"conformal sets (thresholds from the {report.n_fit:,} fitting rows; coverage and mean size "
             f"{report.after_basis.rows_label()})")
    return split_tables(console, columns, keys=2, together=3, **PLAIN, title_justify="left", title=title)


def report_conformal_tables(console: Console, result) -> list[Table]:
    """``report --conformal-alpha``: each tau and alpha's thresholds, coverage and mean set size, the sweep's
    smallest sets marked."""
    # each alpha's entries come as a pair: LAC, then APS
    rows = [(k, m.conformal[i:i + 2]) for k, m in enumerate(result.results)
            for i in range(0, len(m.conformal or []), 2)]
    if not rows:
        return []
    smallest = {(b["alpha"], b["score"]): b["tau"] for b in result.smallest_sets()} if result.sweep else {}

    def marked(k: int, entry) -> bool:
        return result.basis(k).sweep_point and smallest.get((entry.alpha, entry.score)) == result.results[k].tau

    columns = [Column("tau", [tau_cell(result, k) if j == 0 or rows[j - 1][0] != k else ""
                              for j, (k, _) in enumerate(rows)]),
               Column("alpha", [f"{pair[0].alpha:g}" for _, pair in rows])]
    for j in range(2):
        columns += _set_columns(rows[0][1][j].score.upper(), [pair[j] for _, pair in rows],
                                ["*" if marked(k, pair[j]) else " " for k, pair in rows])
    note = "; * the sweep's smallest sets" if smallest else ""
    if any(not result.basis(k).sweep_point for k, _ in rows):
        note += f"; {PER_GROUP_CELL}: each row's scores and sets at its group's stored T"
    return split_tables(console, columns, keys=2, together=3, **PLAIN, title_justify="left",
                        title=f"conformal sets ({result.conformal_rows.describe()}{note})")


def _set_columns(name: str, sets: Sequence, marks: Sequence[str] | None = None) -> list[Column]:
    """Conformal sets' threshold, coverage and mean size (each size followed by its mark, when given)."""
    return [Column(f"q\n{name}", [threshold_text(c.threshold) for c in sets]),
            Column("coverage", [f"{c.coverage:.4f}" for c in sets]),
            Column("size", [f"{c.mean_size:.3f}" + (marks[i] if marks else "") for i, c in enumerate(sets)])]


def tau_cell(result, k: int) -> str:
    """A report row's first cell: its tau, or :data:`PER_GROUP_CELL` for the per-group row."""
    return f"{result.results[k].tau:.4g}" if result.basis(k).sweep_point else PER_GROUP_CELL


#: The tau cell of a report's per-group row (each group's rows at its own stored T): no temperature of the sweep.
PER_GROUP_CELL = "T_g"


def reliability_tables(console: Console, before, after, labels: Sequence[str]) -> list[Table]:
    """Per-bin sample count, mean confidence, accuracy and their gap, before and after (``labels``: what each was
    computed at), side by side (one table per side when both do not fit)."""
    shown = [(a, b) for a, b in zip(before.bins, after.bins, strict=True) if a.count or b.count]
    columns = _bin_columns(shown, [f"n\n{stacked(side)}" for side in labels])
    return split_tables(console, columns, together=4, title_justify="left", show_edge=False, pad_edge=False,
                        title="reliability (equal-width bins; gap = accuracy - confidence)")


def stacked(label: str, width: int = 8) -> str:
    """A column's label on lines of at most ``width`` characters (``out of fold`` on two), so that both sides of a
    before/after table fit 80 columns."""
    import textwrap

    return "\n".join(textwrap.wrap(label, width, break_long_words=False)) or label


def _bin_columns(shown: Sequence[Sequence], counts: Sequence[str]) -> list[Column]:
    """The bin column, then per side (``counts``: its count column's header) the bins' count, conf, acc and gap."""
    columns = [Column("bin", [f"{row[0].lower:.2f}-{row[0].upper:.2f}" for row in shown], justify="left")]
    for k, count in enumerate(counts):
        cells = [_bin_cells(row[k]) for row in shown]
        columns += [Column(header, [c[j] for c in cells]) for j, header in enumerate((count, "conf", "acc", "gap"))]
    return columns


def _bin_cells(b) -> list:
    if not b.count:
        return ["0", "", "", ""]
    gap = b.accuracy - b.confidence
    style = "green" if abs(gap) < 0.05 else ("red" if gap < 0 else "yellow")
    return [str(b.count), f"{b.confidence:.3f}", f"{b.accuracy:.3f}", Text(f"{gap:+.3f}", style=style)]


def print_fit(report, console: Console) -> None:
    """The header, the before/after table, the reliability table and any extra estimators."""
    console.print(f"{report.source}: {report.num_classes} classes; {report.split_label()}", soft_wrap=True)
    console.print(fit_table(report))
    labels = [report.before_basis.label(), report.after_basis.label()]
    print_tables(console, reliability_tables(console, report.before, report.after, labels))
    if report.before.conformal:
        print_tables(console, conformal_tables(console, report))
    if any(report.extras):
        print_tables(console, extras_tables(console, labels, report.extras, header=""))
    print_fit_groups(report, console)
    small_split_note(report, console)
    if report.before.conformal and getattr(report, "subsets", None) is not None:
        print_group_coverage(report, console)


#: Below this many fitting rows, a split fit's console view suggests ``--folds``: T and its figures are noisy.
SMALL_SPLIT = 500


def small_split_note(report, console: Console) -> None:
    """A split of a small set: say that T and its before/after figures are noisy, and how to use every row."""
    if report.val_fraction in (None, 1) or report.n_fit >= SMALL_SPLIT:
        return
    total = report.n_fit + report.n_eval
    console.print(Text(f"note: T was fitted on {report.n_fit} rows and judged on the other {report.n_eval}; at this "
                       f"size both are noisy. --folds {min(10, total)} fits T on all {total} rows and reports out of "
                       "fold.", style="yellow"), soft_wrap=True)


#: The report table's figures: ``(attribute of CalibrationMetrics, header)``.
REPORT_COLUMNS = (("nll", "NLL"), ("ece", "ECE"), ("mce", "MCE"), ("brier", "Brier"), ("accuracy", "acc"),
                  ("mean_confidence", "conf"), ("entropy", "entropy"))
#: The report's decision figures (and the RMS calibration error), a table of their own beneath (the first one is 80
#: columns wide already).
DECISION_COLUMNS = (("smece", "smooth ECE"), ("rms_ce", "RMS CE"), ("aurc", "AURC"), ("eaurc", "E-AURC"),
                    ("augrc", "AUGRC"))


def report_notes(result) -> list[str]:
    """Per row: ``stored`` at the stored global T, ``min NLL`` at the lowest NLL of the rows at one temperature (of
    two or more), ``per-group T`` on the row of each group at its own stored T."""
    points = result.points()
    lowest = set(min_nll_taus(points)) if len(points) > 1 else set()
    bases = [result.basis(k) for k in range(len(result.results))]
    return [", ".join((["stored"] if b.stored else []) + (["min NLL"] if m.tau in lowest else [])) if b.sweep_point
            else b.label().replace(" (stored)", "") for m, b in zip(result.results, bases, strict=True)]


def report_tables(console: Console, result) -> list[Table]:
    """One row per temperature (one table at 80 columns). Marks the stored T and the NLL minimum of the rows."""
    rows = result.results
    taus = [tau_cell(result, k) for k in range(len(rows))]
    # the per-group row, last, set apart from the rows at one temperature
    looks = Rows(section_ends=frozenset(k - 1 for k in range(1, len(rows)) if not result.basis(k).sweep_point))

    def figures(names: Sequence[tuple[str, str]]) -> list[Column]:
        return [Column("tau", taus, min_width=7),
                *(Column(header, [f"{getattr(m, key):.4f}" for m in rows], min_width=7) for key, header in names)]

    columns = figures(REPORT_COLUMNS)
    notes = report_notes(result)
    columns.append(Column("", [Text(f" {note}" if note else "", style="bold") for note in notes],
                          justify="left", min_width=len(" stored, min NLL")))
    tables = split_tables(console, columns, rows=looks, **PLAIN, padding=0)
    if all(m.aurc != m.aurc for m in rows):  # NaN everywhere: the decision figures were not computed
        return tables
    return tables + split_tables(console, figures(DECISION_COLUMNS), rows=looks, **PLAIN, padding=0)


def sweep_sentence(result) -> str:
    """The sweep's best temperature for each decision: the lowest NLL, ECE, smooth ECE and AURC."""
    best = [(label, result.sweep_lowest(key)) for key, label in (("nll", "NLL"), ("ece", "ECE"),
                                                                 ("smece", "smooth ECE"), ("aurc", "AURC"))]
    # the lowest of each figure, one line (at most 80 columns: four temperatures of four significant digits)
    line = "best tau over the sweep: " + ", ".join(f"{label} {tau:.4g}" for label, tau in best if tau is not None)
    outside = [m.tau for m in result.points() if m.tau not in result.sweep and m.tau != 1]
    if outside:  # a stored or given T shown beside the sweep is not one of its points, whatever its figures
        line += f" (its {len(result.sweep)} points; tau {', '.join(f'{t:.4g}' for t in outside)} is not one)"
    return line


def single_reliability_table(metrics, label: str) -> Table:
    """Per-bin count, confidence, accuracy and gap of one figure set (``label``: what it was computed at)."""
    columns = _bin_columns([(b,) for b in metrics.bins if b.count], ["n"])
    return _table(columns, Rows(), {"title": f"reliability at {label}", "caption": "gap = accuracy - confidence",
                                    "title_justify": "left", "show_edge": False, "pad_edge": False})


def extras_tables(console: Console, labels: list[str], extras: list[dict], header: str = "tau") -> list[Table]:
    """Other estimators and bootstrap intervals, one row per figure set (``labels``: their first cells); as many
    tables as 80 columns need. A figure a set leaves out (ece_classwise where rows have their own T) shows as -."""
    names = list(dict.fromkeys(k for row in extras for k in row if k != "bootstrap"))
    columns = [Column(header, list(labels), justify="left" if header == "" else "right")]
    columns += [Column(name, [_figure(row[name]) if name in row else "-" for row in extras]) for name in names]
    return split_tables(console, columns, **PLAIN)


def _figure(value) -> str:
    """An estimate to four decimals, an interval as ``[low, high]``."""
    return f"[{value[0]:.4f}, {value[1]:.4f}]" if isinstance(value, list) else f"{value:.4f}"


def print_report(result, console: Console) -> None:
    held_out = " held-out" if result.eval_rows else ""
    console.print(f"{result.source}: {result.count:,}{held_out} samples, {result.num_classes} classes, "
                  f"{result.bins} bins", soft_wrap=True)
    print_tables(console, report_tables(console, result))
    own = [result.basis(k) for k in range(len(result.results)) if not result.basis(k).sweep_point]
    if own:
        console.print(f"{PER_GROUP_CELL} = {own[0].label()}: each group's rows at the T stored for that group, "
                      f"{own[0].rows_label()}; not a point of the temperatures above", soft_wrap=True)
    if result.sweep:
        console.print(sweep_sentence(result), soft_wrap=True)
    if any(result.extras):
        print_tables(console, extras_tables(console, [tau_cell(result, k) for k in range(len(result.results))],
                                            result.extras))
    print_tables(console, report_conformal_tables(console, result))
    if len(result.results) == 1:
        console.print(single_reliability_table(result.results[0], result.basis(0).label()))
    print_report_groups(result, console)


# -- tempcal ood ----------------------------------------------------------------------------
def ood_tables(console: Console, report: OodReport, index: int) -> list[Table]:
    """One OOD file's figures, grouped by score, a row per tau, marked as the legend says; bootstrap intervals
    replace the mean scores (so that the table still fits 80 columns)."""
    ood_file = report.ood_files[index]
    excluded = ood_checks.left_out(report)
    best = {(b.score, b.tau) for b in report.best if b.ood_file == ood_file and b.score not in excluded}
    overall = ood_checks.best_overall(report)[index]
    top = None if overall is None else (overall.score, overall.tau)
    failing = {(g.score, g.tau) for g in report.gate_failures if g.ood_file == ood_file}
    rows = [m for score in report.scores for m in report.rows(ood_file, score)]
    keys = [(m.score, m.tau) for m in rows]
    marks = [("T" if m.tau == report.stored_temperature else "") + ("**" if key == top else "*" if key in best else "")
             + ("!" if key in failing else "") for m, key in zip(rows, keys, strict=True)]
    columns = [Column("score", [score_label(m.score) if k == 0 or rows[k - 1].score != m.score else ""
                                for k, m in enumerate(rows)], justify="left"),
               Column("tau", [f"{m.tau:.4g}" for m in rows]), Column("", marks, justify="left")]
    figures = [("AUROC", "auroc"), ("AUPR-In", "aupr_in"), ("AUPR-Out", "aupr_out"), ("FPR95", "fpr95")]
    columns += [Column(header, [f"{getattr(m, key):.4f}" for m in rows]) for header, key in figures]
    if report.bootstrap > 0:
        columns += [Column("AUROC 95% CI", [_interval(m.auroc_ci) for m in rows]),
                    Column("FPR95 95% CI", [_interval(m.fpr95_ci) for m in rows])]
    else:
        means = [_means(m.mean_id, m.mean_ood) for m in rows]
        columns += [Column("mean ID", [a for a, _ in means]), Column("mean OOD", [b for _, b in means])]
    looks = Rows(styles=["red" if key in failing else "bold" if key in best else None for key in keys],
                 section_ends=frozenset(k for k, m in enumerate(rows) if k + 1 == len(rows)
                                        or rows[k + 1].score != m.score))
    return split_tables(console, columns, keys=3, rows=looks, **PLAIN, padding=0)  # columns a space apart


def _interval(bounds: tuple[float, float] | None) -> str:
    return "" if bounds is None else f"{bounds[0]:.4f}-{bounds[1]:.4f}"


def _means(mean_id: float, mean_ood: float) -> tuple[str, ...]:
    """Both means: four decimals for scores in [0, 1] (MSP), five significant digits for energies of any size, and up
    to seven where those print two different means alike."""
    shown = tuple(f"{v:.4f}" if abs(v) < 10 else f"{v:.5g}" for v in (mean_id, mean_ood))
    for digits in range(5, 8):
        if shown[0] != shown[1] or mean_id == mean_ood:
            break
        shown = f"{mean_id:.{digits}g}", f"{mean_ood:.{digits}g}"
    return shown


def ood_header(report: OodReport) -> list[str]:
    """What was scored: SOURCE, its classes and T, the temperatures, and ReAct's threshold or GEN's settings."""
    kind = "one binary logit" if report.binary else f"{report.num_classes} classes"
    stored = ("no stored calibration temperature" if report.stored_temperature is None
              else f"calibration T = {report.stored_temperature:.6g}")
    lines = [f"{report.source}: {kind}, {report.n_id:,} in-distribution samples, {stored}; "
             f"{len(report.taus)} temperatures ({report.taus_from})"]
    if report.react is not None:
        lines.append(f"ReAct: hidden states clipped at {report.react.threshold:.6g}, the "
                     f"{report.react.percentile:g}th percentile of the {report.react.count} values of "
                     f"{report.source} ({report.react.passes} reads)")
    if "gen" in report.scores:
        top = min(int(report.score_options["gen_top"]), report.num_classes)  # GEN sums over all when C <= M
        lines.append(f"GEN: gamma {report.score_options['gen_gamma']:g}, the {top} largest probabilities"
                     + (" (all classes)" if top == report.num_classes else ""))
    if report.bootstrap:
        lines.append(f"95% bootstrap intervals from {report.bootstrap} resamples (seed {report.seed}), ID and OOD "
                     "resampled separately")
    return lines


def print_ood(report: OodReport, console: Console) -> None:
    """The header, a table per OOD file grouped by score, the best score and tau of each file beside the calibration
    T (sentences never hard-wrapped), the legend, and notes on what the figures do not say by themselves."""
    for line in ood_header(report):
        console.print(line, soft_wrap=True)
    for index, (path, n) in enumerate(zip(report.ood_files, report.n_ood, strict=True)):
        console.print()
        console.print(Text(f"OOD {path} ({n:,} samples)", style="bold"), soft_wrap=True)
        print_tables(console, ood_tables(console, report, index))
        console.print(ood_checks.best_sentence(report, index), soft_wrap=True)
    console.print()
    legend = (f"in-distribution = positive; FPR95 = OOD fraction at or above the score that keeps {ID_RECALL:.0%} "
              "of ID; T = stored calibration temperature; * = the score's best AUROC; ** = the best of the file")
    if report.gate_failures:
        legend += "; ! = fails the gate"
    console.print(legend, soft_wrap=True)
    for caveat in ood_checks.caveats(report):
        console.print(Text(f"note: {caveat}.", style="yellow"), soft_wrap=True)
