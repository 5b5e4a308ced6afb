"""Console tables (tempcal.output.console): every figure printed whole at 80 columns (wide tables split, never
cut), headers unwrapped, the NLL minimum of the rows shown, and OOD notes on what the figures do not say."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest
import torch
from conftest import id_ood_logits
from rich.console import Console
from safetensors.torch import save_file

from tempcal.cli.main import main
from tempcal.io.safetensors_header import write_temperature
from tempcal.metrics.calibration import ESTIMATORS
from tempcal.output.console import print_fit, print_ood, print_report
from tempcal.output.plots import log_spaced
from tempcal.sources.base import SourceOptions
from tempcal.workflows.fit import fit_file
from tempcal.workflows.ood import ood_file
from tempcal.workflows.report import report_file

NUMBER = re.compile(r"(?<!\d)-?\d+(?:\.\d+)?(?:e[+-]\d+)?")
#: Lines of prose (headers, sentences, the legend, notes): printed unwrapped, so they may pass 80 columns.
PROSE = ("On ", "OOD ", "in-distribution", "95% bootstrap", "note: ", "GEN: ")


def rendered(render, result, width: int = 80) -> str:
    buffer = io.StringIO()
    render(result, Console(file=buffer, width=width, color_system=None))
    return buffer.getvalue()


def assert_tables_whole(text: str, source) -> list[str]:
    """No cut cell anywhere, no table line past 80 columns; the lines of the tables."""
    assert "…" not in text
    tables = [line for line in text.splitlines() if not line.startswith((*PROSE, str(source)))]
    assert max(len(line) for line in tables) <= 80
    return tables


def numbers_in(lines: list[str], first: str) -> list[str]:
    """Every number on the lines whose first cell is ``first`` (a row of every table it is split into)."""
    return [n for line in lines if line.split() and line.split()[0] == first for n in NUMBER.findall(line)]


def interval(bounds) -> list[str]:
    return [f"{bounds[0]:.4f}", f"{bounds[1]:.4f}"]


def expected_extras(row: dict) -> list[str]:
    """Each estimator to four decimals, each bootstrap interval's two ends, as the user reads them."""
    out = []
    for name, value in row.items():
        if name != "bootstrap":
            out += interval(value) if isinstance(value, list) else [f"{value:.4f}"]
    return out


def test_report_with_every_estimator_and_the_bootstrap_prints_every_figure_whole(data_file):
    """Nine temperatures, all four estimators and bootstrap intervals (wider than 80 columns in one table): every
    figure of every row is printed whole, in tables of at most 80 columns."""
    path, _, _ = data_file
    result = report_file(str(path), sweep=log_spaced(0.123456, 98.7654, 9), estimators=list(ESTIMATORS),
                         bootstrap=20, device="cpu")
    text = rendered(print_report, result)
    header, *_ = text.splitlines()
    assert header == f"{path}: 1,500 samples, 8 classes, 15 bins"  # one line however long the path
    lines = assert_tables_whole(text, path)
    headers = [line for line in lines if line.lstrip().startswith("tau")]
    assert len(headers) >= 3  # the metrics, then the extras split into two or more tables
    assert all(name in text for name in [*ESTIMATORS, "ece_ci", "nll_ci"])
    for m, extras in zip(result.results, result.extras, strict=True):
        shown = numbers_in(lines, f"{m.tau:.4g}")
        figures = [f"{v:.4f}" for v in (m.nll, m.ece, m.rms_ce, m.mce, m.brier, m.accuracy, m.mean_confidence,
                                         m.entropy, m.smece, m.aurc, m.eaurc, m.augrc)]
        assert sorted(shown) == sorted([f"{m.tau:.4g}"] * len(headers) + figures + expected_extras(extras))


def test_fit_with_every_estimator_and_the_bootstrap_prints_every_figure_whole(data_file):
    path, _, _ = data_file
    report = fit_file(str(path), estimators=list(ESTIMATORS), bootstrap=20, device="cpu")
    text = rendered(print_fit, report)
    lines = assert_tables_whole(text, path)
    for label, extras in zip(("T = 1", f"T = {report.after.tau:.4g}"), report.extras, strict=True):
        shown = [n for line in lines if line.startswith(label + " ") for n in NUMBER.findall(line[len(label):])]
        assert all(shown.count(x) >= expected_extras(extras).count(x) for x in expected_extras(extras))
    for b in report.after.bins:  # the reliability table's rows, after T, whole
        if b.count:
            row = next(line for line in lines if line.startswith(f"{b.lower:.2f}-{b.upper:.2f}"))
            assert f"{b.confidence:.3f}" in row and f"{b.accuracy:.3f}" in row


def test_min_nll_marks_the_lowest_of_every_row_shown_the_stored_t_included(data_file, tmp_path):
    """A sweep that misses the fitted T, stored in the file: the stored T's row has the lowest NLL of the rows
    shown, so it, and only it, is marked ``min NLL`` (not the sweep's own lowest)."""
    path, _, _ = data_file
    fitted = fit_file(str(path), val_fraction=1, device="cpu").temperature
    stored = write_temperature(path, fitted, output=tmp_path / "stored.safetensors")
    result = report_file(str(stored), sweep=log_spaced(0.5, 5, 8), device="cpu")
    lines = rendered(print_report, result).splitlines()
    rows: dict[float, tuple[float, str]] = {}
    for line in lines:  # the first table's rows (the decision figures' table repeats each tau beneath)
        if line.strip() and line.strip()[0].isdigit():
            rows.setdefault(float(line.split()[0]), (float(line.split()[1]), line))
    assert len(rows) == 9  # the eight sweep temperatures and the stored T
    lowest = min(rows, key=lambda tau: rows[tau][0])
    assert lowest == pytest.approx(fitted, rel=1e-3) and lowest not in [round(t, 4) for t in result.sweep]
    assert [tau for tau, (_, line) in rows.items() if "min NLL" in line] == [lowest]
    assert "stored, min NLL" in rows[lowest][1]


@pytest.mark.parametrize("bootstrap", [0, 20])
def test_ood_with_every_score_and_two_ood_files_prints_every_figure_whole(ood_files, tmp_path, bootstrap):
    """A table per OOD file, grouped by score, a line per score and tau: nothing wrapped or cut, also with all five
    scores and bootstrap intervals; every figure of every row is on its line."""
    id_path, ood_path, _, z_ood = ood_files
    far = tmp_path / "far.safetensors"
    save_file({"logits": 0.3 * z_ood}, str(far))
    report = ood_file(id_path, [ood_path, far], scores="all", bootstrap=bootstrap, min_auroc=0.99)
    text = rendered(print_ood, report)
    lines = assert_tables_whole(text, id_path)
    rows = [line for line in lines if re.match(r"^(\S+)? +[0-9.e+]+ +[T*!]* *[01]\.\d{4} ", line)]
    assert len(rows) == 2 * len(report.scores) * len(report.taus)  # one line per file, score and tau
    for (_, m), line in zip(report.results, rows, strict=True):
        figures = [f"{m.tau:.4g}", *(f"{getattr(m, k):.4f}" for k in ("auroc", "aupr_in", "aupr_out", "fpr95"))]
        extra = interval(m.auroc_ci) + interval(m.fpr95_ci) if bootstrap else []
        assert all(x in NUMBER.findall(line) for x in figures + extra), line
    assert any(line.startswith("On ") and len(line) > 80 for line in text.splitlines())  # sentences on one line
    assert sum(line.startswith("On ") for line in text.splitlines()) == 2
    assert sum("**" in line for line in rows) == 2 and any("!" in line for line in rows)
    header = next(line for line in lines if "AUROC" in line)
    assert ("AUROC 95% CI" in header) == bool(bootstrap) and ("mean ID" in header) == (not bootstrap)


# -- notes on what the OOD figures do not say -----------------------------------------------------------------


def probabilities(tmp_path, seed: int = 0):
    """ID and OOD probability files (softmax of :func:`id_ood_logits`, as a model's softmax output is saved)."""
    z_id, y, z_ood = id_ood_logits(seed=seed)
    save_file({"logits": torch.softmax(z_id, 1), "labels": y}, str(tmp_path / "id_p.safetensors"))
    save_file({"logits": torch.softmax(z_ood, 1)}, str(tmp_path / "ood_p.safetensors"))
    return tmp_path / "id_p.safetensors", tmp_path / "ood_p.safetensors"


def test_energy_and_maxlogit_on_probabilities_are_not_named_the_best(tmp_path):
    """On ``--probs`` the logits are log(p): energy at tau = 1 is log(sum p), every score 0 up to rounding, and
    MaxLogit ranks as MSP does. The workflow names one of them the best; the console names MSP, and says why."""
    id_p, ood_p = probabilities(tmp_path)
    report = ood_file(id_p, [ood_p], taus=[1.0], scores="maxlogit,energy,msp", options=SourceOptions(probs=True))
    energy = np.concatenate([report.id_scores["energy"][0], report.ood_scores[0]["energy"][0]])
    assert np.abs(energy).max() < 1e-6  # noise, as the user's file is built
    assert report.best_overall[0].score in ("maxlogit", "energy")  # what the workflow alone says
    text = rendered(print_ood, report)
    best = next(line for line in text.splitlines() if line.startswith("On "))
    assert re.search(r" is (\S+) at tau = 1 ", best).group(1) == "MSP"
    rows = [line for line in text.splitlines() if re.match(r"^(\S+)? +1 ", line)]
    assert [line for line in rows if "*" in line] == [next(line for line in rows if line.startswith("MSP"))]
    assert "note: on probabilities (--probs) the logits are log(p)" in text and "left out of the best" in text


def test_with_only_energy_on_probabilities_no_score_is_the_best(tmp_path):
    id_p, ood_p = probabilities(tmp_path)
    report = ood_file(id_p, [ood_p], taus=[1.0, 2.0], scores="energy", options=SourceOptions(probs=True))
    text = rendered(print_ood, report)
    assert "no score is named the best: energy on probabilities ranks by rounding" in text
    assert "*" not in "".join(line for line in text.splitlines() if not line.startswith("in-distribution"))


def test_scores_on_logits_are_all_ranked(ood_files):
    """Energy and MaxLogit on logits are the scores of their papers: nothing is left out, nothing noted."""
    id_path, ood_path, _, _ = ood_files
    report = ood_file(id_path, [ood_path], taus=[1.0, 2.0], scores="energy,maxlogit")
    text = rendered(print_ood, report)
    assert "note:" not in text and report.best_overall[0].sentence in text


def test_a_best_tau_float32_cannot_resolve_is_said(tmp_path):
    """ID and OOD differ only in the spread of their logits, so entropy ranks best as tau grows, at 1000, where
    it differs from log C by about 1e-6: computed in float32 (torch, as a deployed model would) its AUROC falls.
    MSP at tau = 1000 keeps its ranking in float32, though its means agree to three digits: no note for it."""
    g = torch.Generator().manual_seed(3)
    z_id, z_ood = 2.0 * torch.randn(400, 10, generator=g), 1.6 * torch.randn(300, 10, generator=g)
    save_file({"logits": z_id, "labels": torch.zeros(400, dtype=torch.int64)}, str(tmp_path / "id.safetensors"))
    save_file({"logits": z_ood}, str(tmp_path / "ood.safetensors"))
    report = ood_file(tmp_path / "id.safetensors", [tmp_path / "ood.safetensors"], scores="entropy,msp")
    best = {b.score: b for b in report.best}
    assert best["entropy"].tau == 1000 and best["msp"].tau == 1000

    def auroc32(score) -> float:
        def values(z):
            z = z.float() / 1000
            p = torch.softmax(z, 1)
            return (p * torch.log_softmax(z, 1)).sum(1) if score == "entropy" else p.max(1).values
        a, b = values(z_id).double(), values(z_ood).double()
        return float(((a[:, None] > b[None]).double() + 0.5 * (a[:, None] == b[None]).double()).mean())

    assert auroc32("entropy") < best["entropy"].auroc - 1e-3  # the claim, checked in float32 itself
    assert auroc32("msp") == pytest.approx(best["msp"].auroc, abs=2e-4)
    text = rendered(print_ood, report)
    notes = [line for line in text.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "entropy's best tau = 1000 cannot be deployed in float32" in notes[0]
    row = [line for line in text.splitlines() if line.split()[:1] == ["1000"]][-1]  # MSP's, the second score
    mean_id, mean_ood = row.split()[-2:]  # printed apart, with the digits in which they differ
    assert mean_id != mean_ood and float(mean_id) == pytest.approx(report.rows(str(tmp_path / "ood.safetensors"),
                                                                                "msp")[-1].mean_id, rel=1e-4)


def test_the_cli_prints_the_console_notes(tmp_path, capsys):
    id_p, ood_p = probabilities(tmp_path)
    assert main(["ood", str(id_p), "--ood", str(ood_p), "--probs", "--tau", "1", "--score", "maxlogit,energy,msp"]) == 0
    out = capsys.readouterr().out
    assert "is MSP at tau = 1" in out and "note: on probabilities" in out


def test_without_energy_at_tau_1_the_probs_reading_tells(tmp_path):
    """MaxLogit alone on probabilities leaves no fingerprint in the scores; the options SOURCE was read with
    (``--probs``) have MaxLogit left out all the same, and a file read as logits has nothing left out."""
    id_p, ood_p = probabilities(tmp_path)
    report = ood_file(id_p, [ood_p], taus=[1.0, 2.0], scores="maxlogit,msp", options=SourceOptions(probs=True))
    text = rendered(print_ood, report)
    assert "MaxLogit is log(max p) / tau" in text and re.search(r" is (\S+) at tau", text).group(1) == "MSP"
    as_logits = ood_file(id_p, [ood_p], taus=[1.0, 2.0], scores="maxlogit,msp", options=SourceOptions(probs=False))
    assert "note:" not in rendered(print_ood, as_logits)


def test_ood_probs_at_a_tau_other_than_1_leaves_energy_and_maxlogit_out(tmp_path, capsys):
    """``ood --probs --tau 2``: no energy at tau = 1 to recognise log-probabilities by, yet the JSON warns and the
    best is a score that ranks as on logits."""
    id_p, ood_p = probabilities(tmp_path)
    assert main(["ood", str(id_p), "--ood", str(ood_p), "--probs", "--tau", "2", "--score", "maxlogit,energy,msp",
                 "--json", "-"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert any("left out of the best" in w for w in payload["warnings"])


def test_a_split_of_a_small_set_suggests_folds_and_a_large_one_does_not(tmp_path, cli):
    from conftest import EXAMPLE

    g = torch.Generator().manual_seed(3)
    z = torch.randn(300, 4, generator=g) * 2
    y = torch.multinomial(torch.softmax(z / 0.75, 1), 1, generator=g)[:, 0]
    save_file({"logits": z, "labels": y}, str(tmp_path / "small.safetensors"))
    small = str(tmp_path / "small.safetensors")
    code, out, err = cli(["fit", small, "--no-write"])
    assert code == 0, err
    assert "note: T was fitted on 150 rows and judged on the other 150" in out and "--folds 10 fits T on all 300" in out
    for argv in (["fit", small, "--no-write", "--folds", "5"], ["fit", small, "--no-write", "--val-fraction", "1"],
                 ["fit", str(EXAMPLE), "--no-write"]):  # the example fits on 674 rows
        code, out, err = cli(argv)
        assert code == 0 and "judged on the other" not in out, err
