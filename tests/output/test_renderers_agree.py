"""Every figure the HTML page and the Markdown card show equals the JSON's: one run of each command writes all three,
and each table cell is read back (as a reader reads it) and held against the JSON value it names, formatted here
independently (the page's 4 significant digits, the card's 4 decimals)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
from conftest import EXAMPLE, EXAMPLES

pytest.importorskip("matplotlib")
pytest.importorskip("jinja2")

NOISE = EXAMPLES / "digits_noise_logits.safetensors"
#: The page's metric headings and the card's metric labels, each with its JSON key (the contract's names).
PAGE_KEYS = {"NLL": "nll", "ECE": "ece", "RMS CE": "rms_ce", "MCE": "mce", "Brier": "brier", "accuracy": "accuracy",
             "confidence": "mean_confidence", "entropy": "entropy", "smooth ECE": "smece", "AURC": "aurc",
             "E-AURC": "eaurc", "AUGRC": "augrc"}
CARD_KEYS = {"NLL": "nll", "ECE": "ece", "RMS calibration error": "rms_ce", "MCE": "mce", "Brier": "brier",
             "accuracy": "accuracy", "entropy (nats)": "entropy", "mean confidence": "mean_confidence",
             "smooth ECE": "smece", "AURC": "aurc"}


class Tables(HTMLParser):
    """Every table of a page as {section id: [rows of cell texts]}, the header row first."""

    def __init__(self):
        super().__init__()
        self.section, self.tables, self.cell = "", {}, None

    def handle_starttag(self, tag, attrs):
        if tag == "section":
            self.section = dict(attrs).get("id", "")
        elif tag == "table":
            self.tables.setdefault(self.section, []).append([])
        elif tag == "tr":
            self.tables[self.section][-1].append([])
        elif tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.tables[self.section][-1][-1].append(self.cell.strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def page_number(value: float) -> str:
    """A figure as a reader sees it on the page: 4 significant digits (2 in exponent form below 0.001)."""
    if value == 0 or abs(value) >= 1e-3:
        return f"{value:.4g}"
    return f"{value:.2e}"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, tuple[dict, dict, str]]:
    """Each command's JSON, its page's tables and its Markdown card, from one run."""
    from tempcal.cli.main import main

    folder = tmp_path_factory.mktemp("agree")
    calibrated = folder / "calibrated.safetensors"
    commands = {"fit": ["fit", str(EXAMPLE), "--output", str(calibrated)],
                "report": ["report", str(calibrated), "--sweep", "0.5:10:5", "--tau", "fitted"],
                "ood": ["ood", str(calibrated), "--ood", str(NOISE), "--score", "msp,energy", "--tau", "1",
                        "--tau", "fitted"]}
    out = {}
    for name, argv in commands.items():
        files = {k: folder / f"{name}.{k}" for k in ("json", "html", "md")}
        assert main([*argv, "--json", str(files["json"]), "--html", str(files["html"]), "--markdown",
                     str(files["md"]), "-q", "--no-config"]) == 0
        parser = Tables()
        parser.feed(files["html"].read_text())
        out[name] = (json.loads(files["json"].read_text()), parser.tables, files["md"].read_text())
    return out


def card_rows(card: str) -> list[list[str]]:
    """The Markdown table rows below the header separator, as cells."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in card.splitlines() if line.startswith("|")]
    return [r for r in rows if not all(set(c) <= set("-:") for c in r)]


def test_fit_page_and_card_show_the_json_figures(outputs):
    data, tables, card = outputs["fit"]
    header, *rows = tables["metrics"][0]
    shown = {row[0]: row[1:] for row in rows}
    assert set(shown) == {"before (T = 1)", f"after (T = {data['temperature']:.4g})"}
    checked = 0
    for side, row in zip(("before", "after"), rows, strict=True):
        for heading, cell in zip(header[1:], row[1:], strict=True):
            assert cell == page_number(data[side][PAGE_KEYS[heading]]), (side, heading)
            checked += 1
    assert checked >= 2 * 9
    figures = card_rows(card)[1:]
    assert [r[0] for r in figures] == list(CARD_KEYS)
    for label, before, after in figures:
        key = CARD_KEYS[label]
        assert (before, after) == (f"{data['before'][key]:.4f}", f"{data['after'][key]:.4f}"), label


def test_report_page_and_card_show_the_json_figures(outputs):
    data, tables, card = outputs["report"]
    header, *rows = tables["metrics"][0]
    assert len(rows) == len(data["results"]) == 6
    for row, result in zip(rows, data["results"], strict=True):
        assert row[0].startswith(("tau = ", "T = ")) and f"{result['tau']:.4g}" in row[0]
        for heading, cell in zip(header[1:], row[1:], strict=True):
            assert cell == page_number(result[PAGE_KEYS[heading]]), (row[0], heading)
    header, *figures = card_rows(card)
    assert len(figures) == len(data["results"])
    for row, result in zip(figures, data["results"], strict=True):
        assert row[0].startswith(f"{result['tau']:.4g}")
        for label, cell in zip(header[1:], row[1:], strict=True):
            assert cell == f"{result[CARD_KEYS[label]]:.4f}", (row[0], label)


def test_ood_page_and_card_show_the_json_figures(outputs):
    data, tables, card = outputs["ood"]
    (ood_file,) = data["ood_files"]
    found = {(r["tau"], r["score"]): r for r in data["results"]}
    auroc, fpr95 = tables["ood-0"]
    for table, key in ((auroc, "auroc"), (fpr95, "fpr95")):
        header, *rows = table
        assert header[1:] == ["msp", "energy"]
        assert len(rows) == len(data["taus"]) == 2
        for row, tau in zip(rows, sorted(data["taus"]), strict=True):
            assert row[0].split(" ")[0] == page_number(tau)
            assert row[1:] == [page_number(found[(tau, s)][key]) for s in ("msp", "energy")]
    cells = re.findall(r"^\| ([\d.]+)[^|]* \| ([\d.]+) \| ([\d.]+) \|$", card, flags=re.M)
    assert len(cells) == len(data["results"]) == 4
    shown = {(float(tau), auroc, fpr) for tau, auroc, fpr in cells}
    assert shown == {(float(f"{r['tau']:.4g}"), f"{r['auroc']:.4f}", f"{r['fpr95']:.4f}") for r in data["results"]}
    assert ood_file in card
