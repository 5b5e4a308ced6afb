"""fit_temperature (tempcal.core.fitting) against scipy's float64 optimum, on every kind of input allowed."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import logits_and_labels, miscalibrated, miscalibrated_binary
from hypothesis import given, settings
from reference import nll_at, optimal_temperature

import tempcal
from tempcal.core.fitting import T_MAX, T_MIN


def _with_neginf():
    z, y = miscalibrated(4000, 10, 2.5, seed=7)
    impossible = torch.rand(z.shape, generator=torch.Generator().manual_seed(1)) < 0.2
    impossible[torch.arange(len(y)), y] = False
    return z.masked_fill(impossible, -math.inf), y


def _weak_signal(n, c, seed):
    """Mostly random labels: a flat NLL with its optimum at a large T."""
    z, y = miscalibrated(n, c, 2.5, seed=seed)
    g = torch.Generator().manual_seed(seed)
    noise = torch.rand(n, generator=g) < 0.8
    return z, torch.where(noise, torch.randint(0, c, (n,), generator=g), y)


CASES = {
    "overconfident": lambda: miscalibrated(5000, 10, 3.0, seed=1),
    "underconfident": lambda: miscalibrated(5000, 10, 0.4, seed=2),
    "two-classes": lambda: miscalibrated(5000, 2, 2.0, seed=3),
    "1000-classes": lambda: miscalibrated(2000, 1000, 2.5, seed=4),
    "binary-single-logit": lambda: miscalibrated_binary(5000, 3.0, seed=5),
    "binary-[N,1]": lambda: (lambda z, y: (z[:, None], y))(*miscalibrated_binary(3000, 0.5, seed=6)),
    "float16": lambda: miscalibrated(5000, 10, 2.5, seed=8, dtype=torch.float16),
    "bfloat16": lambda: miscalibrated(5000, 10, 2.5, seed=9, dtype=torch.bfloat16),
    "float64": lambda: miscalibrated(5000, 10, 2.5, seed=10, dtype=torch.float64),
    "magnitude-1e4": lambda: miscalibrated(5000, 10, 2000.0, seed=11),
    "neginf-entries": _with_neginf,
    # Over 256K logits and 1,000 rows: reduced in float32.
    "float32-reductions": lambda: miscalibrated(30000, 20, 2.5, seed=13),
    "float32-weak-signal": lambda: _weak_signal(12000, 30, seed=14),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fit_reaches_the_float64_optimum(name):
    logits, labels = CASES[name]()
    expected = optimal_temperature(logits, labels)
    result = tempcal.fit_temperature(logits, labels, device="cpu")
    assert result.converged
    assert result.bound is None
    assert abs(result.temperature - expected) / expected < 1e-6, (result.temperature, expected)
    assert 1 <= result.passes <= 3
    z = logits.double().numpy()
    assert result.nll == pytest.approx(nll_at(z, labels.numpy(), result.temperature), rel=1e-5)


@pytest.mark.parametrize("rows", [97, pytest.param(7, marks=pytest.mark.slow)])  # 7: 429 chunks a pass, 16 s
def test_small_chunks_give_the_same_temperature(rows):
    logits, labels = miscalibrated(3000, 10, 2.0, seed=12)
    whole = tempcal.fit_temperature(logits, labels, device="cpu")
    chunked = tempcal.fit_temperature(logits, labels, device="cpu", chunk_rows=rows)
    assert abs(whole.temperature - chunked.temperature) / whole.temperature < 1e-6


def test_every_sample_correct_goes_to_the_lower_bound_with_a_warning():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 5, generator=g)
    labels = logits.argmax(1)
    result = tempcal.fit_temperature(logits, labels, device="cpu")
    assert result.temperature == T_MIN and result.bound == "lower"
    assert any("lower bound" in w for w in result.warnings)
    assert math.isfinite(result.nll)


def test_logits_that_predict_nothing_go_to_the_upper_bound_with_a_warning():
    # The true class always holds the smallest logit: every finite T is worse than uniform.
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(300, 4, generator=g)
    labels = logits.argmin(1)
    result = tempcal.fit_temperature(logits, labels, device="cpu")
    assert result.temperature == T_MAX and result.bound == "upper"
    assert any("upper bound" in w for w in result.warnings)


def test_a_single_label_class_warns():
    logits, _ = miscalibrated(500, 3, 2.0, seed=3)
    logits[:, 0] += 1.0  # informative about the one class present, but not always right
    labels = torch.zeros(500, dtype=torch.long)
    result = tempcal.fit_temperature(logits, labels, device="cpu")
    assert any("one class" in w for w in result.warnings)
    assert math.isfinite(result.temperature) and result.temperature > 0
    expected = optimal_temperature(logits, labels)
    assert abs(result.temperature - expected) / expected < 1e-6


def test_fewer_than_two_samples_is_bad_input():
    with pytest.raises(tempcal.DataError, match="at least 2"):
        tempcal.fit_temperature(torch.randn(1, 3), torch.tensor([0]), device="cpu")


def test_nll_at_fitted_t_is_a_minimum():
    logits, labels = miscalibrated(3000, 20, 1.7, seed=13)
    t = tempcal.fit_temperature(logits, labels, device="cpu").temperature
    z, y = logits.double().numpy(), labels.numpy()
    best = nll_at(z, y, t)
    assert best <= nll_at(z, y, 1.0)
    assert best <= nll_at(z, y, t * (1 + 1e-3)) and best <= nll_at(z, y, t * (1 - 1e-3))


def test_probabilities_input():
    logits, labels = miscalibrated(2000, 6, 2.0, seed=14, dtype=torch.float64)
    probs = torch.softmax(logits, 1)
    from_probs = tempcal.fit_temperature(probs, labels, device="cpu", probs=True)
    from_logits = tempcal.fit_temperature(logits, labels, device="cpu")
    assert from_probs.temperature == pytest.approx(from_logits.temperature, rel=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    logits, labels = miscalibrated(5000, 100, 2.5, seed=15)
    cpu = tempcal.fit_temperature(logits, labels, device="cpu").temperature
    cuda = tempcal.fit_temperature(logits, labels, device="cuda").temperature
    assert abs(cpu - cuda) / cpu < 1e-6


def test_a_fit_does_not_import_torch_dynamo_and_leaves_torch_as_it_was():
    """Building torch.optim.LBFGS imports torch._dynamo (seconds); the fit avoids it without changing torch."""
    import subprocess
    import sys

    code = ("import sys, torch, tempcal\n"
            "from tempcal.core.fitting import _DYNAMO_MARKER\n"
            "r = tempcal.fit_temperature(torch.randn(500, 5) * 3, torch.randint(0, 5, (500,)), device='cpu')\n"
            "assert r.converged\n"
            "assert 'torch._dynamo' not in sys.modules, 'imported'\n"
            "assert not hasattr(torch.optim.Optimizer.add_param_group.__wrapped__, _DYNAMO_MARKER)\n"
            "torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)\n"
            "assert 'torch._dynamo' in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_closed_bracket_is_accepted_without_another_pass():
    """The secant's error, bounded with a third point, ends the search one pass earlier than landing on it would."""
    logits, labels = miscalibrated(5000, 10, 3.0, seed=1)
    result = tempcal.fit_temperature(logits, labels, device="cpu")
    expected = optimal_temperature(logits, labels)
    assert abs(result.temperature - expected) / expected < 1e-7
    assert result.passes <= 7


@settings(max_examples=30, deadline=None)
@given(logits_and_labels())
def test_fitted_temperature_is_a_minimum(data):
    logits, labels = data
    result = tempcal.fit_temperature(logits, labels, device="cpu")
    t = result.temperature
    at = tempcal.calibration_metrics(logits, labels, t, device="cpu").nll
    assert at <= tempcal.calibration_metrics(logits, labels, 1.0, device="cpu").nll + 1e-12
    if result.bound is None:
        for factor in (1 - 1e-3, 1 + 1e-3):
            assert at <= tempcal.calibration_metrics(logits, labels, t * factor, device="cpu").nll + 1e-12


def test_logits_without_information_are_refused_and_ties_are_no_top():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 5, (300,), generator=g)
    with pytest.raises(tempcal.DataError, match=r"carry no information: every one of the 300 fitting rows .* "
                       r"ln 5 = 1\.6094 at every T"):
        tempcal.fit_temperature(torch.zeros(300, 5), labels, device="cpu", probs=False)
    constant = torch.full((300, 5), 7.25).masked_fill(torch.arange(5) == 4, -math.inf)  # equal over finite classes
    with pytest.raises(tempcal.DataError, match="carry no information"):
        tempcal.fit_temperature(constant, labels.clamp_max(3), device="cpu")
    ties = torch.zeros(300, 5)
    ties[torch.arange(300), labels] = 1.0
    ties[torch.arange(300), (labels + 1) % 5] = 1.0  # the true class shares the top with one other class
    result = tempcal.fit_temperature(ties * 3, labels, device="cpu")
    assert result.temperature == T_MIN and "300 of the 300 share the largest logit" in result.warnings[0]
    assert result.nll == pytest.approx(nll_at(ties.numpy() * 3, labels.numpy(), T_MIN), rel=1e-6)
