"""Console tables (tempcal.output.console): report sweeps and ood results fit 80 columns, headers stay unwrapped."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from tempcal.output.console import print_ood
from tempcal.output.plots import log_spaced
from tempcal.workflows.ood import ood_file


def test_sweep_table_fits_80_columns(data_file):
    from rich.console import Console

    from tempcal.output.console import print_report
    from tempcal.workflows.report import report_file

    path, _, _ = data_file
    result = report_file(str(path), sweep=log_spaced(0.123456, 98.7654, 9), device="cpu")
    buffer = io.StringIO()
    print_report(result, Console(file=buffer, width=80, color_system=None))
    header, *lines = buffer.getvalue().splitlines()
    # The header names the file on one line however long its path; the tables fit 80 columns.
    assert header == f"{path}: 1500 samples, 8 classes, 15 bins"
    assert max(len(line) for line in lines) <= 80
    assert "…" not in buffer.getvalue()
    header = next(line for line in lines if "entropy" in line)
    assert all(name in header for name in ("tau", "NLL", "ECE", "MCE", "Brier", "acc", "conf", "entropy"))
    assert sum("min NLL" in line for line in lines) == 1
    assert len([line for line in lines if line.strip() and line.strip()[0].isdigit()]) == 9


@pytest.mark.parametrize("bootstrap", [0, 20])
def test_ood_table_fits_80_columns(ood_files, bootstrap):
    """One table per OOD file, grouped by score: a line per score and tau, nothing wrapped or cut, also with all five
    scores and bootstrap intervals."""
    id_path, ood_path, _, _ = ood_files
    report = ood_file(id_path, [ood_path], scores="all", bootstrap=bootstrap, min_auroc=0.99)
    buffer = io.StringIO()
    print_ood(report, Console(file=buffer, width=80, color_system=None))
    text = buffer.getvalue()
    lines = text.splitlines()
    rows = [line for line in lines if re.match(r"^(\S+)? +[0-9.e+]+ +[T*!]* *[01]\.\d{4} ", line)]
    assert len(rows) == len(report.scores) * len(report.taus)  # one line per score and tau: nothing wrapped
    assert "…" not in text
    # only the plain-text lines (paths, legend, sentences) may run past 80 columns, never the tables
    prose = ("On ", "OOD ", "in-distribution", "95% bootstrap", str(id_path))
    assert all(len(line) <= 80 for line in lines if not line.startswith(prose))
    assert any(line.startswith("On ") and len(line) > 80 for line in lines)  # the sentences stay on one line
    assert sum(line.startswith("On ") for line in lines) == 1  # the best score and tau of the one OOD file
    assert sum("**" in line for line in rows) == 1 and any("!" in line for line in rows)
    header = next(line for line in lines if "AUROC" in line)
    assert ("AUROC 95% CI" in header) == bool(bootstrap) and ("mean ID" in header) == (not bootstrap)
