"""The scikit-learn-style TemperatureScaler and the deployment module, against scipy, torch and sklearn.

Every output is recomputed independently: T by scipy's bounded optimiser in float64,
probabilities by torch.softmax / scipy.special.expit in float64, scores by a numpy NLL.
"""

from __future__ import annotations

import doctest
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from reference import ece_loop, nll_at, optimal_temperature
from safetensors.torch import save_file
from scipy.special import expit
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import KFold, cross_val_score

import tempcal.scaler
from tempcal.core.fitting import T_MIN
from tempcal.errors import TempcalError
from tempcal.io.sidecar import write_sidecar
from tempcal.io.writeback import write_temperature
from tempcal.scaler import TemperatureScaler, TemperatureScaling

ROOT = Path(__file__).resolve().parent.parent


def overconfident(n: int = 800, c: int = 6, scale: float = 2.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, dtype=torch.float64, generator=g) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
    return (scale * z).float().numpy(), y.numpy()


def binary(n: int = 800, scale: float = 0.5, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, dtype=torch.float64, generator=g) * 2
    y = torch.bernoulli(torch.sigmoid(z), generator=g).long()
    return (scale * z).float().numpy(), y.numpy()


def test_docstring_examples_run():
    result = doctest.testmod(tempcal.scaler, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 10 and result.failed == 0


@pytest.mark.parametrize("as_torch", [False, True])
def test_fit_matches_scipys_optimum(as_torch):
    z, y = overconfident()
    expected = optimal_temperature(z, y)
    inputs = (torch.from_numpy(z), torch.from_numpy(y)) if as_torch else (z, y.tolist())
    scaler = TemperatureScaler().fit(*inputs)
    assert abs(scaler.temperature_ - expected) / expected < 1e-6
    assert scaler.converged_ and 2 <= scaler.n_passes_ <= 20
    assert scaler.n_features_in_ == 6 and list(scaler.classes_) == list(range(6))
    assert scaler.fit_result_.temperature == scaler.temperature_


@pytest.mark.parametrize("shape", ["[N]", "[N, 1]"])
def test_single_binary_logit(shape):
    z, y = binary()
    expected = optimal_temperature(z, y)  # the reference treats [N] as the two-class rows [0, z]
    logits = z if shape == "[N]" else z[:, None]
    scaler = TemperatureScaler().fit(logits, y)
    assert abs(scaler.temperature_ - expected) / expected < 1e-6
    assert scaler.n_features_in_ == 1 and list(scaler.classes_) == [0, 1]
    p = scaler.predict_proba(logits)
    p1 = expit(z.astype(np.float64) / scaler.temperature_)
    assert p.shape == (len(z), 2) and p.dtype == np.float64
    np.testing.assert_allclose(p[:, 1], p1, rtol=1e-12)
    np.testing.assert_allclose(p[:, 0], expit(-z.astype(np.float64) / scaler.temperature_), rtol=1e-12)
    assert np.array_equal(scaler.predict(logits), (z >= 0).astype(np.int64))
    assert scaler.transform(logits).shape == logits.shape


def test_predict_proba_against_float64_softmax():
    z, y = overconfident()
    scaler = TemperatureScaler().fit(z, y)
    t = scaler.temperature_
    expected = torch.softmax(torch.from_numpy(z).double() / t, dim=1).numpy()
    p = scaler.predict_proba(z)
    assert isinstance(p, np.ndarray) and p.dtype == np.float64 and p.shape == z.shape
    np.testing.assert_allclose(p, expected, rtol=1e-12, atol=0)
    p_torch = scaler.predict_proba(torch.from_numpy(z))
    assert isinstance(p_torch, torch.Tensor) and p_torch.dtype == torch.float32
    np.testing.assert_allclose(p_torch.numpy(), expected, rtol=1e-6, atol=1e-12)
    p64 = scaler.predict_proba(torch.from_numpy(z).double())
    assert p64.dtype == torch.float64
    np.testing.assert_allclose(p64.numpy(), expected, rtol=1e-12, atol=0)


def test_predict_proba_in_chunks_and_with_neginf(monkeypatch):
    z, y = overconfident(n=50)
    z[3, 2] = -np.inf  # impossible class: probability exactly 0
    scaler = TemperatureScaler().fit(z, y if z[np.arange(50), y].min() > -np.inf else (y + 1) % 6)
    monkeypatch.setattr(tempcal.scaler, "CHUNK_ELEMENTS", 7 * 6)  # 7 rows per chunk, a ragged last chunk
    p = scaler.predict_proba(z)
    expected = torch.softmax(torch.from_numpy(z).double() / scaler.temperature_, dim=1).numpy()
    np.testing.assert_allclose(p, expected, rtol=1e-12, atol=0)
    assert p[3, 2] == 0.0


def test_transform_keeps_the_float_dtype():
    z, y = overconfident()
    scaler = TemperatureScaler().fit(z, y)
    t = scaler.temperature_
    out = scaler.transform(z)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, z.astype(np.float64) / t, rtol=1e-6)
    half = torch.from_numpy(z).half()
    scaled = scaler.transform(half)
    assert scaled.dtype == torch.float16
    assert torch.equal(scaled, (half.float() / t).half())
    assert scaler.transform(np.array([[1, 2, 3, 4, 5, 6]])).dtype == np.float64


def test_predict_is_the_arg_max():
    z, y = overconfident()
    scaler = TemperatureScaler().fit(z, y)
    assert np.array_equal(scaler.predict(z), np.argmax(z, axis=1))
    assert torch.equal(scaler.predict(torch.from_numpy(z)), torch.from_numpy(np.argmax(z, axis=1)))


def test_score_is_minus_the_nll_at_t():
    z, y = overconfident()
    scaler = TemperatureScaler().fit(z, y)
    assert scaler.score(z, y) == pytest.approx(-nll_at(z, y, scaler.temperature_), rel=1e-9)
    assert scaler.score(z, y) > -nll_at(z, y, 1.0)  # the fit helps on its own data


def test_ece_objective():
    z, y = overconfident(n=400)
    nll_t = TemperatureScaler().fit(z, y).temperature_
    ece_t = TemperatureScaler(objective="ece", bins=10).fit(z, y).temperature_
    assert ece_loop(z, y, ece_t, bins=10)[0] <= ece_loop(z, y, nll_t, bins=10)[0] + 1e-12


@pytest.mark.parametrize("method", ["transform", "predict_proba", "predict"])
def test_not_fitted(method):
    z, _ = overconfident(n=10)
    with pytest.raises(NotFittedError):
        getattr(TemperatureScaler(), method)(z)
    with pytest.raises(NotFittedError):
        TemperatureScaler().score(z, np.zeros(10, np.int64))
    with pytest.raises(NotFittedError):
        TemperatureScaler().to_module()


def test_clone_get_set_params_and_pickle():
    z, y = overconfident()
    scaler = TemperatureScaler(bins=20).fit(z, y)
    assert scaler.get_params() == {"objective": "nll", "bins": 20, "device": "cpu"}
    copy = clone(scaler)
    assert copy.get_params() == scaler.get_params() and not hasattr(copy, "temperature_")
    assert copy.set_params(objective="ece") is copy and copy.objective == "ece"
    restored = pickle.loads(pickle.dumps(scaler))
    assert restored.temperature_ == scaler.temperature_
    np.testing.assert_array_equal(restored.predict_proba(z), scaler.predict_proba(z))


def test_cross_val_score_uses_clone_fit_and_score():
    z, y = overconfident(n=900)
    scores = cross_val_score(TemperatureScaler(), z, y, cv=KFold(3))
    expected = []
    for train, test in KFold(3).split(z):
        t = optimal_temperature(z[train], y[train])
        expected.append(-nll_at(z[test], y[test], t))
    np.testing.assert_allclose(scores, expected, rtol=1e-6)


@pytest.mark.parametrize("params", [{"objective": "mse"}, {"bins": 0}, {"bins": 2.5}, {"bins": True}])
def test_bad_params_are_reported_at_fit(params):
    z, y = overconfident(n=20)
    scaler = TemperatureScaler(**params)  # scikit-learn convention: __init__ stores, fit validates
    with pytest.raises(ValueError):
        scaler.fit(z, y)


def test_column_mismatch_is_a_one_line_error():
    z, y = overconfident(n=20)
    scaler = TemperatureScaler().fit(z, y)
    for bad in (z[:, :4], z[:, 0], z[None]):
        with pytest.raises(TempcalError) as exc:
            scaler.predict_proba(bad)
        assert "\n" not in str(exc.value) and "[N, 6]" in str(exc.value)
    with pytest.raises(TempcalError):
        TemperatureScaler().fit(*binary(n=20)).transform(z)


def test_bad_data_is_a_one_line_error():
    z, y = overconfident(n=20)
    z[4, 1] = np.nan
    with pytest.raises(TempcalError) as exc:
        TemperatureScaler().fit(z, y)
    assert "NaN" in str(exc.value) and "index 4" in str(exc.value)


def test_degenerate_fit_warns_and_sits_at_the_bound():
    z, _ = overconfident(n=40)
    with pytest.warns(UserWarning, match="lower bound"):
        scaler = TemperatureScaler().fit(z, np.argmax(z, axis=1))
    assert scaler.temperature_ == T_MIN and scaler.fit_result_.bound == "lower"


# -- the deployment module ---------------------------------------------------------------------------


def test_module_divides_by_t_in_the_input_dtype():
    module = TemperatureScaling(2.5)
    z = torch.randn(64, 10, dtype=torch.float64)
    assert torch.equal(module(z), z / torch.tensor(2.5, dtype=torch.float32).double())
    z32 = z.float()
    assert torch.allclose(module(z32), z32 / 2.5, rtol=1e-7, atol=0) and module(z32).dtype == torch.float32
    for low in (torch.float16, torch.bfloat16):
        zl = z.to(low)
        assert module(zl).dtype == low and torch.equal(module(zl), (zl.float() / 2.5).to(low))


def test_module_state_dict_and_repr():
    module = TemperatureScaling(1.75)
    state = module.state_dict()
    assert list(state) == ["temperature"] and float(state["temperature"]) == 1.75
    other = TemperatureScaling()
    other.load_state_dict(state)
    assert float(other.temperature) == 1.75 and "temperature=1.75" in repr(other)


@pytest.mark.parametrize("bad", [0.0, -2.0, float("nan"), float("inf")])
def test_module_refuses_bad_t(bad):
    with pytest.raises(TempcalError):
        TemperatureScaling(bad)


def test_module_exports_with_torch_export():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), TemperatureScaling(3.0))
    x = torch.randn(5, 4)
    exported = torch.export.export(model, (x,))
    assert torch.allclose(exported.module()(x), model[0](x) / 3.0, rtol=1e-6)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_module_scripts_with_torchscript(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), TemperatureScaling(3.0))
    scripted = torch.jit.script(model)
    scripted.save(str(tmp_path / "m.pt"))
    x = torch.randn(5, 4, dtype=torch.float32)
    assert torch.allclose(torch.jit.load(str(tmp_path / "m.pt"))(x), model[0](x) / 3.0, rtol=1e-6)


def test_scaler_to_module_agrees_with_transform():
    z, y = overconfident()
    scaler = TemperatureScaler().fit(z, y)
    module = scaler.to_module()
    zt = torch.from_numpy(z)
    assert torch.allclose(module(zt), scaler.transform(zt), rtol=1e-7, atol=0)


def test_from_file_reads_metadata_and_sidecars(tmp_path):
    z, y = overconfident(n=30)
    st = tmp_path / "val.safetensors"
    save_file({"logits": torch.from_numpy(z), "labels": torch.from_numpy(y)}, str(st))
    write_temperature(st, 2.125)
    assert float(TemperatureScaling.from_file(st).temperature) == 2.125
    npz = tmp_path / "val.npz"
    np.savez(npz, logits=z, labels=y)
    with pytest.raises(TempcalError) as exc:
        TemperatureScaling.from_file(npz)
    assert "no stored temperature" in str(exc.value) and "tempcal fit" in str(exc.value)
    write_sidecar(npz, 1.5)
    assert float(TemperatureScaling.from_file(npz).temperature) == 1.5
    np.savez(npz, logits=z * 2, labels=y)  # the file changed: the sidecar's T no longer applies
    with pytest.raises(TempcalError, match="changed"):
        TemperatureScaling.from_file(npz)


def test_readme_scaler_snippet_runs(tmp_path):
    """The README's TemperatureScaler example, once the README has one, runs as written."""
    readme = (ROOT / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```python")[1:]]
    snippets = [b for b in blocks if re.search(r"\bTemperatureScaler\(", b)]
    if not snippets:
        pytest.skip("README.md has no TemperatureScaler example yet")
    (tmp_path / "examples").mkdir()
    for example in (ROOT / "examples").glob("*.safetensors"):
        (tmp_path / "examples" / example.name).write_bytes(example.read_bytes())
    for snippet in snippets:
        done = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
