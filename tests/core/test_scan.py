"""Scan (tempcal.core.scan): its reduction dtype, per-sample and scores-only passes, against float64 references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import DEVICES, miscalibrated, scan_of
from reference import reference_per_sample

from tempcal.core.data import as_logits_data
from tempcal.core.scan import Scan
from tempcal.scores.engine import scan_scores


@pytest.mark.parametrize(("shape", "expected"), [((30000, 20), torch.float32), ((100, 2000), torch.float64),
                                                 ((2000, 100), torch.float64), ((999, 300), torch.float64)])
def test_reductions_use_float64_for_few_rows_or_few_logits(shape, expected):
    logits, labels = miscalibrated(*shape, 1.0, seed=15)
    assert Scan(as_logits_data(logits, labels), device="cpu").compute_dtype == expected


def test_per_sample_is_one_pass_and_matches_scipy():
    logits, labels = miscalibrated(3000, 9, 2.5, seed=1, dtype=torch.float32)
    scan = scan_of(logits, labels, chunk_rows=700)
    before = scan.passes
    stats = scan.per_sample(1 / 1.8)
    assert scan.passes == before + 1
    confidence, correct, nll = reference_per_sample(logits, labels, 1.8)
    np.testing.assert_allclose(stats["confidence"].numpy(), confidence, rtol=1e-12)
    np.testing.assert_allclose(stats["nll"].numpy(), nll, rtol=1e-10, atol=1e-12)
    assert np.array_equal(stats["correct"].numpy(), correct)
    # The same confidences as the calibration pass, bit for bit, so the bins agree with `evaluate`.
    [(_, kept)] = scan.calibration([1 / 1.8], 15, keep_scores=True)
    assert torch.equal(stats["confidence"], kept["confidence"])


def test_the_scores_pass_keeps_what_the_calibration_pass_keeps():
    """OOD scoring reads each chunk once and computes only the scores, which equal the calibration pass's (to the
    last bits: the scores pass forms MSP as exp(-log1p(r)) in float64, the calibration pass as 1 / s0)."""
    from tempcal.core.data import as_logits_data

    logits, labels = miscalibrated(700, 9, 2.0, seed=21)
    logits[3, 4] = -math.inf
    scan = Scan(as_logits_data(logits, labels), device="cpu", chunk_rows=64)
    before = scan.passes
    fast = scan_scores(scan, [1.0, 0.25, 3.0])
    assert scan.passes == before + 1
    full = scan.calibration([1.0, 0.25, 3.0], 15, keep_scores=True)
    for mine, (_, kept) in zip(fast, full, strict=True):
        torch.testing.assert_close(mine["msp"], kept["confidence"], rtol=1e-12, atol=0)
        torch.testing.assert_close(mine["energy"], kept["energy"], rtol=1e-12, atol=0)
    z = logits.double()
    assert torch.allclose(fast[1]["energy"], 4.0 * torch.logsumexp(z / 4.0, 1), rtol=1e-6)
    assert torch.allclose(fast[2]["msp"], torch.softmax(z * 3.0, 1).max(1).values, rtol=1e-6)


# -- a rank without rows (issue 18, item 2) ----------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_an_empty_share_keeps_everything_on_the_scans_device(device, monkeypatch):
    """Under torchrun a rank's share of the fitting rows can be empty; what it keeps and reduces must still live on
    its device, or the next collective mixes devices (under NCCL the other ranks then wait forever). A tensor made
    without ``device=`` lands on torch's default device: made ``meta`` here, so any such tensor is caught."""
    import tempcal.core.ece_fit as ece_fit_module
    import tempcal.core.scan as scan_module
    from tempcal.core.ece_fit import minimise_ece

    logits, labels = miscalibrated(0, 4, 1.0, seed=2)
    scan = Scan(as_logits_data(logits, labels), device=device)
    seen: list[torch.device] = []

    def collective(tensor, op="sum"):
        seen.append(tensor.device)
        return tensor

    monkeypatch.setattr(scan_module, "all_reduce", collective)
    monkeypatch.setattr(ece_fit_module, "all_reduce", collective)  # the ECE search's own pass
    monkeypatch.setattr(scan_module, "all_gather_rows", collective)
    torch.set_default_device("meta")
    try:
        [(sums, kept)] = scan.calibration([0.5], 15, keep_scores=True)
        assert {t.device for t in kept.values()} == {scan.device} and all(t.numel() == 0 for t in kept.values())
        stats = scan.per_sample(0.5)
        assert {t.device for t in stats.values()} == {scan.device} and stats["confidence"].numel() == 0
        assert scan.classwise(0.5, 15).count.sum() == 0 and sums.bin_count.sum() == 0
        temperature, ece, _ = minimise_ece(scan, 1.0, bins=15)  # sums of no rows, reduced with the other ranks'
        assert ece == 0 and 0.01 <= temperature <= 100
    finally:
        torch.set_default_device(None)
    assert len(seen) >= 5 and set(seen) == {scan.device}
