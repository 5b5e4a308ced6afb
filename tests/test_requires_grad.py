"""Tensors that require grad (a notebook's model outputs) through every public function that takes logits or scores.

Each result must equal the one from the same values without grad; the caller's tensor is left as it was. Where
dividing by T is the point (``TemperatureScaler.transform``, ``TemperatureScaling``), gradients still flow.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

import tempcal
from tempcal.core.data import LogitsData


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    base = torch.randn(400, 5, generator=g, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(base, 1), 1, generator=g)[:, 0]
    return (3 * base).to(torch.float32), labels


def graded(z: torch.Tensor) -> torch.Tensor:
    """A non-leaf tensor that requires grad, as a model's output is."""
    return z.clone().requires_grad_() * 1.0


def scipy_temperature(z: torch.Tensor, y: torch.Tensor) -> float:
    """T by scipy's bounded optimiser in float64 (independent of tempcal's fit)."""
    z64, rows = z.double().numpy(), np.arange(len(y))
    nll = lambda t: -log_softmax(z64 / t, axis=1)[rows, y.numpy()].mean()  # noqa: E731
    return float(minimize_scalar(nll, bounds=(0.05, 50), method="bounded", options={"xatol": 1e-10}).x)


def test_fit_temperature_takes_logits_that_require_grad(data):
    z, y = data
    with_grad = graded(z)
    result = tempcal.fit_temperature(with_grad, y, device="cpu")
    assert result.temperature == tempcal.fit_temperature(z, y, device="cpu").temperature
    assert result.temperature == pytest.approx(scipy_temperature(z, y), rel=1e-6)
    assert with_grad.requires_grad and with_grad.grad_fn is not None  # the caller's tensor is untouched
    groups = torch.arange(len(y)) % 3
    assert (tempcal.fit_temperature(graded(z), y, groups=groups, device="cpu").group_temperatures
            == tempcal.fit_temperature(z, y, groups=groups, device="cpu").group_temperatures)
    assert (tempcal.fit_temperature(graded(z), y, folds=3, device="cpu").fold_temperatures
            == tempcal.fit_temperature(z, y, folds=3, device="cpu").fold_temperatures)
    p = torch.softmax(z.double(), 1)
    assert (tempcal.fit_temperature(graded(p), y, probs=True, device="cpu").temperature
            == tempcal.fit_temperature(p, y, probs=True, device="cpu").temperature)
    assert (tempcal.fit_temperature(graded(z[:, 0]), (y > 1).long(), device="cpu").temperature
            == tempcal.fit_temperature(z[:, 0], (y > 1).long(), device="cpu").temperature)


def test_data_scan_and_metrics_take_logits_that_require_grad(data):
    z, y = data
    assert not tempcal.as_logits_data(graded(z), y).logits.requires_grad
    assert not LogitsData(graded(z), y).logits.requires_grad
    scan = tempcal.Scan(LogitsData(graded(z), y), device="cpu")
    assert tempcal.fit_temperature(scan).temperature == tempcal.fit_temperature(z, y, device="cpu").temperature
    plain = tempcal.calibration_metrics(z, y, 2.0, device="cpu")
    assert tempcal.calibration_metrics(graded(z), y, 2.0, device="cpu") == plain
    assert tempcal.evaluate(tempcal.Scan(tempcal.as_logits_data(graded(z), y), device="cpu"), 2.0) == plain
    assert tempcal.evaluate_many(tempcal.Scan(tempcal.as_logits_data(graded(z), y), device="cpu"), [2.0]) == [plain]
    ours = tempcal.score_samples(tempcal.Scan(tempcal.as_logits_data(graded(z), y), device="cpu"), [2.0])
    theirs = tempcal.score_samples(tempcal.Scan(tempcal.as_logits_data(z, y), device="cpu"), [2.0])
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_array_equal(ours[name][0], theirs[name][0])


def test_per_sample_metrics_take_scores_that_require_grad(data):
    z, y = data
    confidence = torch.softmax(z, 1).max(1).values
    correct = z.argmax(1) == y
    with_grad = torch.softmax(graded(z), 1).max(1).values
    for function in (tempcal.ece_equal_mass, tempcal.rms_calibration_error, tempcal.debiased_l2_calibration_error):
        assert function(with_grad, correct) == function(confidence, correct), function.__name__
    nll = -torch.log(confidence)
    assert (tempcal.bootstrap_intervals(with_grad, correct, -torch.log(with_grad), 20, 0)
            == tempcal.bootstrap_intervals(confidence, correct, nll, 20, 0))
    id_scores, ood_scores = confidence[:200], confidence[200:]
    assert (tempcal.detection_metrics(with_grad[:200], with_grad[200:])
            == tempcal.detection_metrics(id_scores, ood_scores))
    assert tempcal.fpr_at_recall(with_grad[:200], with_grad[200:]) == tempcal.fpr_at_recall(id_scores, ood_scores)


def test_scaler_takes_logits_that_require_grad_and_keeps_the_graph_of_its_division(data):
    z, y = data
    plain = tempcal.TemperatureScaler().fit(z, y)
    scaler = tempcal.TemperatureScaler().fit(graded(z), y)
    t = scaler.temperature_
    assert t == plain.temperature_
    assert scaler.score(graded(z), y) == plain.score(z, y)
    assert torch.equal(scaler.predict(graded(z)), plain.predict(z))
    assert torch.equal(tempcal.TemperatureScaler().fit_transform(graded(z), y).detach(), plain.transform(z))
    groups = np.arange(len(y)) % 2
    assert (tempcal.TemperatureScaler().fit(graded(z), y, groups=groups).group_temperatures_
            == tempcal.TemperatureScaler().fit(z, y, groups=groups).group_temperatures_)
    # transform and predict_proba are differentiable in X: d(sum(X / T))/dX = 1 / T
    x = z.clone().requires_grad_()
    scaled = scaler.transform(x)
    assert torch.equal(scaled.detach(), plain.transform(z))
    (grad,) = torch.autograd.grad(scaled.sum(), x)
    torch.testing.assert_close(grad, torch.full_like(z, 1 / t))
    x = z.clone().requires_grad_()
    proba = scaler.predict_proba(x)
    assert torch.equal(proba.detach(), plain.predict_proba(z))
    (grad,) = torch.autograd.grad(proba[:, 0].sum(), x)
    p = torch.softmax(z.double() / t, 1)
    expected = (p[:, :1] * ((torch.arange(5) == 0).double() - p) / t).float()  # d p_0 / d z_j
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-7)


def test_temperature_scaling_module_passes_gradients_to_its_input(data):
    z, _ = data
    module = tempcal.TemperatureScaling(2.5)
    x = z.clone().requires_grad_()
    out = module(x)
    assert torch.equal(out.detach(), z / 2.5)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(z, 1 / 2.5))
    assert not module.temperature.requires_grad  # T is fitted by tempcal, not trained
