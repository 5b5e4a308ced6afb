"""MSP and energy (tempcal.scores, as workflows.ood.score_samples computes them) against float64 references."""

from __future__ import annotations

import numpy as np
from conftest import id_ood_logits
from reference import ref_energy, ref_msp

from tempcal.core.scan import Scan
from tempcal.workflows.ood import score_samples


def test_scores_match_float64_references():
    z_id, y, _ = id_ood_logits(n_id=200, c=9, seed=1)
    z = (z_id * 50).double()  # large magnitudes
    z[3, 2] = -float("inf")  # an impossible class
    taus = [0.3, 1.0, 7.5, 1000.0]
    got = score_samples(Scan(tempcal_data(z, y)), taus)
    for k, tau in enumerate(taus):
        np.testing.assert_allclose(got["msp"][k], ref_msp(z.numpy(), tau), rtol=1e-12, atol=0)
        np.testing.assert_allclose(got["energy"][k], ref_energy(z.numpy(), tau), rtol=1e-12, atol=0)
        assert got["msp"][k].dtype == np.float64


def tempcal_data(z, y):
    from tempcal.core.data import as_logits_data

    return as_logits_data(z, y)
