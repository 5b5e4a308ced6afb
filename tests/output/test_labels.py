"""Labels follow the figures (contract v4): every combination of ``--folds``, ``--group-by``, ``--conformal-alpha``,
``--sweep`` and ``--eval-rows``, through the console, the Markdown card (the step summary's text), the HTML page and
the plots, read as a user reads them and held against the JSON: each figure set is named by the temperature it was
computed at (T = 1, the global T, per-group T, out of fold) and the rows it covers, and a per-group or out-of-fold
set is never a point of a sweep over global temperatures nor named by the global T's value.

The expected words are derived here from the options and the JSON's numbers, not from the code's labels."""

from __future__ import annotations

import io
import itertools
import re

import numpy as np
import pytest
import torch
from rich.console import Console
from safetensors.torch import save_file

from tempcal.html import page as html
from tempcal.output.console import TrimmedLines, print_fit, print_report
from tempcal.output.markdown import fit_markdown, report_markdown
from tempcal.workflows.fit import fit_file, keep_fit
from tempcal.workflows.report import report_file

N, DOMAINS = 300, 5


@pytest.fixture(scope="module")
def domains(tmp_path_factory):
    """300 rows, 10 classes, 5 domains: domain d is (d + 1)x overconfident. ``plain``: no stored T; ``stored``: the
    global T and each domain's T stored by a split fit (so its held-out rows are known)."""
    folder = tmp_path_factory.mktemp("labels")
    g = torch.Generator().manual_seed(37)
    y = torch.randint(0, 10, (N,), generator=g)
    z = torch.randn(N, 10, generator=g)
    z[torch.arange(N), y] += 1.5
    domain = torch.arange(N) % DOMAINS
    z = z * (domain + 1)[:, None].float()
    plain = folder / "plain.safetensors"
    save_file({"logits": z, "labels": y, "domain": domain}, str(plain))
    stored = folder / "stored.safetensors"
    keep_fit(fit_file(str(plain), group_by="domain", device="cpu"), output=str(stored))
    return plain, stored


def console_text(render, result) -> str:
    """What a command prints through a pipe (80 columns, lines trimmed as the command's console trims them)."""
    buffer = io.StringIO()
    render(result, Console(file=TrimmedLines(buffer), width=80, color_system=None))
    return buffer.getvalue()


def page_text(command: str, result, monkeypatch) -> tuple[str, dict]:
    """The HTML page's visible words, and what each figure was asked to draw (its titles and series)."""
    drawn: dict = {}

    def record(name: str, picture):
        return lambda *args: (drawn.__setitem__(name, args[0] if len(args) == 1 else args), picture)[1]

    monkeypatch.setattr(html.figures, "reliability", record("reliability", ["<svg></svg>"]))
    monkeypatch.setattr(html.figures, "sweep", record("sweep", "<svg></svg>"))
    monkeypatch.setattr(html.figures, "risk_coverage", record("curves", "<svg></svg>"))
    monkeypatch.setattr(html.figures, "groups", lambda rows, label: (drawn.__setitem__("groups", label), "<svg/>")[1])
    text = html.page(command, result, result.to_json(), ["x"])
    words = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text)).replace("&#39;", "'").replace("&amp;", "&")
    return words, drawn


def fit_expectations(folds: int | None, n_fit: int, n_eval: int, temperature: float) -> tuple[str, str]:
    """The name of ``after`` and the phrase of the rows it covers."""
    if folds:
        return "out of fold", f"out of fold over all {N:,} rows"
    return f"T = {temperature:.4g}", f"on the {n_eval:,} held-out rows"


FIT_CASES = list(itertools.product([None, 5], [False, True], [False, True]))


@pytest.mark.parametrize(("folds", "groups", "sets"), FIT_CASES)
def test_fit_every_renderer_names_after_by_what_it_was_computed_at(domains, monkeypatch, folds, groups, sets):
    plain, _ = domains
    report = fit_file(str(plain), folds=folds, group_by="domain" if groups else None,
                      conformal_alpha=[0.1] if sets else (), device="cpu")
    data = report.to_json()
    name, rows = fit_expectations(folds, data["n_fit"], data["n_eval"], data["temperature"])
    assert data["after"]["basis"]["label"] == name and data["before"]["basis"]["label"] == "T = 1"
    assert data["after"]["basis"]["rows_label"] == rows
    assert (data["after"]["basis"]["tau"] is None) == bool(folds)
    wrong = f"after (T = {data['temperature']:.4g})"
    # console
    text = console_text(print_fit, report)
    assert f"after ({name})" in text and rows in text.splitlines()[0]
    assert (wrong in text) != bool(folds)
    if sets:
        assert name in text[text.index("conformal sets"):]
    if groups:
        assert "ECE" in text and "per-group T" in text and "global T" in text and "ECE T\n" not in text
    # Markdown card, the GitHub step summary's text
    card = fit_markdown(report)
    assert f"| metric | before (T = 1) | after ({name}) |" in card and rows in card
    assert "fitted and evaluated on the same" not in card and (wrong in card) != bool(folds)
    # HTML page
    words, drawn = page_text("fit", report, monkeypatch)
    assert f"after ({name})" in words and rows in words and "None" not in words
    assert [title for title, _ in drawn["reliability"]] == ["before (T = 1)", f"after ({name})"]
    assert [label for label, _ in drawn["curves"]] == ["T = 1", name]
    if sets:
        set_rows = re.findall(r"(T = 1|out of fold|T = [\d.]+) 0\.1 (LAC|APS)", words)
        assert {label for label, _ in set_rows} == {"T = 1", name}
    if groups:
        # the console's words: each group's T, then ECE at T = 1, at its own T and at the global T
        assert "T_g ECE T = 1 ECE per-group T ECE global T NLL per-group T" in words
        assert drawn["groups"] == ("global T (out of fold)" if folds else f"global T ({name})")


def report_args(sweep: bool, eval_rows: bool, groups: bool, sets: bool) -> dict:
    return {"sweep": [1.0, 1.778, 3.162, 5.623, 10.0] if sweep else None, "eval_rows": eval_rows,
            "group_by": "domain" if groups else None, "conformal_alpha": [0.1] if sets else (), "device": "cpu"}


def expected_label(row: dict, stored: float) -> str:
    if row.get("per_group"):
        return "per-group T (stored)"
    if row["tau"] == stored:
        return f"T = {stored:.4g} (stored)"
    return "T = 1" if row["tau"] == 1.0 else f"tau = {row['tau']:.4g}"


REPORT_CASES = list(itertools.product([False, True], repeat=4))


@pytest.mark.parametrize(("sweep", "eval_rows", "groups", "sets"), REPORT_CASES)
def test_report_every_renderer_keeps_the_per_group_figures_apart(domains, monkeypatch, sweep, eval_rows, groups,
                                                                   sets):
    _, stored_file = domains
    result = report_file(str(stored_file), **report_args(sweep, eval_rows, groups, sets))
    data = result.to_json()
    stored = data["stored_temperature"]
    rows = data["results"]
    own = [r for r in rows if r.get("per_group")]
    # with groups, both the global T's figures and the per-group ones; the per-group set last, never a sweep point
    assert len(own) == int(groups) and (not own or own[0] is rows[-1])
    at_global = [r for r in rows if r["tau"] == stored and not r.get("per_group")]
    assert len(at_global) == 1 and {g["tau"] for g in at_global[0].get("groups", [{"tau": stored}])} == {stored}
    if own:
        assert own[0]["nll"] != at_global[0]["nll"] and own[0]["basis"]["tau"] is None
    points = [r for r in rows if not r.get("per_group")]
    lowest = min(points, key=lambda r: r["nll"])["tau"]
    assert data["min_nll_tau"] == lowest
    if sweep:
        assert data["sweep"]["best_nll_tau"] == min((r for r in points if r["tau"] in data["sweep"]["taus"]),
                                                    key=lambda r: r["nll"])["tau"]
    scope = f"on the {data['n']:,} held-out rows" if eval_rows else f"on all {data['n']:,} rows"
    for r in rows:
        assert r["basis"]["label"] == expected_label(r, stored) and r["basis"]["rows_label"].startswith(scope)
    _check_report_console(result, data, stored, lowest)
    _check_report_markdown(result, data, stored)
    _check_report_page(result, data, stored, lowest, monkeypatch)
    if sets:
        for r in rows:
            assert r["conformal"] and all(g.get("conformal") for g in r.get("groups", []))


def _check_report_console(result, data: dict, stored: float, lowest: float) -> None:
    text = console_text(print_report, result)
    table = text[:text.index("tau smooth ECE") if "tau smooth ECE" in text else len(text)].splitlines()
    marked = {line.split()[0]: line for line in table if line.strip() and (line.split()[0][0].isdigit()
                                                                         or line.split()[0] == "T_g")}
    several = sum(not r.get("per_group") for r in data["results"]) > 1
    assert ("min NLL" in marked[f"{lowest:.4g}"]) == several and "stored" in marked[f"{stored:.4g}"]
    assert sum("min NLL" in line for line in marked.values()) == several
    if any(r.get("per_group") for r in data["results"]):
        assert marked["T_g"].rstrip().endswith("per-group T") and "stored" not in marked["T_g"]
        assert "T_g = per-group T (stored)" in text
        assert f"groups by domain at T = {stored:.4g} (stored)," in text
        assert "groups by domain at per-group T (stored): each group's rows at its own T" in text
    assert all(line == line.rstrip() for line in text.splitlines())  # no trailing blanks in a CI log


def _check_report_markdown(result, data: dict, stored: float) -> None:
    card = report_markdown(result)
    for r in data["results"]:
        name = "per-group T (stored)" if r.get("per_group") else (
            f"{r['tau']:.4g}" + (" (stored)" if r["tau"] == stored else ""))
        assert f"| {name} | {r['nll']:.4f} |" in card
    assert f"{data['n']:,}" in card


def _check_report_page(result, data: dict, stored: float, lowest: float, monkeypatch) -> None:
    words, drawn = page_text("report", result, monkeypatch)
    own = [r for r in data["results"] if r.get("per_group")]
    assert ("stored global T = " if own else "stored T = ") in words
    for r in data["results"]:
        assert expected_label(r, stored) in words
    several = sum(not r.get("per_group") for r in data["results"]) > 1
    assert words.count("(min NLL)") == several
    if several:
        assert f"{expected_label({'tau': lowest}, stored)} (min NLL)" in words
    if "sweep" in drawn:  # drawn against tau: the rows at one global temperature, no per-group point spliced in
        rows, marks = drawn["sweep"]
        assert sorted(r["nll"] for r in rows) == sorted(r["nll"] for r in data["results"] if not r.get("per_group"))
        assert marks["min NLL"] == lowest and marks["stored T"] == stored
    assert [label for label, _ in drawn["curves"]] == [expected_label(r, stored) for r in data["results"]]
    if own:
        assert "per-group T (stored)" in [title for title, _ in drawn["reliability"]]
        assert "Groups at per-group T (stored): each group's rows at its own T" in words
        assert f"Groups at T = {stored:.4g} (stored)" in words
        assert f"Groups at tau = {stored:.4g}" not in words


def test_plots_with_groups_keep_their_panels_and_draw_every_series(domains):
    """``report --group-by --plot`` over a sweep of 5 temperatures: the sweep's panels stay (their points the rows
    at one temperature), and the group bars show all 7 series (tau = 10 and the per-group series included)."""
    pytest.importorskip("matplotlib")
    from tempcal.subsets.plots import fit_group_figure, report_group_figure

    _, stored_file = domains
    result = report_file(str(stored_file), **report_args(True, False, True, True))
    figure = report_group_figure(result)
    axes = [ax for sub in figure.subfigs for ax in sub.axes]
    nll = next(ax for ax in axes if ax.get_ylabel() == "NLL")
    points = [m for k, m in enumerate(result.results) if result.basis(k).sweep_point]
    assert sorted(nll.lines[0].get_ydata()) == sorted(m.nll for m in points)
    assert any(ax.get_ylabel() == "mean set size" for ax in axes)
    assert any(ax.get_title().startswith("risk-coverage") for ax in axes)
    bars = next(ax for ax in axes if ax.get_xlabel() == "ECE")
    legend = [t.get_text() for t in bars.get_legend().get_texts()]
    assert legend == [result.basis(k).label() for k in range(len(result.results))]
    assert "tau = 10" in legend and legend[-1] == "per-group T (stored)" and len(legend) == 7
    assert len(bars.patches) == 7 * DOMAINS
    plain, _ = domains
    report = fit_file(str(plain), folds=5, group_by="domain", device="cpu")
    figure = fit_group_figure(report)
    axes = [ax for sub in figure.subfigs for ax in sub.axes]
    titles = [ax.get_title().splitlines()[0] for ax in axes if ax.get_ylabel() == "accuracy"]
    assert titles == ["before (T = 1)", "after (out of fold)"]
    bars = next(ax for ax in axes if ax.get_xlabel() == "ECE")
    assert [t.get_text() for t in bars.get_legend().get_texts()] == ["T = 1", "global T (out of fold)",
                                                                     "per-group T (out of fold)"]
    ece = {g.group: g.after.ece for g in report.subsets.groups}
    drawn = sorted(round(p.get_width(), 12) for p in bars.patches)
    assert all(round(v, 12) in drawn for v in ece.values())


def test_report_without_groups_names_tau_one_and_the_stored_t(domains):
    _, stored_file = domains
    result = report_file(str(stored_file), taus=[1.0, "fitted", 2.5], device="cpu")
    labels = [r["basis"]["label"] for r in result.to_json()["results"]]
    stored = result.stored_temperature
    assert sorted(labels) == sorted(["T = 1", f"T = {stored:.4g} (stored)", "tau = 2.5"])
    assert np.isfinite([m.nll for m in result.results]).all()


@pytest.mark.parametrize(("options", "name", "rows"), [
    ({"val_fraction": 1.0}, "T = {t}", "on all 300 rows, T's fitting rows included"),
    ({"eval_file": "{plain}"}, "T = {t}", "on the 300 rows of {plain}"),
])
def test_fit_on_every_row_or_another_file_says_so(domains, monkeypatch, options, name, rows):
    plain, _ = domains
    options = {k: v.format(plain=plain) if isinstance(v, str) else v for k, v in options.items()}
    report = fit_file(str(plain), device="cpu", **options)
    name, rows = name.format(t=f"{report.temperature:.4g}"), rows.format(plain=plain)
    assert report.to_json()["after"]["basis"]["rows_label"] == rows
    assert rows in console_text(print_fit, report).splitlines()[0]
    card = fit_markdown(report)
    assert f"after ({name})" in card and ("in-sample" in card) == ("val_fraction" in options)
    words, _ = page_text("fit", report, monkeypatch)
    assert rows in words and "None" not in words


def test_the_step_summary_and_a_pipe_read_the_same_words(domains, cli, tmp_path, monkeypatch):
    """``fit --folds`` in CI: the step summary names the out-of-fold column, and the piped console has no
    trailing blanks (rich pads titles and rows to the table's width)."""
    plain, _ = domains
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, err = cli(["fit", str(plain), "--folds", "5", "--group-by", "domain", "--no-write"])
    assert code == 0, err
    text = summary.read_text()
    assert "| metric | before (T = 1) | after (out of fold) |" in text and "out of fold over all 300 rows" in text
    assert "fitted and evaluated on the same" not in text
    assert "after (out of fold)" in out and all(line == line.rstrip() for line in out.splitlines())


@pytest.mark.parametrize(("q", "shown"), [(0.99999, "0.99999"), (0.99995, "0.99995"), (0.9999998, "1-2e-07"),
                                          (1.0, "1.0000"), (0.5, "0.5000"), (0.12345, "0.1235"),
                                          (3e-9, "3e-09"), (float("inf"), "inf")])
def test_a_threshold_short_of_one_never_reads_as_one(q, shown):
    from tempcal.output.figures import threshold_text

    assert threshold_text(q) == shown


def test_log_axes_read_plain_numbers(domains):
    """A sweep within one decade labels its ticks 1.1, 1.2, ..., never 1.1x10^0 (mathtext)."""
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from tempcal.output.plots import sweep_figure

    plain, _ = domains
    result = report_file(str(plain), taus=[1.0, 1.2, 1.4, 1.6], device="cpu")
    figure = sweep_figure([m.to_dict(with_bins=False) for m in result.results], {})
    FigureCanvasAgg(figure).draw()
    axis = figure.axes[len(figure.axes) - 2]  # the last panel against tau (the curves' axes after it)
    labels = [t.get_text() for t in axis.get_xticklabels(minor=True) + axis.get_xticklabels() if t.get_text()]
    assert "1.2" in labels and "1.5" in labels and not any("10^" in t or "times" in t for t in labels)
