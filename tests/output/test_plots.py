"""Plots (tempcal.output.plots), checked on the matplotlib Figures they draw: Wilson intervals as error bars, every
temperature asked for, one count scale, the SOURCE named, legends clear of the data, readable OOD panels, and at
one tau the ROC curves and score histograms instead of one-point curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import miscalibrated
from safetensors.torch import save_file

import tempcal

matplotlib = pytest.importorskip("matplotlib")

from tempcal.io.safetensors_header import write_temperature  # noqa: E402
from tempcal.output import ood_plots, plots  # noqa: E402
from tempcal.output.files import write_files  # noqa: E402
from tempcal.subsets.plots import save_figure  # noqa: E402
from tempcal.workflows.fit import fit_file  # noqa: E402
from tempcal.workflows.ood import ood_file  # noqa: E402
from tempcal.workflows.report import report_file  # noqa: E402


def spy(monkeypatch, name: str) -> list:
    """The figures ``plots.<name>`` builds while a command writes its plot (each call's arguments beside it)."""
    seen: list = []
    build = getattr(plots, name)
    monkeypatch.setattr(plots, name, lambda *args, **kw: (seen.append((build(*args, **kw), args, kw)), seen[-1][0])[1])
    return seen


def drawn(figure):
    """The figure rendered (so that every extent is known) and its axes that draw something."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure).draw()
    return [ax for ax in figure.axes if ax.axison and (ax.lines or ax.patches or ax.collections)]


def assert_legends_clear(figure) -> None:
    """One legend, the figure's, outside every axes: it can hide no bar, error bar or curve."""
    assert all(ax.get_legend() is None for ax in figure.axes)
    [legend] = figure.legends
    box = legend.get_window_extent()
    assert not any(box.overlaps(ax.get_window_extent()) for ax in figure.axes if ax.axison)


def assert_readable(figure, size: float = 8) -> None:
    for ax in figure.axes:
        for label in ax.get_xticklabels() + ax.get_yticklabels():
            assert label.get_fontsize() >= size


def test_error_bars_span_each_bins_wilson_interval():
    from matplotlib.container import ErrorbarContainer

    logits, labels = miscalibrated(400, 5, 3.0, seed=4)
    m = tempcal.calibration_metrics(logits, labels, 1.0, device="cpu", bins=12)
    figure = plots.reliability_figure([("test", m)])
    ax = figure.axes[0]
    (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    segments = bars.lines[2][0].get_segments()
    shown = [b for b in m.bins if b.count]
    assert len(segments) == len(shown) < len(m.bins)  # empty bins draw nothing
    for segment, b in zip(segments, shown, strict=True):
        (x0, low), (x1, high) = segment
        assert x0 == x1 == pytest.approx((b.lower + b.upper) / 2)
        assert low == pytest.approx(b.accuracy_low, abs=1e-12) and high == pytest.approx(b.accuracy_high, abs=1e-12)
    assert "95% interval (Wilson)" in [t.get_text() for t in figure.legends[0].get_texts()]


def test_a_diagram_with_intervals_is_written(tmp_path):
    m = tempcal.calibration_metrics(torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 0.5]]), torch.tensor([0, 0, 1]),
                                    device="cpu", bins=5)  # bins of one sample, right and wrong: wide intervals
    path = save_figure(plots.reliability_figure([("three samples", m)]), tmp_path / "small.png")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_fit_plot_names_the_file_shares_the_count_scale_and_keeps_its_legend_off_the_bars(tmp_path, monkeypatch):
    """80 samples in 15 bins: sparse bins with wide error bars near the top left, where a legend inside the axes
    sat. Before and after counts differ by orders of magnitude, yet share one y scale."""
    logits, labels = miscalibrated(80, 4, 3.0, seed=7)
    path = tmp_path / "few.safetensors"
    save_file({"logits": logits, "labels": labels}, str(path))
    figures = spy(monkeypatch, "reliability_figure")
    report = fit_file(str(path), device="cpu")
    write_files("fit", report, plot=str(tmp_path / "fit.png"))
    [(figure, _, _)] = figures
    assert figure._suptitle is not None and figure._suptitle.get_text() == str(path)
    axes = drawn(figure)
    accuracy, counts = axes[0::2], axes[1::2]
    assert len(accuracy) == len(counts) == 2
    assert counts[0].get_shared_y_axes().joined(counts[0], counts[1])
    assert counts[0].get_ylim() == counts[1].get_ylim()
    peaks = [max(p.get_height() for p in ax.patches) for ax in counts]
    low, high = counts[0].get_ylim()
    assert low <= min(peaks) and max(peaks) <= high
    assert_legends_clear(figure)
    assert (tmp_path / "fit.png").read_bytes().startswith(b"\x89PNG")


def test_report_plot_draws_every_tau_asked_for(data_file, tmp_path, monkeypatch):
    path, _, _ = data_file
    taus = [0.5, 1.0, 2.0, 3.0, 5.0]
    figures = spy(monkeypatch, "reliability_figure")
    result = report_file(str(path), taus=taus, device="cpu")
    write_files("report", result, plot=str(tmp_path / "report.png"))
    [(figure, _, _)] = figures
    accuracy = [ax for ax in drawn(figure) if ax.get_ylabel() == "accuracy"]
    # tau 1 is T = 1 (no calibration), the others are temperatures asked for
    titles = [ax.get_title().splitlines()[0] for ax in accuracy]
    assert titles == ["tau = 0.5", "T = 1", "tau = 2", "tau = 3", "tau = 5"]
    for ax, m in zip(accuracy, result.results, strict=True):
        assert f"ECE = {m.ece:.4f}" in ax.get_title()
        assert len([p for p in ax.patches if p.get_facecolor()[3] > 0]) == sum(b.count > 0 for b in m.bins)
    counts = [ax for ax in figure.axes if ax.get_ylabel() == "samples"]
    assert len(counts) == 5 and len({ax.get_ylim() for ax in counts}) == 1
    assert figure._suptitle.get_text() == str(path)
    assert_legends_clear(figure)


def test_sweep_plot_draws_every_row_and_marks_the_lowest_nll_of_them(data_file, tmp_path, monkeypatch):
    """A sweep missing the stored (fitted) T: the stored T's row is drawn too, and is the one marked min NLL."""
    path, _, _ = data_file
    fitted = fit_file(str(path), val_fraction=1, device="cpu").temperature
    stored = write_temperature(path, fitted, output=tmp_path / "stored.safetensors")
    figures = spy(monkeypatch, "sweep_figure")
    result = report_file(str(stored), sweep=plots.log_spaced(0.5, 5, 6), device="cpu")
    write_files("report", result, plot=str(tmp_path / "sweep.png"))
    [(figure, (_, marks, _), _)] = figures
    nll = np.array([m.nll for m in result.results])
    taus = np.array([m.tau for m in result.results])
    assert marks["min NLL"] == taus[np.argmin(nll)] == pytest.approx(fitted)
    nll_ax = drawn(figure)[0]
    curve = nll_ax.lines[0]
    assert list(curve.get_xdata()) == sorted(taus) and len(taus) == 7
    assert [line.get_xdata()[0] for line in nll_ax.lines[1:]] == [marks["min NLL"], fitted]
    assert figure._suptitle.get_text() == str(stored)
    assert_legends_clear(figure)


# -- ood ----------------------------------------------------------------------------------------------------------


@pytest.fixture
def calibrated_ood(ood_files, tmp_path):
    """The ID file with a stored T, its OOD file and a farther one: (id, [ood files])."""
    id_path, ood_path, _, z_ood = ood_files
    far = tmp_path / "far.safetensors"
    save_file({"logits": 0.3 * z_ood}, str(far))
    calibrated = write_temperature(id_path, 1.7, output=tmp_path / "calibrated.safetensors")
    return calibrated, [ood_path, far]


def test_ood_at_one_tau_draws_roc_curves_and_histograms(calibrated_ood):
    """``--tau fitted``: per OOD file the ROC curve of each score (its area the AUROC, as scikit-learn computes it)
    and a histogram per score; no axis of one point, no tau axis, file names in titles."""
    from sklearn.metrics import roc_auc_score

    id_path, oods = calibrated_ood
    report = ood_file(id_path, oods, taus=["fitted"], scores="msp,energy,gen")
    figure = ood_plots.ood_figure(report)
    axes = drawn(figure)
    assert len(axes) == len(figure.axes) == 2 * (1 + 3)
    assert all(ax.get_xscale() == "linear" for ax in axes)
    roc = [ax for ax in axes if "false positive rate" in ax.get_xlabel()]
    assert len(roc) == 2
    for i, (ax, path) in enumerate(zip(roc, oods, strict=True)):
        assert Path(path).name in ax.get_title()
        curves = [line for line in ax.lines if len(line.get_xdata()) > 2]
        assert [line.get_label() for line in curves] == ["MSP", "energy", "GEN"]
        for line, score in zip(curves, report.scores, strict=True):
            fpr, tpr = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
            assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0, 0, 1, 1)
            assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
            ids, ood = report.id_scores[score][0], report.ood_scores[i][score][0]
            expected = roc_auc_score(np.r_[np.ones(ids.size), np.zeros(ood.size)], np.r_[ids, ood])
            assert np.trapezoid(tpr, fpr) == pytest.approx(expected, abs=1e-12)
    histograms = [ax for ax in axes if ax not in roc]
    assert len(histograms) == 6 and all(len(ax.patches) > 40 for ax in histograms)
    for ax, (path, score) in zip(histograms, [(p, s) for p in oods for s in ("MSP", "energy", "GEN")], strict=True):
        assert ax.get_title().startswith(f"{Path(path).name}: {score}")
    assert all(not ax.get_ylabel().endswith(".safetensors") for ax in axes)
    title = figure.legends[0].get_title().get_text()
    assert str(id_path) in title and "tau = 1.7 (the calibration T)" in title
    assert_legends_clear(figure)
    assert_readable(figure)


def test_ood_sweep_is_readable_and_names_each_file_in_titles(calibrated_ood):
    id_path, oods = calibrated_ood
    report = ood_file(id_path, oods, scores="msp,energy")
    figure = ood_plots.ood_figure(report)
    axes = drawn(figure)
    assert all(not ax.get_ylabel().endswith(".safetensors") for ax in figure.axes)
    for ax in axes:
        assert any(Path(p).name in ax.get_title() for p in oods)
    fpr = [ax for ax in axes if "FPR95 (OOD" in ax.get_title()]
    assert len(fpr) == 2 and all(ax.get_ylim()[1] - ax.get_ylim()[0] >= 0.05 for ax in fpr)
    assert_legends_clear(figure)
    assert_readable(figure)


def test_flat_fpr95_is_not_zoomed_to_its_rounding(ood_files, tmp_path):
    """Two temperatures whose FPR95 differ by 1e-3 at most: the axis spans at least 0.05, not 0.0072-0.0080."""
    id_path, ood_path, _, _ = ood_files
    report = ood_file(id_path, [ood_path], taus=[1.0, 1.001], scores="msp")
    values = [m.fpr95 for _, m in report.results]
    assert max(values) - min(values) < 1e-2
    fpr = next(ax for ax in ood_plots.ood_figure(report).axes if "FPR95 (OOD" in ax.get_title())
    low, high = fpr.get_ylim()
    assert high - low >= 0.05 and low <= min(values) and max(values) <= high
