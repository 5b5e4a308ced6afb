"""Reliability diagrams: every non-empty bin's 95% Wilson interval is drawn as an error bar at the bin's centre."""

from __future__ import annotations

import pytest
import torch
from conftest import miscalibrated

import tempcal

matplotlib = pytest.importorskip("matplotlib")


def test_error_bars_span_each_bins_wilson_interval():
    from matplotlib.container import ErrorbarContainer
    from matplotlib.figure import Figure

    from tempcal.output.plots import _reliability_axes

    logits, labels = miscalibrated(400, 5, 3.0, seed=4)
    m = tempcal.calibration_metrics(logits, labels, 1.0, device="cpu", bins=12)
    figure = Figure()
    ax, hist = figure.subplots(2, 1)
    _reliability_axes(ax, hist, m, "test")
    (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    segments = bars.lines[2][0].get_segments()
    shown = [b for b in m.bins if b.count]
    assert len(segments) == len(shown) < len(m.bins)  # empty bins draw nothing
    for segment, b in zip(segments, shown, strict=True):
        (x0, low), (x1, high) = segment
        assert x0 == x1 == pytest.approx((b.lower + b.upper) / 2)
        assert low == pytest.approx(b.accuracy_low, abs=1e-12) and high == pytest.approx(b.accuracy_high, abs=1e-12)
    assert "95% interval (Wilson)" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_a_diagram_with_intervals_is_written(tmp_path):
    from tempcal.output.plots import reliability_diagram

    m = tempcal.calibration_metrics(torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 0.5]]), torch.tensor([0, 0, 1]),
                                    device="cpu", bins=5)  # bins of one sample, right and wrong: wide intervals
    path = reliability_diagram([("three samples", m)], tmp_path / "small.png")
    assert path.read_bytes().startswith(b"\x89PNG")
