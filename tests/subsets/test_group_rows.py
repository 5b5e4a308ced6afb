"""Each group's kept rows, sorted by group once: the rows a mask per group selects, in their order, and each
group's decision figures those of a plain loop over that group's rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from reference import ref_risk_coverage

from tempcal.core.data import as_logits_data
from tempcal.core.scan import ALL_ROWS, Scan
from tempcal.subsets.cells import GroupRows, cell_calibration, subset_metrics


def _calibration(groups: np.ndarray, count: int):
    g = torch.Generator().manual_seed(23)
    z = 2 * torch.randn(groups.size, 30, generator=g)
    y = torch.randint(0, 30, (groups.size,), generator=g)
    scan = Scan(as_logits_data(z, y), device="cpu", chunk_rows=101, fit_rows=ALL_ROWS)
    betas = torch.tensor([[1.0] * count, [0.5 + 0.1 * k for k in range(count)]], dtype=torch.float64)
    index = torch.from_numpy(groups)
    return cell_calibration(scan, betas, index, index, count, 15)


def test_each_groups_slice_is_its_masked_rows_in_order_and_its_figures_a_plain_loops():
    rng = np.random.default_rng(5)
    groups = rng.integers(0, 8, 1500)
    groups[groups == 6] = 2  # group 6 has no rows
    calibration = _calibration(groups, 8)
    rows = GroupRows.kept(calibration, groups, 8)
    assert rows is not None
    confidence, correct = calibration.confidence.numpy(), calibration.correct.numpy()
    nll = calibration.nll.numpy()
    for group in range(8):
        mine = groups == group
        assert np.array_equal(rows.of(rows.correct, group).numpy(), correct[mine])
        for slot in range(2):
            assert np.array_equal(rows.of(rows.confidence[slot], group).numpy(), confidence[slot][mine])
            assert np.array_equal(rows.of(rows.nll[slot], group).numpy(), nll[slot][mine])
            m = subset_metrics(calibration, slot, 1.0, group, rows)
            if group == 6:
                assert m is None
                continue
            assert m is not None and m.count == int(mine.sum())
            expected = ref_risk_coverage(confidence[slot][mine], correct[mine])
            assert (m.aurc, m.eaurc, m.augrc) == pytest.approx(
                (expected["aurc"], expected["eaurc"], expected["augrc"]), rel=1e-9, abs=1e-12)


def test_too_many_groups_keep_no_sorted_rows():
    groups = np.arange(1200) % 1001
    calibration = _calibration(groups, 1001)
    assert GroupRows.kept(calibration, groups, 1001) is None
    m = subset_metrics(calibration, 0, 1.0, 3, None)
    assert m is not None and np.isnan(m.aurc)


def test_group_estimators_from_the_sorted_rows_equal_those_of_the_groups_masked_rows():
    from tempcal.metrics.bootstrap import bootstrap_intervals
    from tempcal.metrics.calibration import ece_equal_mass, rms_calibration_error
    from tempcal.subsets.cells import row_extras
    from tempcal.subsets.options import Asked

    groups = np.random.default_rng(7).integers(0, 5, 900)
    calibration = _calibration(groups, 5)
    grouped = GroupRows(calibration, groups, 5)
    asked = Asked(10, 3, ["ece_equal_mass", "rms_ce"], 20)
    for group in range(5):
        mask = torch.from_numpy(groups == group)
        for slot in range(2):
            c, k = calibration.confidence[slot][mask], calibration.correct[mask]
            intervals = bootstrap_intervals(c, k, calibration.nll[slot][mask], 20, 3, 10)
            expected = {"ece_equal_mass": ece_equal_mass(c, k, 10), "rms_ce": rms_calibration_error(c, k, 10),
                        **{f"{name}_ci": list(interval) for name, interval in intervals.items()},
                        "bootstrap": {"resamples": 20, "seed": 3, "level": 0.95}}
            assert row_extras(calibration, slot, asked, (grouped, group)) == expected
