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
import warnings

import numpy as np
import pytest
import scipy.sparse
import sklearn
import torch
from conftest import ROOT, miscalibrated, miscalibrated_binary
from reference import ece_loop, nll_at, optimal_temperature, probabilities
from safetensors.torch import save_file
from scipy.special import expit
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import KFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import parametrize_with_checks

import tempcal
import tempcal.scaler
from tempcal.core.fitting import T_MIN
from tempcal.errors import TempcalError
from tempcal.io.safetensors_header import write_temperature
from tempcal.io.sidecar import write_sidecar
from tempcal.scaler import TemperatureScaler, TemperatureScaling

SKLEARN_VERSION = tuple(int(part) for part in sklearn.__version__.split(".")[:2])


def miscalibrated_arrays(n: int = 800, c: int = 6, scale: float = 2.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """:func:`miscalibrated` logits and labels as numpy arrays (float32, int64)."""
    z, y = miscalibrated(n, c, scale, seed=seed)
    return z.numpy(), y.numpy()


def binary_arrays(n: int = 800, scale: float = 0.5, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """:func:`miscalibrated_binary` logits ([N]) and labels as numpy arrays (float32, int64)."""
    z, y = miscalibrated_binary(n, scale, seed=seed)
    return z.numpy(), y.numpy()


def test_docstring_examples_run():
    result = doctest.testmod(tempcal.scaler, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 10 and result.failed == 0


@pytest.mark.parametrize("as_torch", [False, True])
def test_fit_matches_scipys_optimum(as_torch):
    z, y = miscalibrated_arrays()
    expected = optimal_temperature(z, y)
    inputs = (torch.from_numpy(z), torch.from_numpy(y)) if as_torch else (z, y.tolist())
    scaler = TemperatureScaler().fit(*inputs)
    assert abs(scaler.temperature_ - expected) / expected < 1e-6
    assert scaler.converged_ and 1 <= scaler.n_passes_ <= 3
    assert scaler.n_features_in_ == 6 and list(scaler.classes_) == list(range(6))
    assert scaler.fit_result_.temperature == scaler.temperature_


@pytest.mark.parametrize("shape", ["[N]", "[N, 1]"])
def test_single_binary_logit(shape):
    z, y = binary_arrays()
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
    z, y = miscalibrated_arrays()
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
    z, y = miscalibrated_arrays(n=50)
    z[3, 2] = -np.inf  # impossible class: probability exactly 0
    scaler = TemperatureScaler().fit(z, y if z[np.arange(50), y].min() > -np.inf else (y + 1) % 6)
    monkeypatch.setattr(tempcal.scaler, "CHUNK_ELEMENTS", 7 * 6)  # 7 rows per chunk, a ragged last chunk
    p = scaler.predict_proba(z)
    expected = torch.softmax(torch.from_numpy(z).double() / scaler.temperature_, dim=1).numpy()
    np.testing.assert_allclose(p, expected, rtol=1e-12, atol=0)
    assert p[3, 2] == 0.0


def test_transform_keeps_the_float_dtype():
    z, y = miscalibrated_arrays()
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
    z, y = miscalibrated_arrays()
    scaler = TemperatureScaler().fit(z, y)
    assert np.array_equal(scaler.predict(z), np.argmax(z, axis=1))
    assert torch.equal(scaler.predict(torch.from_numpy(z)), torch.from_numpy(np.argmax(z, axis=1)))


def test_score_is_minus_the_nll_at_t():
    z, y = miscalibrated_arrays()
    scaler = TemperatureScaler().fit(z, y)
    assert scaler.score(z, y) == pytest.approx(-nll_at(z, y, scaler.temperature_), rel=1e-9)
    assert scaler.score(z, y) > -nll_at(z, y, 1.0)  # the fit helps on its own data


def test_ece_objective():
    z, y = miscalibrated_arrays(n=400)
    nll_t = TemperatureScaler().fit(z, y).temperature_
    ece_t = TemperatureScaler(objective="ece", bins=10).fit(z, y).temperature_
    assert ece_loop(z, y, ece_t, bins=10)[0] <= ece_loop(z, y, nll_t, bins=10)[0] + 1e-12


@pytest.mark.parametrize("method", ["transform", "predict_proba", "predict"])
def test_not_fitted(method):
    z, _ = miscalibrated_arrays(n=10)
    with pytest.raises(NotFittedError):
        getattr(TemperatureScaler(), method)(z)
    with pytest.raises(NotFittedError):
        TemperatureScaler().score(z, np.zeros(10, np.int64))
    with pytest.raises(NotFittedError):
        TemperatureScaler().to_module()


def test_clone_get_set_params_and_pickle():
    z, y = miscalibrated_arrays()
    scaler = TemperatureScaler(bins=20).fit(z, y)
    assert scaler.get_params() == {"objective": "nll", "bins": 20, "device": "cpu", "probs": None, "group_prior": None}
    copy = clone(scaler)
    assert copy.get_params() == scaler.get_params() and not hasattr(copy, "temperature_")
    assert copy.set_params(objective="ece") is copy and copy.objective == "ece"
    restored = pickle.loads(pickle.dumps(scaler))
    assert restored.temperature_ == scaler.temperature_
    np.testing.assert_array_equal(restored.predict_proba(z), scaler.predict_proba(z))


def test_cross_val_score_uses_clone_fit_and_score():
    z, y = miscalibrated_arrays(n=900)
    scores = cross_val_score(TemperatureScaler(), z, y, cv=KFold(3))
    expected = []
    for train, test in KFold(3).split(z):
        t = optimal_temperature(z[train], y[train])
        expected.append(-nll_at(z[test], y[test], t))
    np.testing.assert_allclose(scores, expected, rtol=1e-6)


@pytest.mark.parametrize("params", [{"objective": "mse"}, {"bins": 0}, {"bins": 2.5}, {"bins": True}])
def test_bad_params_are_reported_at_fit(params):
    z, y = miscalibrated_arrays(n=20)
    scaler = TemperatureScaler(**params)  # scikit-learn convention: __init__ stores, fit validates
    with pytest.raises(ValueError):
        scaler.fit(z, y)


def test_column_mismatch_gives_scikit_learns_messages():
    z, y = miscalibrated_arrays(n=20)
    scaler = TemperatureScaler().fit(z, y)
    for bad in (z[:, :4], torch.from_numpy(z[:, :4])):
        with pytest.raises(ValueError, match="X has 4 features, but TemperatureScaler is expecting 6 features"):
            scaler.predict_proba(bad)
    for bad in (z[:, 0], torch.from_numpy(z[:, 0])):  # one binary logit, but the fit had 6 columns
        with pytest.raises(ValueError, match="Reshape your data"):
            scaler.transform(bad)
    with pytest.raises(ValueError, match="dim 3"):
        scaler.predict(z[None])
    with pytest.raises(ValueError, match="X has 6 features, but TemperatureScaler is expecting 1 features"):
        TemperatureScaler().fit(*binary_arrays(n=20)).transform(z)


def test_bad_data_is_a_one_line_error():
    z, y = miscalibrated_arrays(n=20)
    z[4, 1] = np.nan
    with pytest.raises(TempcalError) as exc:
        TemperatureScaler().fit(z, y)
    assert "NaN" in str(exc.value) and "index 4" in str(exc.value)


def test_degenerate_fit_warns_and_sits_at_the_bound():
    z, _ = miscalibrated_arrays(n=40)
    with pytest.warns(UserWarning, match="lower bound"):
        scaler = TemperatureScaler().fit(z, np.argmax(z, axis=1))
    assert scaler.temperature_ == T_MIN and scaler.fit_result_.bound == "lower"


def test_nan_and_posinf_are_refused_and_neginf_is_allowed():
    z, y = miscalibrated_arrays(n=20)
    scaler = TemperatureScaler().fit(z, y)
    for value, name in ((np.nan, "NaN"), (np.inf, "inf")):
        bad = z.copy()
        bad[7, 2] = value
        for method in ("transform", "predict", "predict_proba"):
            for x in (bad, torch.from_numpy(bad)):
                with pytest.raises(ValueError, match=name) as exc:
                    getattr(scaler, method)(x)
                assert "row 7" in str(exc.value)
        with pytest.raises(ValueError, match=name):
            TemperatureScaler().fit(bad, y)
    padded = z.copy()
    padded[:, 5] = -np.inf  # a padded choice: an impossible class in every row
    labels = np.where(y == 5, 0, y)
    fitted = TemperatureScaler().fit(padded, labels)
    assert abs(fitted.temperature_ - optimal_temperature(padded[:, :5], labels)) < 1e-6 * fitted.temperature_
    assert np.all(fitted.predict_proba(padded)[:, 5] == 0) and np.all(np.isneginf(fitted.transform(padded)[:, 5]))


def test_other_bad_input_gets_scikit_learns_messages():
    z, y = miscalibrated_arrays(n=20)
    with pytest.raises(ValueError, match="requires y to be passed"):
        TemperatureScaler().fit(z, None)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        TemperatureScaler().fit(z, y[:-1])
    with pytest.raises(ValueError, match=r"0 sample\(s\)"):
        TemperatureScaler().fit(z[:0], y[:0])
    with pytest.raises(ValueError, match=r"1 sample\(s\)"):
        TemperatureScaler().fit(z[:1], y[:1])
    with pytest.raises(ValueError, match="Unknown label type"):
        TemperatureScaler().fit(z, y + 0.5)
    with pytest.raises(TypeError, match=r"[Ss]parse"):
        TemperatureScaler().fit(scipy.sparse.csr_matrix(z), y)
    with pytest.raises(ValueError, match="Complex data not supported"):
        TemperatureScaler().fit(torch.from_numpy(z) * 1j, y)
    scaler = TemperatureScaler().fit(z, y)
    with pytest.raises(TempcalError, match="not in classes_; first: 6 at index 3"):
        scaler.score(z, np.where(np.arange(20) == 3, 6, y))


def test_string_labels_become_classes():
    z, y = miscalibrated_arrays()
    names = np.array(["ant", "bee", "cat", "dog", "eel", "fox"])  # sorted: column j is names[j]
    expected = optimal_temperature(z, y)
    for labels in (names[y], names[y].astype(object), names[y].tolist()):
        scaler = TemperatureScaler().fit(z, labels)
        assert abs(scaler.temperature_ - expected) / expected < 1e-6
        assert list(scaler.classes_) == list(names)
        assert np.array_equal(scaler.predict(z), names[np.argmax(z, axis=1)])
        assert scaler.score(z, labels) == pytest.approx(-nll_at(z, y, scaler.temperature_), rel=1e-9)
    np.testing.assert_allclose(scaler.predict_proba(z), probabilities(z, scaler.temperature_), rtol=1e-12)
    predicted = scaler.predict(torch.from_numpy(z))  # torch has no strings: the labels come back as numpy
    assert isinstance(predicted, np.ndarray) and np.array_equal(predicted, names[np.argmax(z, axis=1)])
    with pytest.raises(TempcalError, match="not in classes_; first: 'gnu'"):
        scaler.score(z[:3], ["ant", "gnu", "cat"])


def test_string_labels_of_one_binary_logit():
    z, y = binary_arrays()
    labels = np.where(y == 1, "spam", "ham")  # classes_ ["ham", "spam"]: the logit is that of "spam"
    scaler = TemperatureScaler().fit(z, labels)
    assert list(scaler.classes_) == ["ham", "spam"]
    assert abs(scaler.temperature_ - optimal_temperature(z, y)) / scaler.temperature_ < 1e-6
    assert np.array_equal(scaler.predict(z), np.where(z >= 0, "spam", "ham"))
    np.testing.assert_allclose(scaler.predict_proba(z)[:, 1], expit(z.astype(np.float64) / scaler.temperature_),
                               rtol=1e-12)


@pytest.mark.parametrize("values", [[3, 10, 11, 20, 42, 99], [-5, -1, 0, 2, 4, 7]])
def test_non_contiguous_integer_labels(values):
    z, y = miscalibrated_arrays()
    values = np.array(values, dtype=np.int32)
    scaler = TemperatureScaler().fit(z, values[y])
    assert abs(scaler.temperature_ - optimal_temperature(z, y)) / scaler.temperature_ < 1e-6
    assert scaler.classes_.dtype == np.int32 and list(scaler.classes_) == list(values)
    assert np.array_equal(scaler.predict(z), values[np.argmax(z, axis=1)])
    predicted = scaler.predict(torch.from_numpy(z))
    assert isinstance(predicted, torch.Tensor) and predicted.dtype == torch.int32
    assert torch.equal(predicted, torch.from_numpy(values[np.argmax(z, axis=1)]))
    assert scaler.score(z, values[y]) == pytest.approx(-nll_at(z, y, scaler.temperature_), rel=1e-9)
    with pytest.raises(TempcalError, match="not in classes_"):
        scaler.score(z, y)  # column indices are not this scaler's labels


def test_minus_one_and_one_for_one_binary_logit():
    z, y = binary_arrays()
    scaler = TemperatureScaler().fit(z[:, None], 2 * y - 1)
    assert list(scaler.classes_) == [-1, 1]
    assert abs(scaler.temperature_ - optimal_temperature(z, y)) / scaler.temperature_ < 1e-6
    assert np.array_equal(scaler.predict(z[:, None]), np.where(z >= 0, 1, -1))


def test_absent_classes_keep_one_class_per_column():
    z, y = miscalibrated_arrays(n=1200)
    keep = (y != 2) & (y != 5)  # a validation set without classes 2 and 5
    zk, yk = z[keep], y[keep]
    scaler = TemperatureScaler().fit(zk, yk)
    assert list(scaler.classes_) == list(range(6))
    assert abs(scaler.temperature_ - optimal_temperature(zk, yk)) / scaler.temperature_ < 1e-6
    assert scaler.predict_proba(z).shape == (1200, 6)
    assert np.array_equal(scaler.predict(z), np.argmax(z, axis=1))  # absent classes are still predicted
    assert scaler.score(zk, yk) == pytest.approx(-nll_at(zk, yk, scaler.temperature_), rel=1e-9)
    floats = TemperatureScaler().fit(zk, yk.astype(np.float64))  # whole numbers in any numeric dtype index columns
    assert floats.classes_.dtype == np.float64 and list(floats.classes_) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert floats.temperature_ == scaler.temperature_
    names = np.array(list("abcdef"))
    with pytest.raises(TempcalError, match="which column belongs to which class is unknown"):
        TemperatureScaler().fit(zk, names[yk])  # 4 names for 6 columns: ambiguous


def test_the_label_rule_on_small_integers():
    z, y = miscalibrated_arrays(c=3)
    sorted_labels = TemperatureScaler().fit(z, y + 1)  # {1, 2, 3} over 3 columns: 3 is no column, so sorted
    assert list(sorted_labels.classes_) == [1, 2, 3]
    assert sorted_labels.temperature_ == pytest.approx(optimal_temperature(z, y), rel=1e-6)
    keep = y != 0
    indices = TemperatureScaler().fit(z[keep], y[keep])  # {1, 2} over 3 columns: column indices 1 and 2
    assert list(indices.classes_) == [0, 1, 2]
    assert indices.temperature_ == pytest.approx(optimal_temperature(z[keep], y[keep]), rel=1e-6)
    wide_labels = np.array([0, 1, 2, 127], dtype=np.int8)
    top = np.zeros((4, 300))
    top[np.arange(4), wide_labels] = 5.0
    with pytest.warns(UserWarning, match="bound"):  # every true class strictly largest: a degenerate fit
        wide = TemperatureScaler().fit(top, wide_labels)
    assert wide.classes_.dtype.kind == "i" and wide.classes_[-1] == 299  # y's signed ints, widened to hold 299
    with pytest.raises(TempcalError, match=r"y has 4 classes, but X has 3 feature\(s\)"):
        TemperatureScaler().fit(z, np.arange(len(y)) % 4 + 7)
    with pytest.raises(TempcalError, match=r"X has 1 feature\(s\) \(one binary logit\)"):
        TemperatureScaler().fit(z[:, 0], y)


def test_read_only_memory_mapped_input(tmp_path):
    z, y = miscalibrated_arrays()
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    zm, ym = np.load(tmp_path / "z.npy", mmap_mode="r"), np.load(tmp_path / "y.npy", mmap_mode="r")
    assert not zm.flags.writeable and not ym.flags.writeable
    in_memory = TemperatureScaler().fit(z, y)
    scaler = TemperatureScaler().fit(zm, ym)
    assert scaler.temperature_ == in_memory.temperature_
    np.testing.assert_array_equal(scaler.transform(zm), in_memory.transform(z))
    np.testing.assert_array_equal(scaler.predict_proba(zm), in_memory.predict_proba(z))
    np.testing.assert_array_equal(scaler.predict(zm), in_memory.predict(z))
    assert scaler.score(zm, ym) == in_memory.score(z, y)
    np.testing.assert_array_equal(np.load(tmp_path / "z.npy"), z)
    # torch warns once per process about memory it cannot write: a fresh interpreter shows that none escapes
    script = ("import sys, numpy as np; from tempcal.scaler import TemperatureScaler; "
              "z, y = (np.load(sys.argv[1] + name, mmap_mode='r') for name in ('/z.npy', '/y.npy')); "
              "s = TemperatureScaler().fit(z, y); s.transform(z); s.predict(z); s.predict_proba(z); s.score(z, y)")
    done = subprocess.run([sys.executable, "-W", "error", "-c", script, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_torch_in_torch_out_on_the_same_device(device):
    z, y = miscalibrated_arrays()
    zt, yt = torch.from_numpy(z).to(device), torch.from_numpy(y).to(device)
    scaler = TemperatureScaler(device=device).fit(zt, yt)
    assert abs(scaler.temperature_ - optimal_temperature(z, y)) / scaler.temperature_ < 1e-6
    t = scaler.temperature_
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        x = zt.to(dtype)
        scaled = scaler.transform(x)
        assert isinstance(scaled, torch.Tensor) and scaled.device == x.device and scaled.dtype == dtype
        assert torch.equal(scaled, (x.to(torch.promote_types(dtype, torch.float32)) / t).to(dtype))
        p = scaler.predict_proba(x)
        assert p.device == x.device and p.dtype == torch.promote_types(dtype, torch.float32)
        predicted = scaler.predict(x)
        assert predicted.device == x.device and predicted.dtype == torch.int64
        assert torch.equal(predicted, torch.argmax(x, dim=1))
    assert scaler.score(zt, yt) == pytest.approx(-nll_at(z, y, t), rel=1e-9)
    half = TemperatureScaler(device=device).fit(zt.to(torch.bfloat16), yt)  # fitted in float64 at this size
    assert half.temperature_ == pytest.approx(optimal_temperature(zt.to(torch.bfloat16).double().cpu(), y), rel=1e-6)


def test_integer_logits_become_float64():
    z, y = miscalibrated_arrays()
    zi = np.round(z).astype(np.int32)
    scaler = TemperatureScaler().fit(zi, y)
    assert scaler.temperature_ == pytest.approx(optimal_temperature(zi.astype(np.float64), y), rel=1e-6)
    assert scaler.transform(zi).dtype == np.float64
    assert scaler.transform(torch.from_numpy(zi)).dtype == torch.float64
    assert TemperatureScaler().fit(torch.from_numpy(zi), y).temperature_ == scaler.temperature_


def test_fit_transform_and_pipeline():
    z, y = miscalibrated_arrays()
    scaler = TemperatureScaler()
    scaled = scaler.fit_transform(z, y)
    np.testing.assert_array_equal(scaled, (z / np.float32(scaler.temperature_)))
    pipeline = make_pipeline(TemperatureScaler()).fit(z, y)
    np.testing.assert_array_equal(pipeline.predict_proba(z), scaler.predict_proba(z))


def _expected_failed_checks(estimator):
    """Checks whose data cannot be logits for this estimator; what they test is tested above on logits."""
    blobs = ("its data (make_blobs: 3 classes on 2 features) has more classes than X has logit columns; "
             "tested on logits above")
    return {
        "check_estimators_overwrite_params": blobs,
        "check_estimators_fit_returns_self": blobs,
        "check_readonly_memmap_input": blobs,
        "check_classifiers_classes": ("its 3-class problem has 2 features; its binary problems (string and "
                                      "[-1, 1] labels) pass, and labels are tested above on logits"),
        "check_classifiers_train": ("it fits 3 classes on 2 features, and asks for accuracy > 0.83 from raw "
                                    "features, while predict is the arg-max of X read as logits"),
        "check_classifiers_one_label": ("predict is the arg-max of the logits: a scaler fitted on one class (allowed, "
                                        "with a warning) still predicts every class"),
    }


if SKLEARN_VERSION >= (1, 6):
    strict = {"xfail_strict": True} if SKLEARN_VERSION >= (1, 8) else {}

    @parametrize_with_checks([TemperatureScaler()], expected_failed_checks=_expected_failed_checks, **strict)
    def test_scikit_learn_estimator_checks(estimator, check):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # T at a bound on the checks' random data
            check(estimator)
else:

    @pytest.mark.skip(reason="expected_failed_checks needs scikit-learn >= 1.6")
    def test_scikit_learn_estimator_checks():
        pass


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
    z, y = miscalibrated_arrays()
    scaler = TemperatureScaler().fit(z, y)
    module = scaler.to_module()
    zt = torch.from_numpy(z)
    assert torch.allclose(module(zt), scaler.transform(zt), rtol=1e-7, atol=0)


def test_from_file_reads_metadata_and_sidecars(tmp_path):
    z, y = miscalibrated_arrays(n=30)
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
    """The TemperatureScaler examples of the README and of docs/python.md run as written."""
    readme = (ROOT / "README.md").read_text() + (ROOT / "docs" / "python.md").read_text()
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


# -- probabilities -----------------------------------------------------------------------------------------------
def digits_probabilities() -> tuple[np.ndarray, np.ndarray]:
    """Held-out ``predict_proba`` of a logistic regression on scikit-learn's digits (float64), and the labels."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    X, y = load_digits(return_X_y=True)
    return LogisticRegression(max_iter=3000).fit(X[:700], y[:700]).predict_proba(X[700:]), y[700:]


def test_probabilities_are_refused_unless_probs_says_what_they_are():
    p, y = digits_probabilities()
    for fit in (lambda: TemperatureScaler().fit(p, y), lambda: tempcal.fit_temperature(p, y)):
        with pytest.raises(tempcal.ProbabilitiesError) as exc:
            fit()
        assert isinstance(exc.value, TempcalError) and "\n" not in str(exc.value)
        assert "pass probs=True, or probs=False to treat the values as logits" in str(exc.value)
    as_logits = TemperatureScaler(probs=False).fit(p, y)  # told: the raw values, as logits
    assert as_logits.temperature_ == pytest.approx(optimal_temperature(p, y), rel=1e-6)
    assert as_logits.temperature_ < 0.5  # what a silent fit on probabilities gives: far from the log-p T


def test_probs_true_works_on_log_p_in_every_method():
    p, y = digits_probabilities()
    log_p = np.log(p)
    scaler = TemperatureScaler(probs=True).fit(p, y)
    temperature = optimal_temperature(log_p, y)
    assert scaler.temperature_ == pytest.approx(temperature, rel=1e-6)
    assert tempcal.fit_temperature(p, y, probs=True).temperature == pytest.approx(temperature, rel=1e-6)
    T = scaler.temperature_
    assert np.allclose(scaler.transform(p), log_p / T, rtol=1e-12)
    assert np.allclose(scaler.predict_proba(p), probabilities(log_p, T), atol=1e-12)
    assert np.array_equal(scaler.predict(p), np.argmax(p, axis=1))
    assert -scaler.score(p, y) == pytest.approx(nll_at(log_p, y, T), rel=1e-9)
    p32 = torch.from_numpy(p.astype(np.float32))
    assert scaler.transform(p32).dtype == torch.float32  # a tensor keeps its dtype
    with pytest.raises(TempcalError, match="outside"):
        scaler.predict_proba(p * 2)


def test_probs_true_on_one_binary_column_uses_the_log_odds():
    z, y = binary_arrays()
    p = expit(z.astype(np.float64))
    scaler = TemperatureScaler(probs=True).fit(p, y)
    log_odds = np.log(p) - np.log1p(-p)
    assert scaler.temperature_ == pytest.approx(optimal_temperature(log_odds, y), rel=1e-6)
    assert np.allclose(scaler.predict_proba(p)[:, 1], expit(log_odds / scaler.temperature_), atol=1e-12)
    with pytest.raises(tempcal.ProbabilitiesError):
        TemperatureScaler().fit(p, y)


def test_groups_fit_a_t_per_group_and_transform_applies_it():
    from subsets_reference import penalised_temperature

    from tempcal.subsets.options import DEFAULT_GROUP_PRIOR

    rng = np.random.default_rng(5)
    base = rng.normal(size=(900, 4)) * 2
    p = np.exp(base) / np.exp(base).sum(1, keepdims=True)
    labels = (rng.random((900, 1)) > p.cumsum(1)).sum(1)
    groups = np.array(["x", "y", "z"])[np.arange(900) % 3]
    logits = base * np.where(groups == "x", 1.5, 3.0)[:, None]
    scaler = TemperatureScaler(group_prior=4.0).fit(logits, labels, groups=groups)
    for name in "xyz":
        rows = groups == name
        expected = penalised_temperature(logits[rows], labels[rows], 4.0, scaler.temperature_)
        assert scaler.group_temperatures_[name] == pytest.approx(expected, rel=1e-6)
    own = np.array([scaler.group_temperatures_[g] for g in groups])
    assert np.allclose(scaler.transform(logits, groups=groups), logits / own[:, None])
    assert np.allclose(scaler.fit_transform(logits, labels, groups=groups), logits / own[:, None])
    shifted = logits / own[:, None]
    expected_p = np.exp(shifted - shifted.max(1, keepdims=True))
    assert np.allclose(scaler.predict_proba(logits, groups=groups), expected_p / expected_p.sum(1, keepdims=True))
    nll = -np.log(scaler.predict_proba(logits, groups=groups)[np.arange(900), labels]).mean()
    assert scaler.score(logits, labels, groups=groups) == pytest.approx(-nll, rel=1e-12)
    with pytest.warns(UserWarning, match="not seen in fit"):
        unseen = scaler.transform(logits[:2], groups=np.array(["w", "x"]))
    assert np.allclose(unseen[0], logits[0] / scaler.temperature_)
    assert np.allclose(scaler.transform(logits), logits / scaler.temperature_)  # no groups: the global T
    default = TemperatureScaler().fit(logits, labels, groups=groups)
    rows = groups == "y"
    assert default.group_temperatures_["y"] == pytest.approx(
        penalised_temperature(logits[rows], labels[rows], DEFAULT_GROUP_PRIOR, default.temperature_), rel=1e-6)
