"""The ``--html`` page of a command's result model, labelled from its :class:`~tempcal.workflows.common.Basis`
objects as the console is; figures inline SVG, nothing fetched, so the file opens anywhere offline."""

from __future__ import annotations

import datetime as _dt
import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..conformal.sets import SHORT_P
from ..output.figures import group_coverage, threshold_text
from ..subsets.console import GROUP_COLUMNS, GROUP_T
from ..workflows.common import AT_FOLDS, Basis
from . import figures

#: The metrics columns of every table, in order, as (JSON key, heading); absent keys are left out.
METRICS = (("nll", "NLL"), ("ece", "ECE"), ("rms_ce", "RMS CE"), ("mce", "MCE"), ("brier", "Brier"),
           ("accuracy", "accuracy"), ("mean_confidence", "confidence"), ("entropy", "entropy"),
           ("smece", "smooth ECE"), ("aurc", "AURC"), ("eaurc", "E-AURC"), ("augrc", "AUGRC"))


@dataclass
class Table:
    header: list[str]
    rows: list[dict]
    caption: str = ""


@dataclass
class Section:
    id: str
    title: str
    note: str = ""
    tables: list[Table] = field(default_factory=list)
    figures: list[dict] = field(default_factory=list)
    paragraphs: list[str] = field(default_factory=list)


def fmt(value, digits: int = 4) -> str:
    """A figure for a table: ``digits`` significant digits, integers as they are, blanks for missing values."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        if math.isinf(value):
            return "∞" if value > 0 else "-∞"
        return f"{value:.{digits}g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
    return str(value)


def _figure(metrics: Any, key: str) -> Any:
    """One figure of a metrics object or a group's JSON figures; None where it was not computed."""
    value = metrics.get(key) if isinstance(metrics, dict) else getattr(metrics, key, None)
    return None if isinstance(value, float) and math.isnan(value) else value


def _metrics_table(rows: Sequence[tuple[str, Any, bool]], first: str) -> Table:
    """A row of :data:`METRICS` per ``(label, metrics, marked)``; a figure no row has is no column."""
    columns = [(k, h) for k, h in METRICS if any(_figure(m, k) is not None for _, m, _ in rows)]
    return Table(header=[first, *(h for _, h in columns)],
                 rows=[{"mark": mark, "cells": [label, *(fmt(_figure(m, k)) for k, _ in columns)]}
                       for label, m, mark in rows])


def _risk_coverage(sides: Sequence[tuple[str, Any]], note: str) -> list[Section]:
    """The risk-coverage section of the ``(label, metrics)`` that have a curve (none when none has)."""
    curves = [(label, m) for label, m in sides if m.risk_coverage and m.risk_coverage.get("coverage")]
    if not curves:
        return []
    return [Section("risk-coverage", "Risk-coverage", note=f"error rate among the most confident rows kept{note}",
                    figures=[{"svg": figures.risk_coverage(curves), "narrow": True}])]


#: A conformal table's columns after the first: the set size first, so that it is on screen on a phone.
SET_COLUMNS = ("alpha", "score", "set size", "coverage", "threshold")


def _set_row(label: str, c: Any, mark: bool = False) -> dict:
    return {"mark": mark, "cells": [label, fmt(c.alpha), c.score.upper(), fmt(c.mean_size), fmt(c.coverage),
                                    threshold_text(c.threshold)]}


def _report_conformal_table(result: Any) -> Table | None:
    """``report --conformal-alpha``: each tau's thresholds, coverage and mean set size; the sweep's smallest sets
    marked."""
    rows = [(m, result.basis(k), c) for k, m in enumerate(result.results) for c in m.conformal or []]
    if not rows:
        return None
    smallest = {(b["alpha"], b["score"]): b["tau"] for b in result.smallest_sets()} if result.sweep else {}
    split = result.conformal_rows
    where = "the stored split's fitting rows" if split.stored else "a seeded half of SOURCE"
    return Table(header=["tau", *SET_COLUMNS], rows=[
        _set_row(b.label(), c, b.sweep_point and smallest.get((c.alpha, c.score)) == m.tau) for m, b, c in rows],
        caption=f"thresholds from {split.calibration.size} rows of {where}; coverage and mean set size on the "
                f"{split.evaluation.size} other rows" + ("; marked: the sweep's smallest sets" if smallest else ""))


def _group_sections(groups: Sequence[dict], after: Basis) -> Section:
    """``fit --group-by``: each group's T and figures (the console's columns), its coverage, its ECE as bars;
    ``after``: what the fit's ``after`` was computed at (out of fold with folds)."""
    section = Section("groups", f"Groups ({len(groups)})",
                      note=f"per group: metrics on its evaluation rows ({after.rows_label()} in all) at T = 1, at its "
                           "own T (per-group T) and at the global T")
    # a group without evaluation rows has no figures (null blocks)
    evaluated = [{**g, "before": g.get("before") or {}, "after": g.get("after") or {}} for g in groups]
    ordered = sorted(evaluated, key=lambda g: -(g["before"].get("ece") or 0))
    blocks = {"T = 1": "before", "per-group T": "after", "global T": "after_global"}
    section.tables.append(Table(
        header=["group", "n fit", "n eval", GROUP_T, *(f"{figure} {at}" for figure, at in GROUP_COLUMNS)],
        rows=[{"mark": False, "cells": [g["group"], fmt(g.get("n_fit")), fmt(g.get("n_eval")),
                                        fmt(g.get("temperature")),
                                        *(fmt((g.get(blocks[at]) or {}).get(figure.lower()))
                                          for figure, at in GROUP_COLUMNS)]} for g in ordered]))
    coverage = _group_coverage_table(evaluated, after)
    if coverage is not None:
        section.tables.append(coverage)
    drawn = [g for g in evaluated if g["before"] and g["after"]]
    section.figures.append({"svg": figures.groups(drawn, f"global T ({after.label()})"),
                            "caption": "ECE per group (largest first)", "narrow": True})
    return section


def _group_coverage_table(groups: Sequence[dict], after: Basis) -> Table | None:
    """Each group's coverage and mean set size under the global sets at the fitted T, lowest coverage first; a row
    is marked when a group falls short of 1 - alpha beyond chance."""
    found = [g for block in group_coverage((g["group"], g.get("n_eval"), (g.get("after_global") or {}).get("conformal"))
                                           for g in groups) for g in block]
    if not found:
        return None
    scores = [s.upper() for s in found[0].cells]
    header = ["group", "n eval", "alpha", *(h for s in scores for h in (f"{s} coverage", f"{s} size"))]
    rows = [{"mark": any(g.short.values()), "cells": [
        g.group, fmt(g.n), fmt(g.alpha), *(fmt(c[k]) for c in g.cells.values() for k in ("coverage", "mean_size"))]}
        for g in sorted(found, key=lambda g: g.lowest - (1 - g.alpha))]
    return Table(header=header, rows=rows,
                 caption=f"conformal coverage per group at the global T ({after.label()}), lowest first; marked: "
                         f"short of 1 - alpha beyond chance (one-sided binomial p < {SHORT_P:g})")


def _fit_context(report: Any, data: dict) -> dict:
    """``fit``: T, the before/after table and diagrams, curves, sets, folds and groups; the gate from ``data``."""
    before, after = report.before, report.after
    first, last = report.before_basis, report.after_basis
    fit = report.fit
    evaluated = f"{report.n_eval:,} rows" + (", out of fold" if last.at == AT_FOLDS else "")
    cards = [("fitted on", f"{report.n_fit:,} rows"), ("evaluated on", evaluated),
             ("classes", f"{report.num_classes:,}"), ("objective", fit.objective),
             ("reads of the data", str(report.passes)),
             ("certified error of T", fmt(fit.error_bound, 2) if fit.error_bound is not None else fit.method),
             ("NLL", f"{fmt(before.nll)} → {fmt(after.nll)}"), ("ECE", f"{fmt(before.ece)} → {fmt(after.ece)}")]
    sides = [(first.label(), before), (last.label(), after)]
    named = [(f"before ({first.label()})", before), (f"after ({last.label()})", after)]
    metrics = Section("metrics", "Calibration before and after", note=report.split_label(),
                      tables=[_metrics_table([(*named[0], False), (*named[1], True)], "metric")])
    reliability = Section("reliability", "Reliability diagrams",
                          note="bars: accuracy per equal-width confidence bin, with its 95% Wilson interval; "
                               "hatched: the gap to the bin's mean confidence; beneath: rows per bin",
                          figures=[{"svgs": figures.reliability(named)}])
    sections = [metrics, reliability, *_risk_coverage(sides, "")]
    conformal = [_set_row(label, c) for label, metrics in sides for c in metrics.conformal or []]
    if conformal:
        note = (f"thresholds at T = 1 and T = {fmt(report.temperature)} from all {report.n_fit:,} rows (deployed); "
                f"coverage and set size {last.rows_label()}" if last.at == AT_FOLDS else
                f"thresholds from the {report.n_fit:,} fitting rows; coverage and set size {last.rows_label()}")
        sections.append(Section("conformal", "Conformal sets", note=note,
                                tables=[Table(header=["", *SET_COLUMNS], rows=conformal)]))
    if report.folds is not None:
        folds = report.subsets.folds
        sections.append(Section("folds", f"Cross-fitting ({report.folds} folds)", tables=[Table(
            header=["fold", "rows", "T"], rows=[{"mark": False, "cells": [str(i + 1), fmt(n), fmt(t)]}
                                                for i, (n, t) in enumerate(zip(folds["sizes"], folds["temperatures"],
                                                                               strict=True))])]))
    if report.subsets is not None and report.subsets.groups:
        sections.append(_group_sections(report.groups_json(), last))
    gate = None
    if data.get("max_ece") is not None:
        passed = bool(data.get("gate_passed"))
        gate = {"passed": passed, "text": f"ECE {fmt(after.ece)} {'≤' if passed else '>'} max-ece {data['max_ece']}"}
    return {"temperature": report.temperature, "t_label": "T", "cards": cards, "sections": sections, "gate": gate,
            "title": f"tempcal fit — {report.source}"}


def _report_context(result: Any, data: dict) -> dict:
    """``report``: the table at each temperature, the sweep, diagrams, curves, sets and groups."""
    results = result.results
    bases = [result.basis(k) for k in range(len(results))]
    pairs = list(zip(results, bases, strict=True))
    # the lowest NLL of the rows at one T, marked where there are two or more (as the console marks it)
    best = result.min_nll_tau if sum(b.sweep_point for b in bases) > 1 else None

    def lowest(r: Any, b: Basis) -> bool:
        return b.sweep_point and r.tau == best

    rows = [(b.label() + (" (min NLL)" if lowest(r, b) else ""), r, b.stored or lowest(r, b)) for r, b in pairs]
    scored = bases[0].rows_label() + (" (--eval-rows)" if result.eval_rows else "") if bases else ""
    table = Section("metrics", "Calibration at each temperature", note=scored, tables=[_metrics_table(rows, "tau")])
    own = [b for b in bases if not b.sweep_point]
    if own:
        table.paragraphs.append(f"{own[0].label()}: each {result.group_key} group's rows at the T stored for "
                                "that group; not a point of the temperatures against which the sweep is drawn.")
    sections = [table]
    points = [r for r, b in pairs if b.sweep_point]
    if len(points) >= 3:
        marks = {"min NLL": best} if best is not None else {}
        if result.stored_temperature is not None:
            marks["stored T"] = result.stored_temperature
        table.figures.append({"svg": figures.sweep([m.to_dict(with_bins=False) for m in points], marks),
                              "narrow": True})
    shown = pairs if len(pairs) <= 4 else [(r, b) for r, b in pairs if b.stored or lowest(r, b)][:3] or pairs[:2]
    sections.append(Section("reliability", "Reliability diagrams",
                            note="95% Wilson interval per bin; rows per bin beneath",
                            figures=[{"svgs": figures.reliability([(b.label(), r) for r, b in shown])}]))
    sections += _risk_coverage([(b.label(), r) for r, b in pairs], ", per row of the table above")
    conformal = _report_conformal_table(result)
    if conformal is not None:
        sections.append(Section("conformal", "Conformal sets", tables=[conformal]))
    groups = [[g.to_json() for g in row.groups] for row in result.group_rows or []]
    sections += [_report_groups(k, rows, b) for k, (rows, b) in enumerate(zip(groups, bases, strict=False)) if rows]
    cards = [("rows", f"{result.count:,}"), ("classes", f"{result.num_classes:,}"),
             ("temperatures", str(len(points)))]
    if own:
        cards.append(("per-group T", f"stored for {len(groups[bases.index(own[0])]):,} groups"))
    return {"temperature": result.stored_temperature, "t_label": "stored global T" if own else "stored T",
            "cards": cards, "sections": sections, "gate": None, "title": f"tempcal report — {result.source}"}


def _report_groups(k: int, groups: list[dict], basis: Basis) -> Section:
    """One report row's groups (their JSON figures), largest ECE first; at the per-group T, each group's own T beside
    its figures."""
    ordered = sorted(groups, key=lambda g: -(g.get("ece") or 0))
    table = _metrics_table([(g["group"], g, False) for g in ordered], "group")
    if not basis.sweep_point:
        table.header.insert(1, GROUP_T)
        for cells, g in zip(table.rows, ordered, strict=True):
            cells["cells"].insert(1, fmt(g.get("tau")))
    where = ": each group's rows at its own T" if not basis.sweep_point else ""
    return Section(f"groups-{k}", f"Groups at {basis.label()}{where}", note=basis.rows_label(), tables=[table])


def _ood_context(report: Any, data: dict) -> dict:
    """``ood``: per OOD file its best sentence, curves and AUROC / FPR95 tables; the gate (all from the model)."""
    sections: list[Section] = []
    calibration = report.stored_temperature
    for name, best in zip(report.ood_files, report.best_overall, strict=True):
        section = Section(f"ood-{len(sections)}", f"OOD: {name}", paragraphs=[best.sentence])
        section.figures.append({"svgs": figures.ood_curves(report, name)})
        for key, caption in (("auroc", "AUROC (higher is better)"), ("fpr95", "FPR95 (lower is better)")):
            cell = {(m.tau, s): getattr(m, key) for s in report.scores for m in report.rows(name, s)}
            section.tables.append(Table(caption=caption, header=["tau", *report.scores], rows=[
                {"mark": tau == calibration,
                 "cells": [fmt(tau) + (" (T)" if tau == calibration else ""),
                           *(fmt(cell.get((tau, s))) for s in report.scores)]}
                for tau in sorted(set(report.taus))]))
        sections.append(section)
    gate = None
    if report.gate_passed is not None:
        gate = {"passed": report.gate_passed, "text": "every row passes" if report.gate_passed else "; ".join(
            f.line() for f in report.gate_failures)}
    cards = [("in-distribution rows", f"{report.n_id:,}"), ("classes", f"{report.num_classes:,}"),
             ("scores", ", ".join(report.scores)), ("temperatures", str(len(report.taus)))]
    return {"temperature": calibration, "t_label": "T", "cards": cards, "sections": sections,
            "gate": gate, "title": f"tempcal ood — {report.source}"}


CONTEXTS = {"fit": _fit_context, "report": _report_context, "ood": _ood_context}


def page(command: str, result: Any, data: dict, argv: Sequence[str]) -> str:
    """The HTML page of ``command``'s ``result`` model and the JSON ``data`` it was written as (the warnings as
    printed, the gate); ``argv`` is the command line shown in its footer."""
    import jinja2

    from .._version import __version__

    context = CONTEXTS[command](result, data)
    env = jinja2.Environment(loader=jinja2.PackageLoader("tempcal.html", "templates"),
                             autoescape=jinja2.select_autoescape(default=True), trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    subtitle = f"{command} · tempcal {__version__} · {when}"
    return env.get_template("report.html.j2").render(
        **context, warnings=data.get("warnings") or [], fmt=fmt, version=__version__, generated=when,
        subtitle=subtitle, command=shlex.join(["tempcal", *argv]))


__all__ = ["page"]
