"""fit / report / ood --group-by KEY: per-group temperatures drawn toward the global T, per-group figures,
write-back and reuse of the stored per-group temperatures, against float64 references."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from subsets_reference import figures_per_row, penalised_temperature

from tempcal.core.splitting import stratified_split
from tempcal.errors import TempcalError
from tempcal.subsets.cells import assign_folds
from tempcal.subsets.options import DEFAULT_GROUP_PRIOR
from tempcal.workflows.fit import fit_file, keep_fit
from tempcal.workflows.report import report_file

FIGURES = ("nll", "ece", "mce", "brier", "accuracy", "entropy")


def grouped_logits(sizes, c=5, seed=0):
    """Groups of the given sizes whose logits are overconfident by different factors (group g: 1 + g / 2)."""
    g = torch.Generator().manual_seed(seed)
    zs, ys, gs = [], [], []
    for k, n in enumerate(sizes):
        base = torch.randn(n, c, dtype=torch.float64, generator=g) * 2
        ys.append(torch.multinomial(torch.softmax(base, 1), 1, generator=g)[:, 0])
        zs.append((base * (1 + k / 2)).float())
        gs.append(torch.full((n,), 7 * k - 3, dtype=torch.int32))  # values -3, 4, 11, ...: names in decimal
    return torch.cat(zs), torch.cat(ys), torch.cat(gs)


@pytest.fixture
def grouped_file(tmp_path):
    z, y, groups = grouped_logits([20, 150, 400, 35])
    path = tmp_path / "grouped.safetensors"
    save_file({"logits": z, "labels": y, "domain": groups}, str(path))
    return path, z, y, groups


def _close(block, reference, tol=1e-9):
    for key in FIGURES:
        assert block[key] == pytest.approx(reference[key], abs=tol), key


@pytest.mark.parametrize("lam", [None, 0.0, 3.5])
def test_group_temperatures_are_the_penalised_optima(grouped_file, lam):
    path, z, y, groups = grouped_file
    out = fit_file(str(path), val_fraction=1.0, group_by="domain", group_prior=lam).to_json()
    weight = DEFAULT_GROUP_PRIOR if lam is None else lam
    assert out["group_prior"] == weight and out["group_key"] == "domain"
    assert [g["group"] for g in out["groups"]] == ["-3", "4", "11", "18"]  # sorted numerically, in decimal
    plain = fit_file(str(path), val_fraction=1.0)
    assert out["temperature"] == pytest.approx(plain.temperature, rel=1e-12)
    for entry, value in zip(out["groups"], [-3, 4, 11, 18], strict=True):
        rows = (groups == value).numpy()
        expected = penalised_temperature(z[rows], y[rows], weight, out["temperature"])
        assert entry["temperature"] == pytest.approx(expected, rel=1e-6), entry["group"]
        assert entry["n_fit"] == entry["n_eval"] == int(rows.sum())
        _close(entry["before"], figures_per_row(z[rows], y[rows], 1.0))
        _close(entry["after"], figures_per_row(z[rows], y[rows], entry["temperature"]))
        _close(entry["after_global"], figures_per_row(z[rows], y[rows], out["temperature"]))


def test_the_prior_moves_small_groups_more_than_large_ones(grouped_file):
    path, *_ = grouped_file
    free = {g["group"]: g["temperature"] for g in fit_file(str(path), val_fraction=1.0, group_by="domain",
                                                           group_prior=0).to_json()["groups"]}
    out = fit_file(str(path), val_fraction=1.0, group_by="domain").to_json()
    shrunk = {g["group"]: g["temperature"] for g in out["groups"]}
    moved = {name: abs(np.log(shrunk[name] / free[name])) / abs(np.log(out["temperature"] / free[name]))
             for name in free}
    assert moved["-3"] > moved["11"]  # 20 rows are drawn further toward the global T than 400


def test_groups_on_a_split_fit_on_one_side_and_report_on_the_other(grouped_file):
    path, z, y, groups = grouped_file
    out = fit_file(str(path), group_by="domain", seed=2).to_json()
    fit_index, eval_index = stratified_split(y.numpy(), 0.5, 2)
    g = groups.numpy()
    for entry in out["groups"]:
        value = int(entry["group"])
        fitting, evaluating = fit_index[g[fit_index] == value], eval_index[g[eval_index] == value]
        expected = penalised_temperature(z[fitting], y[fitting], DEFAULT_GROUP_PRIOR, out["temperature"])
        assert entry["temperature"] == pytest.approx(expected, rel=1e-6)
        assert (entry["n_fit"], entry["n_eval"]) == (len(fitting), len(evaluating))
        _close(entry["after"], figures_per_row(z[evaluating], y[evaluating], entry["temperature"]))


def test_groups_within_folds_are_fitted_and_reported_out_of_fold(grouped_file):
    path, z, y, groups = grouped_file
    out = fit_file(str(path), folds=4, group_by="domain", seed=5).to_json()
    folds = assign_folds(y.numpy(), 4, 5)
    fold_t = np.asarray(out["folds"]["temperatures"])
    g = groups.numpy()
    for entry in out["groups"]:
        rows = g == int(entry["group"])
        own = np.empty(len(y))
        for k in range(4):
            train = rows & (folds != k)
            own[rows & (folds == k)] = penalised_temperature(z[train], y[train], DEFAULT_GROUP_PRIOR, fold_t[k])
        _close(entry["after"], figures_per_row(z[rows], y[rows], own[rows]), tol=1e-7)
        _close(entry["after_global"], figures_per_row(z[rows], y[rows], fold_t[folds[rows]]))
        expected = penalised_temperature(z[rows], y[rows], DEFAULT_GROUP_PRIOR, out["temperature"])
        assert entry["temperature"] == pytest.approx(expected, rel=1e-6)


def test_write_back_and_report_apply_the_stored_group_temperatures(grouped_file, tmp_path):
    path, z, y, groups = grouped_file
    copy = tmp_path / "copy.safetensors"
    report = fit_file(str(path), val_fraction=1.0, group_by="domain")
    keep_fit(report, output=str(copy))
    with safe_open(str(copy), "pt") as f:
        metadata = f.metadata()
    stored = json.loads(metadata["tempcal.group_temperatures"])
    assert metadata["tempcal.group_key"] == "domain"
    assert stored == {g.group: g.temperature for g in report.subsets.groups}
    result = report_file(str(copy), taus=["fitted", 1.0], group_by="domain").to_json()
    at_t = next(r for r in result["results"] if r["per_group"])
    own = np.array([stored[str(int(v))] for v in groups.numpy()])
    _close(at_t, figures_per_row(z, y, own))
    for entry in at_t["groups"]:
        rows = (groups == int(entry["group"])).numpy()
        assert entry["tau"] == stored[entry["group"]] and entry["n"] == int(rows.sum())
        _close(entry, figures_per_row(z[rows], y[rows], entry["tau"]))
    at_one = next(r for r in result["results"] if r["tau"] == 1.0)
    assert not at_one["per_group"]
    _close(at_one, figures_per_row(z, y, 1.0))
    # A plain fit afterwards drops the group temperatures it did not fit.
    keep_fit(fit_file(str(copy), val_fraction=1.0), output=None)
    with safe_open(str(copy), "pt") as f:
        assert "tempcal.group_temperatures" not in f.metadata() and "tempcal.group_key" not in f.metadata()


def test_report_warns_for_groups_without_a_stored_temperature(grouped_file, tmp_path):
    path, z, y, groups = grouped_file
    copy = tmp_path / "copy.safetensors"
    keep_fit(fit_file(str(path), val_fraction=1.0, group_by="domain"), output=str(copy))
    other = groups.clone()
    other[:5] = 99  # a group the fit never saw
    save_file({"logits": z, "labels": y, "domain": other}, str(tmp_path / "other.safetensors"),
              metadata=safe_open(str(copy), "pt").metadata())
    result = report_file(str(tmp_path / "other.safetensors"), group_by="domain").to_json()
    assert any("no stored T" in w and "99" in w for w in result["warnings"])
    entry = next(g for g in result["results"][0]["groups"] if g["group"] == "99")
    assert entry["tau"] == result["stored_temperature"]


@pytest.mark.parametrize("problem, match", [
    ("float", "group values must be integers"), ("missing", "no tensor"), ("shape", "expected one value per row"),
])
def test_bad_group_keys(tmp_path, problem, match):
    z, y, groups = grouped_logits([30, 30])
    tensors = {"logits": z, "labels": y, "domain": groups}
    if problem == "float":
        tensors["domain"] = groups.float()
    elif problem == "missing":
        del tensors["domain"]
    else:
        tensors["domain"] = groups[:-1].contiguous()
    path = tmp_path / "bad.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(TempcalError, match=match):
        fit_file(str(path), group_by="domain")
    with pytest.raises(TempcalError, match=match):
        report_file(str(path), group_by="domain")


def test_more_than_100000_groups_are_refused(tmp_path):
    n = 100_001
    path = tmp_path / "many.safetensors"
    save_file({"logits": torch.zeros(n, 2), "labels": torch.zeros(n, dtype=torch.int64),
               "domain": torch.arange(n)}, str(path))
    with pytest.raises(TempcalError, match="100,001 groups"):
        report_file(str(path), group_by="domain")


def test_ece_objective_groups_minimise_their_penalised_ece(grouped_file):
    path, z, y, groups = grouped_file
    out = fit_file(str(path), val_fraction=1.0, group_by="domain", objective="ece", group_prior=2.0).to_json()
    t0 = out["temperature"]
    grid = np.exp(np.linspace(np.log(t0 / 30), np.log(t0 * 30), 601))
    for entry in out["groups"]:
        rows = (groups == int(entry["group"])).numpy()
        n = int(rows.sum())

        def value(t, rows=rows, n=n):
            return figures_per_row(z[rows], y[rows], t)["ece"] + 2.0 / n * np.log(t / t0) ** 2

        assert value(entry["temperature"]) <= min(value(t) for t in grid) + 1e-4, entry["group"]


def test_fit_temperature_api_groups_and_folds():
    import tempcal

    z, y, groups = grouped_logits([60, 90, 50])
    labels = y.clone()
    labels[::7] = -100  # left out, as in token-level data
    names = np.array(["low", "mid", "high"])[(groups.numpy() + 3) // 7]
    result = tempcal.fit_temperature(z, labels, groups=names, group_prior=0, folds=3, seed=1)
    kept = (labels != -100).numpy()
    zk, yk, nk = z[kept], labels[kept], names[kept]
    assert result.temperature == pytest.approx(penalised_temperature(zk, yk), rel=1e-6)
    assert sorted(result.group_temperatures) == ["high", "low", "mid"]
    for name, t in result.group_temperatures.items():
        assert t == pytest.approx(penalised_temperature(zk[nk == name], yk[nk == name]), rel=1e-6), name
    folds = assign_folds(yk.numpy(), 3, 1)
    assert np.array_equal(result.folds, folds)
    for k, t in enumerate(result.fold_temperatures):
        assert t == pytest.approx(penalised_temperature(zk[folds != k], yk[folds != k]), rel=1e-6)
    with pytest.raises(TempcalError, match="one per row"):
        tempcal.fit_temperature(z, labels, groups=names[:-1])
