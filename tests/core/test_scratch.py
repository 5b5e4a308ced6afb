"""The buffers a finished fit hands to the next scan of the process: reused, never shared, bounded."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

import tempcal
from tempcal.core import parallel
from tempcal.core.data import as_logits_data
from tempcal.core.parallel import Scratch
from tempcal.core.scan import ALL_ROWS, Scan


@pytest.fixture(autouse=True)
def _no_spare():
    """Each test starts and ends with no buffers kept."""
    parallel._spare.clear()
    yield
    parallel._spare.clear()


def _data(seed: int, n: int = 3000, c: int = 40, scale: float = 2.5):
    generator = torch.Generator().manual_seed(seed)
    y = torch.randint(0, c, (n,), generator=generator)
    z = torch.randn(n, c, generator=generator) * scale
    z[torch.arange(n), y] += 1.5
    return z, y


def _scipy_t(z: torch.Tensor, y: torch.Tensor) -> float:
    """T at the minimum NLL by scipy's bounded optimiser in float64."""
    zz, yy = z.double().numpy(), y.numpy()

    def nll(log_t: float) -> float:
        return float(-log_softmax(zz / np.exp(log_t), axis=1)[np.arange(len(yy)), yy].mean())

    return float(np.exp(minimize_scalar(nll, bounds=(-4, 4), method="bounded", options={"xatol": 1e-10}).x))


def test_a_fit_gives_its_buffers_to_the_next_and_both_are_exact():
    z1, y1 = _data(1)
    z2, y2 = _data(2, n=2000, c=60)
    first = tempcal.fit_temperature(z1, y1, device="cpu").temperature
    kept = list(parallel._spare)
    assert kept, "the fit kept no buffers for the next one"
    assert sum(s.nbytes() for s in kept) <= parallel.SPARE_BYTES
    second = tempcal.fit_temperature(z2, y2, device="cpu").temperature  # on the first fit's buffers
    assert first == pytest.approx(_scipy_t(z1, y1), rel=1e-6)
    assert second == pytest.approx(_scipy_t(z2, y2), rel=1e-6)
    parallel._spare.clear()
    assert tempcal.fit_temperature(z2, y2, device="cpu").temperature == second  # fresh buffers: the same bits


def test_a_scan_the_caller_owns_keeps_its_buffers():
    z, y = _data(3)
    scan = Scan(as_logits_data(z, y), device="cpu", fit_rows=ALL_ROWS)
    mine = scan.scratch
    tempcal.fit_temperature(scan)
    assert scan.scratch is mine and not parallel._spare
    assert scan.objective(0.5).nll > 0  # still usable


def test_borrowed_buffers_are_never_shared_by_two_scans():
    Scratch.give_back([Scratch()])
    a, b = Scratch.borrow(), Scratch.borrow()
    assert a is not b and not parallel._spare


def test_buffers_beyond_the_limit_are_dropped():
    big = Scratch()
    big.get("x", (parallel.SPARE_BYTES // 4 + 1,), torch.float32, torch.device("cpu"))
    small = Scratch()
    small.get("x", (1000,), torch.float32, torch.device("cpu"))
    Scratch.give_back([big, small])
    assert parallel._spare == [small]


def test_fits_in_several_threads_at_once_match_one_at_a_time():
    sets = [_data(10 + i) for i in range(6)]
    alone = [tempcal.fit_temperature(z, y, device="cpu").temperature for z, y in sets]
    together: list[float | None] = [None] * len(sets)

    def run(i: int) -> None:
        for _ in range(3):
            together[i] = tempcal.fit_temperature(*sets[i], device="cpu").temperature

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(sets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone
