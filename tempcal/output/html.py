"""``--html PATH``: one self-contained page of a command's results, for reviewers and CI artefacts.

The page is rendered from the command's JSON (:func:`page`), through one jinja2 template with autoescaping;
figures are inline SVG (:mod:`.html_figures`), styles inline, nothing fetched: the file opens anywhere,
offline, on a phone (360 px) or a desktop, and prints.
"""

from __future__ import annotations

import datetime as _dt
import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..conformal.sets import SHORT_P
from ..errors import TempcalError, neutral, param
from ..subsets.console import GROUP_COLUMNS, GROUP_T
from ..workflows.basis import (
    AT_FOLDS,
    AT_GLOBAL,
    AT_GROUPS,
    AT_ONE,
    ROWS_ALL,
    ROWS_FILE,
    ROWS_HELD_OUT,
    ROWS_OUT_OF_FOLD,
    Basis,
    report_basis,
)
from . import html_figures as figures
from .figures import group_coverage, threshold_text

#: The metrics columns of every table, in order, as (JSON key, heading); absent keys are left out.
METRICS = (("nll", "NLL"), ("ece", "ECE"), ("mce", "MCE"), ("brier", "Brier"), ("accuracy", "accuracy"),
           ("mean_confidence", "confidence"), ("entropy", "entropy"), ("smece", "smooth ECE"), ("aurc", "AURC"),
           ("eaurc", "E-AURC"), ("augrc", "AUGRC"))


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


def check_html_path(path: str) -> Path:
    """The page's path after checking its suffix and that matplotlib (the figures) is installed."""
    out = Path(path)
    if out.suffix.lower() not in (".html", ".htm"):
        raise TempcalError(f"{param('html')} {path}: the page's name must end in .html")
    import importlib.util

    for module in ("matplotlib", "jinja2"):
        if importlib.util.find_spec(module) is None:  # the html extra brings both
            raise TempcalError(f"{param('html')} needs {module}, which is not installed: pip install 'tempcal[html]'")
    return out


def _columns(objects: Sequence[dict]) -> list[tuple[str, str]]:
    return [(k, h) for k, h in METRICS if any(o.get(k) is not None for o in objects)]


def _metrics_table(rows: Sequence[tuple[str, dict, bool]], first: str) -> Table:
    columns = _columns([m for _, m, _ in rows])
    return Table(header=[first, *(h for _, h in columns)],
                 rows=[{"mark": mark, "cells": [label, *(fmt(m.get(k)) for k, _ in columns)]}
                       for label, m, mark in rows])


def _curve(metrics: dict) -> dict | None:
    curve = metrics.get("risk_coverage")
    return curve if curve and curve.get("coverage") else None


def _conformal_table(sides: Sequence[tuple[str, dict]]) -> Table | None:
    """Each side's (label, metrics) sets: the set size first, so that it is on screen on a phone."""
    rows = []
    for label, metrics in sides:
        for c in metrics.get("conformal") or []:
            rows.append({"mark": False, "cells": [label, fmt(c["alpha"]), c["score"].upper(), fmt(c["mean_size"]),
                                                  fmt(c["coverage"]), threshold_text(c["threshold"])]})
    if not rows:
        return None
    return Table(header=["", "alpha", "score", "set size", "coverage", "threshold"], rows=rows)


def basis_of(block: dict, fallback: Basis) -> Basis:
    """What a JSON block was computed at (its ``basis``; ``fallback`` for JSON written before it was recorded)."""
    return Basis.from_json(block["basis"]) if block.get("basis") else fallback


def _report_conformal_table(data: dict) -> Table | None:
    """``report --conformal-alpha``: each tau's thresholds, coverage and mean set size; the sweep's smallest sets
    marked."""
    bases = _report_bases(data)
    rows = [(r, b, c) for r, b in zip(data["results"], bases, strict=True) for c in r.get("conformal") or []]
    if not rows:
        return None
    smallest = {(b["alpha"], b["score"]): b["tau"] for b in (data.get("sweep") or {}).get("best_set_size_tau") or []}
    split = data.get("conformal_rows") or {}
    where = "the stored split's fitting rows" if split.get("split") == "stored" else "a seeded half of SOURCE"
    # the set size first: on a phone the columns past the screen's width scroll
    return Table(header=["tau", "alpha", "score", "set size", "coverage", "threshold"], rows=[
        {"mark": b.sweep_point and smallest.get((c["alpha"], c["score"])) == r["tau"],
         "cells": [b.label(), fmt(c["alpha"]), c["score"].upper(), fmt(c["mean_size"]), fmt(c["coverage"]),
                   threshold_text(c["threshold"])]} for r, b, c in rows],
        caption=f"thresholds from {split.get('calibration')} rows of {where}; coverage and mean set size on the "
                f"{split.get('evaluation')} other rows" + ("; marked: the sweep's smallest sets" if smallest else ""))


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
                         "short of 1 - alpha "
                         f"beyond chance (one-sided binomial p < {SHORT_P:g})")


def _fit_context(data: dict) -> dict:
    before, after = data["before"], data["after"]
    first, last = _fit_bases(data)
    how = (f"{data['folds']['k']}-fold cross-fitting, seed {data.get('seed')}" if data.get("folds") else
           f"stratified split, val-fraction {data['val_fraction']:g}, seed {data.get('seed')}"
           if last.rows == ROWS_HELD_OUT else "")
    fitted = f"{data['n_fit']:,} rows" if last.rows == ROWS_HELD_OUT else f"all {data['n_fit']:,} rows"
    split = f"T fitted on {fitted}; figures {last.rows_label()}" + (f" ({how})" if how else "")
    evaluated = f"{data['n_eval']:,} rows" + (", out of fold" if last.at == AT_FOLDS else "")
    cards = [("fitted on", f"{data['n_fit']:,} rows"), ("evaluated on", evaluated),
             ("classes", f"{data['num_classes']:,}"), ("objective", data.get("objective", "nll")),
             ("reads of the data", str(data.get("passes"))),
             ("certified error of T", fmt(data.get("error_bound"), 2) if data.get("error_bound") is not None
              else data.get("fit_method", "")),
             ("NLL", f"{fmt(before['nll'])} → {fmt(after['nll'])}"),
             ("ECE", f"{fmt(before['ece'])} → {fmt(after['ece'])}")]
    metrics = Section("metrics", "Calibration before and after", note=split)
    metrics.tables.append(_metrics_table([(f"before ({first.label()})", before, False),
                                          (f"after ({last.label()})", after, True)], "metric"))
    reliability = Section("reliability", "Reliability diagrams",
                          note="bars: accuracy per equal-width confidence bin, with its 95% Wilson interval; "
                               "hatched: the gap to the bin's mean confidence; beneath: rows per bin")
    reliability.figures.append({"svgs": figures.reliability([(f"before ({first.label()})", before),
                                                             (f"after ({last.label()})", after)])})
    sections = [metrics, reliability]
    curves = [(label, m) for label, m in ((first.label(), before), (last.label(), after)) if _curve(m)]
    if curves:
        rc = Section("risk-coverage", "Risk-coverage", note="error rate among the most confident rows kept")
        rc.figures.append({"svg": figures.risk_coverage(curves), "narrow": True})
        sections.append(rc)
    conformal = _conformal_table([(first.label(), before), (last.label(), after)])
    if conformal:
        note = (f"thresholds at T = 1 and T = {fmt(data['temperature'])} from all {data['n_fit']:,} rows (deployed); "
                f"coverage and set size {last.rows_label()}" if last.at == AT_FOLDS else
                f"thresholds from the {data['n_fit']:,} fitting rows; coverage and set size {last.rows_label()}")
        sections.append(Section("conformal", "Conformal sets", note=note, tables=[conformal]))
    if data.get("folds"):
        folds = data["folds"]
        sections.append(Section("folds", f"Cross-fitting ({folds['k']} folds)", tables=[Table(
            header=["fold", "rows", "T"], rows=[{"mark": False, "cells": [str(i + 1), fmt(n), fmt(t)]}
                                                for i, (n, t) in enumerate(zip(folds["sizes"], folds["temperatures"],
                                                                               strict=True))])]))
    if data.get("groups"):
        sections.append(_group_sections(data["groups"], last))
    gate = None
    if data.get("max_ece") is not None:
        passed = bool(data.get("gate_passed"))
        gate = {"passed": passed, "text": f"ECE {fmt(after['ece'])} {'≤' if passed else '>'} max-ece {data['max_ece']}"}
    return {"temperature": data["temperature"], "t_label": "T", "cards": cards, "sections": sections, "gate": gate,
            "title": f"tempcal fit — {data.get('source')}"}


def _fit_bases(data: dict) -> tuple[Basis, Basis]:
    """``before`` and ``after``'s bases (re-derived for JSON written without them)."""
    folds = data.get("folds")
    rows = (ROWS_OUT_OF_FOLD if folds else ROWS_FILE if data.get("eval_source") else
            ROWS_ALL if data.get("val_fraction") in (None, 1) else ROWS_HELD_OUT)
    n = data["n_eval"]
    before = Basis(AT_ONE, ROWS_ALL if folds else rows, n, 1.0, source=data.get("eval_source"))
    after = (Basis(AT_FOLDS, rows, n, folds=folds["k"]) if folds else
             Basis(AT_GLOBAL, rows, n, data["temperature"], in_sample=rows == ROWS_ALL, source=data.get("eval_source")))
    return basis_of(data["before"], before), basis_of(data["after"], after)


def _report_bases(data: dict) -> list[Basis]:
    """Every result row's basis (re-derived for JSON written without them)."""
    rows = ROWS_HELD_OUT if data.get("eval_rows") else ROWS_ALL
    stored = data.get("stored_temperature")
    return [basis_of(r, Basis(AT_GROUPS, rows, data["n"], stored=True) if r.get("per_group") and r.get("stored")
                     else report_basis(r["tau"], rows=rows, n=data["n"], stored=stored)) for r in data["results"]]


def _report_context(data: dict) -> dict:
    results, bases = data["results"], _report_bases(data)
    # the lowest NLL of the rows at one T, marked where there are two or more (as the console marks it)
    best = data.get("min_nll_tau", (data.get("sweep") or {}).get("best_nll_tau"))
    best = best if sum(b.sweep_point for b in bases) > 1 else None

    def lowest(r: dict, b: Basis) -> bool:
        return b.sweep_point and r["tau"] == best

    rows = [(b.label() + (" (min NLL)" if lowest(r, b) else ""), r, b.stored or lowest(r, b))
            for r, b in zip(results, bases, strict=True)]
    scored = bases[0].rows_label() + (" (--eval-rows)" if data.get("eval_rows") else "") if bases else ""
    table = Section("metrics", "Calibration at each temperature", note=scored, tables=[_metrics_table(rows, "tau")])
    own = [b for b in bases if not b.sweep_point]
    if own:
        table.paragraphs.append(f"{own[0].label()}: each {data.get('group_key')} group's rows at the T stored for "
                                "that group; not a point of the temperatures against which the sweep is drawn.")
    sections = [table]
    points = [r for r, b in zip(results, bases, strict=True) if b.sweep_point]
    if len(points) >= 3:
        marks = {"min NLL": best} if best is not None else {}
        if data.get("stored_temperature") is not None:
            marks["stored T"] = data["stored_temperature"]
        table.figures.append({"svg": figures.sweep(points, marks), "narrow": True})
    marked = [(r, b) for r, b in zip(results, bases, strict=True) if b.stored or lowest(r, b)][:3]
    shown = list(zip(results, bases, strict=True))
    shown = shown if len(shown) <= 4 else marked or shown[:2]
    rel = Section("reliability", "Reliability diagrams", note="95% Wilson interval per bin; rows per bin beneath")
    rel.figures.append({"svgs": figures.reliability([(b.label(), r) for r, b in shown])})
    sections.append(rel)
    curves = [(b.label(), r) for r, b in zip(results, bases, strict=True) if _curve(r)]
    if curves:
        rc = Section("risk-coverage", "Risk-coverage", note="error rate among the most confident rows kept, per row "
                                                            "of the table above")
        rc.figures.append({"svg": figures.risk_coverage(curves), "narrow": True})
        sections.append(rc)
    conformal = _report_conformal_table(data)
    if conformal is not None:
        sections.append(Section("conformal", "Conformal sets", tables=[conformal]))
    sections += [_report_groups(k, r, b) for k, (r, b) in enumerate(zip(results, bases, strict=True))
                 if r.get("groups")]
    cards = [("rows", f"{data['n']:,}"), ("classes", f"{data['num_classes']:,}"),
             ("temperatures", str(len(points)))]
    if own:
        cards.append(("per-group T", f"stored for {len(results[bases.index(own[0])]['groups']):,} groups"))
    return {"temperature": data.get("stored_temperature"), "t_label": "stored global T" if own else "stored T",
            "cards": cards, "sections": sections, "gate": None, "title": f"tempcal report — {data.get('source')}"}


def _report_groups(k: int, row: dict, basis: Basis) -> Section:
    """One report row's groups, largest ECE first; at the per-group T, each group's own T beside its figures."""
    ordered = sorted(row["groups"], key=lambda g: -(g.get("ece") or 0))
    table = _metrics_table([(g["group"], g, False) for g in ordered], "group")
    if not basis.sweep_point:
        table.header.insert(1, GROUP_T)
        for cells, g in zip(table.rows, ordered, strict=True):
            cells["cells"].insert(1, fmt(g.get("tau")))
    where = ": each group's rows at its own T" if not basis.sweep_point else ""
    return Section(f"groups-{k}", f"Groups at {basis.label()}{where}", note=basis.rows_label(), tables=[table])


def _ood_context(data: dict) -> dict:
    sections: list[Section] = []
    for ood_file in data["ood_files"]:
        name = ood_file if isinstance(ood_file, str) else ood_file.get("path", str(ood_file))
        rows = [r for r in data["results"] if r["ood_file"] == name]
        section = Section(f"ood-{len(sections)}", f"OOD: {name}")
        section.paragraphs.extend(b["sentence"] for b in data.get("best_overall", []) if b.get("ood_file") == name)
        section.figures.append({"svgs": figures.ood_curves(data["results"], name)})
        scores = list(dict.fromkeys(r["score"] for r in rows))
        taus = sorted({r["tau"] for r in rows})
        calibration = data.get("stored_temperature")
        for key, caption in (("auroc", "AUROC (higher is better)"), ("fpr95", "FPR95 (lower is better)")):
            cell = {(r["tau"], r["score"]): r[key] for r in rows}
            section.tables.append(Table(caption=caption, header=["tau", *scores], rows=[
                {"mark": tau == calibration,
                 "cells": [fmt(tau) + (" (T)" if tau == calibration else ""),
                           *(fmt(cell.get((tau, s))) for s in scores)]}
                for tau in taus]))
        sections.append(section)
    gate = None
    if data.get("gate_passed") is not None:
        passed = bool(data["gate_passed"])
        gate = {"passed": passed, "text": "every row passes" if passed else "; ".join(
            str(f) for f in data.get("gate_failures") or [])}
    cards = [("in-distribution rows", f"{data['n_id']:,}"), ("classes", f"{data['num_classes']:,}"),
             ("scores", ", ".join(data.get("scores") or [])), ("temperatures", str(len(data.get("taus") or [])))]
    return {"temperature": data.get("stored_temperature"), "t_label": "T", "cards": cards, "sections": sections,
            "gate": gate, "title": f"tempcal ood — {data.get('source')}"}


CONTEXTS = {"fit": _fit_context, "report": _report_context, "ood": _ood_context}


def page(command: str, data: dict, argv: Sequence[str]) -> str:
    """The HTML page of ``command``'s JSON ``data``; ``argv`` is the command line shown in its footer."""
    import jinja2

    from .._version import __version__

    context = CONTEXTS[command](data)
    env = jinja2.Environment(loader=jinja2.PackageLoader("tempcal.output", "templates"),
                             autoescape=jinja2.select_autoescape(default=True), trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    subtitle = f"{command} · tempcal {__version__} · {when}"
    return env.get_template("report.html.j2").render(
        **context, warnings=data.get("warnings") or [], fmt=fmt, version=__version__, generated=when,
        subtitle=subtitle, command=shlex.join(["tempcal", *argv]))


def write_html(path: str, command: str, data: dict, argv: Sequence[str]) -> Path:
    """Render and write the page atomically; returns its path."""
    from ..io.atomic import write_text_atomic

    out = check_html_path(path)
    write_text_atomic(out, neutral(page(command, data, argv)), what=param("html"))  # bidi controls as escapes
    return out
