"""Console tables (tempcal.output.console): report sweeps and ood results fit 80 columns, headers stay unwrapped."""

from __future__ import annotations

import io

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


def test_table_fits_80_columns(ood_files):
    id_path, ood_path, _, _ = ood_files
    report = ood_file(id_path, [ood_path], scores=["msp", "energy"])
    buffer = io.StringIO()
    print_ood(report, Console(file=buffer, width=80, color_system=None))
    lines = buffer.getvalue().splitlines()
    table_lines = [line for line in lines if "│" in line]
    assert len(table_lines) == 2 * len(report.taus)  # one line per tau: nothing wrapped
    # only the plain-text lines (paths, legend, sentences) may run past 80 columns, never the tables
    prose = ("On ", "OOD ", "in-distribution", str(id_path))
    assert all(len(line) <= 80 for line in lines if not line.startswith(prose))
    assert any(line.startswith("On ") and len(line) > 80 for line in lines)  # the sentences stay on one line
