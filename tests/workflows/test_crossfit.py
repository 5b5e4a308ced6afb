"""fit --folds K: the deployed T on every row, K out-of-fold fits, out-of-fold figures, all against float64
references (scipy per fold, leave-one-out included), and the reads the folds share."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from conftest import miscalibrated, miscalibrated_binary
from safetensors.torch import save_file
from subsets_reference import figures_per_row, penalised_temperature

from tempcal.errors import TempcalError
from tempcal.sources.safetensors import ShardedLogits
from tempcal.subsets.cells import assign_folds
from tempcal.workflows.fit import fit_file

FIGURES = ("nll", "ece", "mce", "brier", "accuracy", "entropy")


def _file(tmp_path, logits, labels, name="logits.safetensors", **more):
    path = tmp_path / name
    save_file({"logits": logits.contiguous(), "labels": labels.contiguous(), **more}, str(path))
    return path


def _close_figures(block, reference, tol=1e-9):
    for key in FIGURES:
        assert block[key] == pytest.approx(reference[key], abs=tol), key


def test_folds_are_class_stratified_balanced_and_seeded():
    labels = np.repeat(np.arange(4), [37, 5, 1, 90])
    folds = assign_folds(labels, 6, seed=3)
    sizes = np.bincount(folds, minlength=6)
    assert sizes.sum() == len(labels) and sizes.max() - sizes.min() <= 1
    for c in range(4):
        per_fold = np.bincount(folds[labels == c], minlength=6)
        assert per_fold.max() - per_fold.min() <= 1, c
    assert np.array_equal(folds, assign_folds(labels, 6, seed=3))
    assert not np.array_equal(folds, assign_folds(labels, 6, seed=4))
    assert np.array_equal(assign_folds(labels, len(labels), seed=9), np.arange(len(labels)))  # leave-one-out
    for bad in (1, len(labels) + 1, 2.5, True):
        with pytest.raises(TempcalError, match="folds"):
            assign_folds(labels, bad)


@pytest.mark.parametrize("k", [2, 5])
def test_fold_temperatures_and_out_of_fold_figures_match_references(tmp_path, reads, k):
    z, y = miscalibrated(300, 6, 2.5, seed=1)
    path = _file(tmp_path, z, y)
    report = fit_file(str(path), folds=k, seed=7)
    out = report.to_json()
    plain = fit_file(str(path), val_fraction=1.0)
    assert out["temperature"] == pytest.approx(plain.temperature, rel=1e-12)  # the T written back
    folds = assign_folds(y.numpy(), k, 7)
    temps = out["folds"]["temperatures"]
    assert out["folds"]["k"] == k and out["folds"]["sizes"] == np.bincount(folds, minlength=k).tolist()
    for fold in range(k):
        outside = folds != fold
        expected = penalised_temperature(z[outside], y[outside])
        assert temps[fold] == pytest.approx(expected, rel=1e-6), fold
    assert len({round(t, 9) for t in temps}) == k  # really fitted on different rows
    _close_figures(out["after"], figures_per_row(z, y, np.asarray(temps)[folds]))
    _close_figures(out["before"], figures_per_row(z, y, 1.0))
    assert out["n_fit"] == out["n_eval"] == 300 and out["val_fraction"] is None
    assert out["after"]["tau"] == out["temperature"]


def test_leave_one_out(tmp_path):
    z, y = miscalibrated(40, 3, 3.0, seed=2)
    out = fit_file(str(_file(tmp_path, z, y)), folds=40).to_json()
    temps = out["folds"]["temperatures"]
    assert out["folds"]["sizes"] == [1] * 40
    for i in range(40):
        keep = np.arange(40) != i
        assert temps[i] == pytest.approx(penalised_temperature(z[keep], y[keep]), rel=1e-6), i
    _close_figures(out["after"], figures_per_row(z, y, temps))


def test_binary_logit_folds(tmp_path):
    z, y = miscalibrated_binary(240, 2.0, seed=4)
    out = fit_file(str(_file(tmp_path, z, y)), folds=4, seed=1).to_json()
    folds = assign_folds(y.numpy(), 4, 1)
    for fold in range(4):
        outside = folds != fold
        assert out["folds"]["temperatures"][fold] == pytest.approx(penalised_temperature(z[outside], y[outside]),
                                                                   rel=1e-6)
    _close_figures(out["after"], figures_per_row(z, y, np.asarray(out["folds"]["temperatures"])[folds]))


def test_token_rows_skip_ignored_labels(tmp_path):
    z, y = miscalibrated(6 * 30, 5, 2.0, seed=5)
    labels = y.reshape(6, 30).clone()
    labels[:, :4] = -100
    path = _file(tmp_path, z.reshape(6, 30, 5), labels)
    out = fit_file(str(path), folds=3).to_json()
    kept = labels.reshape(-1) != -100
    zk, yk = z[kept], y[kept]
    assert out["n_fit"] == int(kept.sum())
    folds = assign_folds(yk.numpy(), 3, 0)
    for fold in range(3):
        outside = folds != fold
        assert out["folds"]["temperatures"][fold] == pytest.approx(penalised_temperature(zk[outside], yk[outside]),
                                                                   rel=1e-6)


def test_folds_refuse_a_split_or_an_evaluation_file(tmp_path):
    z, y = miscalibrated(50, 3, 2.0)
    path = _file(tmp_path, z, y)
    with pytest.raises(TempcalError, match="val_fraction"):
        fit_file(str(path), folds=3, val_fraction=0.5)
    with pytest.raises(TempcalError, match="eval"):
        fit_file(str(path), folds=3, eval_file=str(path))
    with pytest.raises(TempcalError, match="folds 51"):
        fit_file(str(path), folds=51)


class _Reads:
    """Passes over a safetensors file, counted where its chunks are read."""

    def __init__(self, monkeypatch):
        self.count = collections.Counter()
        plain = ShardedLogits.chunks

        def chunks(data, *args, **kwargs):
            self.count[data.shards[0].header.path.name] += 1
            yield from plain(data, *args, **kwargs)

        monkeypatch.setattr(ShardedLogits, "chunks", chunks)


def test_ten_folds_read_the_data_at_most_once_more_than_the_plain_fit(tmp_path, monkeypatch):
    monkeypatch.setenv("TEMPCAL_RESIDENT_BYTES", "0")  # streamed: every pass reads the file
    z, y = miscalibrated(20_000, 10, 2.0, seed=6)
    path = _file(tmp_path, z, y)
    reads = _Reads(monkeypatch)
    plain = fit_file(str(path), val_fraction=1.0)
    plain_reads = reads.count[path.name]
    folded = fit_file(str(path), folds=10)
    folded_reads = reads.count[path.name] - plain_reads
    assert folded_reads <= plain_reads + 1, (plain_reads, folded_reads)
    # the JSON's passes count the validating scan and the fit's reads; one more read gives the figures
    assert folded.fit.passes == folded_reads - 1
    assert folded.temperature == pytest.approx(plain.temperature, rel=1e-12)
    folds = assign_folds(y.numpy(), 10, 0)
    for fold in (0, 9):
        outside = folds != fold
        assert folded.subsets.folds["temperatures"][fold] == pytest.approx(
            penalised_temperature(z[outside], y[outside]), rel=1e-6)


def _ece_of(z, y, temperature, bins=15):
    return figures_per_row(z, y, temperature, bins)["ece"]


def test_ece_objective_folds_minimise_each_folds_ece(tmp_path):
    z, y = miscalibrated(160, 4, 2.0, seed=8)
    path = _file(tmp_path, z, y)
    out = fit_file(str(path), folds=3, objective="ece").to_json()
    plain = fit_file(str(path), val_fraction=1.0, objective="ece")
    assert out["temperature"] == plain.temperature  # the written T is the plain ECE fit's, exactly
    folds = assign_folds(y.numpy(), 3, 0)
    grid = np.exp(np.linspace(np.log(out["temperature"] / 20), np.log(out["temperature"] * 20), 801))
    for fold, t in enumerate(out["folds"]["temperatures"]):
        outside = folds != fold
        best = min(_ece_of(z[outside], y[outside], g) for g in grid)
        assert _ece_of(z[outside], y[outside], t) <= best + 1e-4, fold
    _close_figures(out["after"], figures_per_row(z, y, np.asarray(out["folds"]["temperatures"])[folds]))
