"""Probabilities as SOURCE, the way users meet them: netcal-style ``.npz`` files of ``predict_proba`` outputs.

A tool that saves probabilities (netcal: ``np.savez(f, predictions=p, ground_truth=y)``) must never have
them fitted as logits without being told, and a T fitted on log(p) must never meet the raw values later.
Figures are checked against numpy/scipy computations of ``log_softmax(log p / T)``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from reference import optimal_temperature, ref_auroc
from safetensors import safe_open
from safetensors.torch import save_file
from scipy.special import log_softmax, softmax

from tempcal.cli.main import main
from tempcal.io.paths import sidecar_path

REFUSAL = "pass --probs, or --no-probs to treat the values as logits"


@pytest.fixture(scope="module")
def digits_probabilities():
    """``predict_proba`` of a logistic regression on scikit-learn's digits: held-out probabilities, labels, and
    the probabilities of uniform-noise images (an OOD set)."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    X, y = load_digits(return_X_y=True)
    model = LogisticRegression(max_iter=3000).fit(X[:700], y[:700])
    noise = np.random.default_rng(0).uniform(0, 16, size=(300, X.shape[1]))
    return model.predict_proba(X[700:]), y[700:], model.predict_proba(noise)


@pytest.fixture
def netcal_file(tmp_path, digits_probabilities):
    """A netcal-style archive: float64 probabilities under 'predictions', labels under 'ground_truth'."""
    p, y, _ = digits_probabilities
    path = tmp_path / "c10.npz"
    np.savez(path, predictions=p, ground_truth=y)
    return path


def nll_of_log_p(p: np.ndarray, y: np.ndarray, temperature: float) -> float:
    """Mean NLL of ``softmax(log(p) / T)``, in numpy."""
    with np.errstate(divide="ignore"):
        log_p = np.log(p)
    return float(-np.mean(log_softmax(log_p / temperature, axis=1)[np.arange(len(y)), y]))


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_probabilities_are_refused_and_nothing_is_written(capsys, netcal_file):
    before = netcal_file.read_bytes()
    for keys in ([], ["--logits-key", "predictions", "--labels-key", "ground_truth"]):
        code, out, err = run(capsys, "fit", netcal_file, *keys)
        assert code == 2 and out == ""
        assert REFUSAL in err and "'predictions'" in err and "Traceback" not in err
        assert err.count("\n") <= 2  # the netcal note (without keys) and the one-line error
        assert netcal_file.read_bytes() == before and not sidecar_path(netcal_file).exists()
    code, _, err = run(capsys, "report", netcal_file)
    assert code == 2 and REFUSAL in err


def test_fit_probs_then_report_without_flags_works_on_log_p(capsys, netcal_file, digits_probabilities):
    p, y, _ = digits_probabilities
    code, out, err = run(capsys, "fit", netcal_file, "--probs", "--val-fraction", "1.0", "--json", "-")
    assert code == 0
    fitted = json.loads(out)
    assert "'predictions' as the logits" in err and "'ground_truth' as the labels" in err
    with np.errstate(divide="ignore"):
        expected = optimal_temperature(np.log(p), y)
    temperature = fitted["temperature"]
    assert abs(temperature - expected) / expected < 1e-6 and fitted["probs"] is True
    record = json.loads(sidecar_path(netcal_file).read_text())["metadata"]
    assert record.pop("tempcal.split")
    assert record == {"tempcal.temperature": repr(temperature), "tempcal.probs": "true",
                      "tempcal.logits_key": "predictions", "tempcal.labels_key": "ground_truth"}

    right, raw = nll_of_log_p(p, y, temperature), float(-np.mean(np.log(softmax(p / temperature, axis=1)[
        np.arange(len(y)), y])))
    assert raw > right + 0.5  # the figure a T applied to the raw probabilities would give is far off
    for flags in ([], ["--logits-key", "predictions", "--labels-key", "ground_truth"]):
        code, out, err = run(capsys, "report", netcal_file, *flags, "--json", "-")
        assert code == 0, err
        (row,) = json.loads(out)["results"]
        assert row["tau"] == temperature and row["stored"] is True
        assert row["nll"] == pytest.approx(right, rel=1e-9)
        assert "as probabilities" in err
    code, out, _ = run(capsys, "report", netcal_file, "--tau", "fitted", "--tau", "1", "--json", "-")
    figures = {r["tau"]: r["nll"] for r in json.loads(out)["results"]}
    assert figures[1.0] == pytest.approx(nll_of_log_p(p, y, 1.0), rel=1e-9)  # T = 1 on log p: p itself
    assert figures[1.0] == pytest.approx(float(-np.mean(np.log(p[np.arange(len(y)), y]))), rel=1e-9)


def test_no_probs_refuses_the_stored_probability_temperature(capsys, netcal_file, digits_probabilities):
    p, y, _ = digits_probabilities
    assert run(capsys, "fit", netcal_file, "--probs")[0] == 0
    for command in (["report", netcal_file], ["report", netcal_file, "--tau", "fitted"],
                    ["ood", netcal_file, "--ood", netcal_file]):
        code, _, err = run(capsys, *command, "--no-probs")
        assert code == 2 and "fitted on log-probabilities" in err and "--no-probs" in err
    code, out, _ = run(capsys, "report", netcal_file, "--no-probs", "--tau", "1", "--json", "-")
    assert code == 0  # the user's explicit choice: the raw values as logits, at a T the user gave
    (row,) = json.loads(out)["results"]
    assert row["nll"] == pytest.approx(float(-np.mean(log_softmax(p, axis=1)[np.arange(len(y)), y])), rel=1e-9)


def test_ood_at_the_fitted_temperature_scores_log_p(capsys, tmp_path, netcal_file, digits_probabilities):
    p, _, noise = digits_probabilities
    ood = tmp_path / "noise.npz"
    np.savez(ood, predictions=noise)
    assert run(capsys, "fit", netcal_file, "--probs")[0] == 0
    temperature = json.loads(sidecar_path(netcal_file).read_text())["metadata"]["tempcal.temperature"]
    code, out, err = run(capsys, "ood", netcal_file, "--ood", ood, "--tau", "fitted", "--json", "-")
    assert code == 0, err
    (row,) = json.loads(out)["results"]
    assert row["tau"] == float(temperature)

    def msp(q: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return softmax(np.log(q) / float(temperature), axis=1).max(1)

    assert row["auroc"] == pytest.approx(ref_auroc(msp(p), msp(noise)), abs=1e-12)


def test_safetensors_probs_flag_round_trip(capsys, tmp_path):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(400, 6, generator=g, dtype=torch.float64) * 3
    y = torch.multinomial(torch.softmax(z / 3, 1), 1, generator=g)[:, 0]
    path = tmp_path / "p.safetensors"
    save_file({"logits": torch.softmax(z, 1), "labels": y}, str(path))
    data = path.read_bytes()
    code, _, err = run(capsys, "fit", path)
    assert code == 2 and REFUSAL in err and path.read_bytes() == data
    code, out, _ = run(capsys, "fit", path, "--probs", "--val-fraction", "1.0", "--json", "-")
    temperature = json.loads(out)["temperature"]
    assert code == 0 and abs(temperature - optimal_temperature(z, y)) / temperature < 1e-6  # log p = z - lse(z)
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"tempcal.temperature": repr(temperature), "tempcal.probs": "true",
                                "tempcal.split": '{"fit": "all", "rows": 400}'}
        assert torch.equal(f.get_tensor("logits"), torch.softmax(z, 1))
    code, out, _ = run(capsys, "report", path, "--json", "-")
    (row,) = json.loads(out)["results"]
    zz = z.numpy()
    assert code == 0 and row["nll"] == pytest.approx(
        float(-np.mean(log_softmax(zz / temperature, axis=1)[np.arange(400), y.numpy()])), rel=1e-9)
    # Fitted again on the raw values, explicitly: the probabilities mark goes, T is the raw values' T.
    code, out, _ = run(capsys, "fit", path, "--no-probs", "--val-fraction", "1.0", "--json", "-")
    raw = json.loads(out)["temperature"]
    assert code == 0 and abs(raw - optimal_temperature(torch.softmax(z, 1), y)) / raw < 1e-6
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"tempcal.temperature": repr(raw), "tempcal.split": '{"fit": "all", "rows": 400}'}
    assert run(capsys, "report", path)[0] == 2  # probability-like again, with no mark: refused


def test_netcal_names_are_remembered_for_a_logits_archive(capsys, tmp_path):
    g = torch.Generator().manual_seed(1)
    z = (torch.randn(300, 4, generator=g, dtype=torch.float64) * 2).numpy()
    y = np.argmax(z + np.random.default_rng(1).gumbel(size=z.shape), axis=1)
    path = tmp_path / "logits.npz"
    np.savez(path, predictions=z, ground_truth=y)
    code, _, err = run(capsys, "fit", path, "--val-fraction", "1.0")
    assert code == 0 and "netcal's array names" in err
    record = json.loads(sidecar_path(path).read_text())["metadata"]
    assert "tempcal.probs" not in record and record["tempcal.logits_key"] == "predictions"
    assert float(record["tempcal.temperature"]) == pytest.approx(optimal_temperature(z, y), rel=1e-6)
    code, _, err = run(capsys, "report", path)
    assert code == 0 and "logits 'predictions'" in err


@pytest.mark.parametrize("shape", [(500, 10), (500,)], ids=["ten-classes", "one-binary-logit"])
def test_logits_that_carry_no_information_are_refused(capsys, tmp_path, shape):
    rng = np.random.default_rng(0)
    classes = shape[1] if len(shape) == 2 else 2
    labels = torch.from_numpy(rng.integers(0, classes, size=shape[0]))
    path = tmp_path / "zeros.safetensors"
    save_file({"logits": torch.zeros(shape), "labels": labels}, str(path))
    data = path.read_bytes()
    assert (labels != 0).float().mean() > 0.4  # most labels are not the arg-max (class 0, the first on ties)
    # One column of zeros lies in [0, 1], so it could be probabilities too: said to be logits, it is refused still.
    code, out, err = run(capsys, "fit", path, *(["--no-probs"] if len(shape) == 1 else []))
    assert code == 2 and out == "" and "carry no information" in err
    assert f"ln {classes} = {math.log(classes):.4f}" in err and "1e-06" not in err
    assert path.read_bytes() == data


def test_separable_rows_with_flat_ones_still_go_to_the_lower_bound(capsys, tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, size=200)
    logits = np.zeros((200, 5), dtype=np.float32)
    logits[np.arange(100), labels[:100]] = 4.0  # the first half: the true class strictly largest
    path = tmp_path / "mixed.safetensors"
    save_file({"logits": torch.from_numpy(logits), "labels": torch.from_numpy(labels)}, str(path))
    code, out, err = run(capsys, "fit", path, "--val-fraction", "1.0", "--no-write", "--json", "-")
    assert code == 0
    result = json.loads(out)
    assert result["temperature"] == 1e-6 and result["bound"] == "lower"
    assert "100 of the 200 share the largest logit" in err and "every fitting sample's true class" not in err


def test_a_head_whose_logit_scale_underflows_the_logits_is_refused(capsys, tmp_path):
    g = torch.Generator().manual_seed(0)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"logit_scale": 1e-50}))  # 0 in float32: every logit 0
    save_file({"lm_head.weight": torch.randn(12, 8, generator=g)}, str(folder / "model.safetensors"))
    hidden = tmp_path / "hidden.safetensors"
    save_file({"hidden": torch.randn(200, 8, generator=g), "labels": torch.randint(0, 12, (200,), generator=g)},
              str(hidden))
    data = hidden.read_bytes()
    code, out, err = run(capsys, "fit", hidden, "--head", folder)
    assert code == 2 and out == "" and "carry no information" in err and "ln 12" in err
    assert hidden.read_bytes() == data
