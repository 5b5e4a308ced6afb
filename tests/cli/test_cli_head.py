"""tempcal fit/report/ood with --head: every figure equals the same command on the materialised logits."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import EXAMPLES, hidden_and_head, snapshot
from model_builders import VOCAB, final_hidden_states, tiny_model
from reference import optimal_temperature
from safetensors.torch import load_file, save_file

import tempcal
from tempcal.models.base import quiet

FIGURES = ("nll", "ece", "mce", "brier", "accuracy", "entropy", "mean_confidence")


def write(path, **tensors):
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def assert_same_figures(a: dict, b: dict, tol: float = 1e-6) -> None:
    for key in FIGURES:
        assert a[key] == pytest.approx(b[key], abs=tol), key


# float32 storage takes bfloat16's path less its conversion: the default run keeps bfloat16 and float64.
@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, marks=pytest.mark.slow), torch.bfloat16, torch.float64])
def test_fit_report_ood_equal_the_materialised_logits(tmp_path, run_json, dtype):
    h, w, b, y = hidden_and_head(1500, 24, 3000, seed=1)
    h, w, b = h.to(dtype), w.to(dtype), b.to(dtype)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    z = h.to(compute) @ w.to(compute).T + b.to(compute)
    hidden = write(tmp_path / "hidden.safetensors", hidden=h, labels=y)
    head = write(tmp_path / "head.safetensors", weight=w, bias=b)
    logits = write(tmp_path / "logits.safetensors", logits=z, labels=y)
    by_head = run_json(["fit", str(hidden), "--head", str(head), "--no-write"])
    by_logits = run_json(["fit", str(logits), "--no-write"])
    assert abs(by_head["temperature"] - by_logits["temperature"]) / by_logits["temperature"] < 1e-6
    rows = torch.from_numpy(tempcal.stratified_split(y.numpy(), 0.5, 0)[0])
    reference = optimal_temperature(z[rows], y[rows])
    assert abs(by_head["temperature"] - reference) / reference < 1e-6
    for side in ("before", "after"):
        assert_same_figures(by_head[side], by_logits[side])
    a = run_json(["report", str(hidden), "--head", str(head), "--tau", "0.7", "--tau", "2"])
    b_ = run_json(["report", str(logits), "--tau", "0.7", "--tau", "2"])
    for x, y_ in zip(a["results"], b_["results"], strict=True):
        assert_same_figures(x, y_)
    ood_hidden = (torch.randn(400, 24) * 3).to(dtype)
    ood_h = write(tmp_path / "ood_hidden.safetensors", hidden=ood_hidden)
    ood_z = write(tmp_path / "ood_logits.safetensors", logits=ood_hidden.to(compute) @ w.to(compute).T + b.to(compute))
    a = run_json(["ood", str(hidden), "--head", str(head), "--ood", str(ood_h), "--score", "both"])
    b_ = run_json(["ood", str(logits), "--ood", str(ood_z), "--score", "both"])
    for x, y_ in zip(a["results"], b_["results"], strict=True):
        for key in ("auroc", "aupr_in", "aupr_out", "fpr95"):
            assert x[key] == pytest.approx(y_[key], abs=1e-6)


def test_write_back_goes_into_the_hidden_states_file(tmp_path, run_json):
    h, w, b, y = hidden_and_head(400, 8, 300, seed=2)
    hidden = write(tmp_path / "hidden.safetensors", hidden=h, labels=y)
    head = write(tmp_path / "head.safetensors", weight=w, bias=b)
    fitted = run_json(["fit", str(hidden), "--head", str(head)])
    assert tempcal.read_header(hidden).stored_temperature() == fitted["temperature"]
    assert torch.equal(load_file(str(hidden))["hidden"], h)
    again = run_json(["report", str(hidden), "--head", str(head)])
    assert again["results"][0]["tau"] == fitted["temperature"]


def test_token_level_hidden_states_skip_the_ignore_index(tmp_path, run_json):
    h, w, b, y = hidden_and_head(6 * 40, 8, 200, seed=3)
    y[::7] = -100
    hidden = write(tmp_path / "hidden.safetensors", hidden=h.reshape(6, 40, 8), labels=y.reshape(6, 40))
    head = write(tmp_path / "head.safetensors", weight=w, bias=b)
    keep = y != -100
    logits = write(tmp_path / "logits.safetensors", logits=(h @ w.T + b)[keep], labels=y[keep])
    a = run_json(["fit", str(hidden), "--head", str(head), "--no-write", "--val-fraction", "1"])
    b_ = run_json(["fit", str(logits), "--no-write", "--val-fraction", "1"])
    assert a["n_fit"] == int(keep.sum()) and abs(a["temperature"] - b_["temperature"]) / b_["temperature"] < 1e-6


def test_the_shipped_digits_model_as_hidden_states_and_its_last_layer(tmp_path, run_json):
    """A real small model: the digits MLP's penultimate activations and its last layer give the shipped logits."""
    inputs = load_file(str(EXAMPLES / "digits_inputs.safetensors"))
    shipped = load_file(str(EXAMPLES / "digits_logits.safetensors"))
    with quiet():
        state = torch.jit.load(str(EXAMPLES / "digits_model.ts")).state_dict()
    weights = [v for k, v in state.items() if k.endswith("weight")]
    biases = [v for k, v in state.items() if k.endswith("bias")]
    assert [tuple(w.shape) for w in weights] == [(128, 64), (10, 128)]
    penultimate = torch.relu(inputs["inputs"] @ weights[0].T + biases[0])
    assert torch.allclose(penultimate @ weights[1].T + biases[1], shipped["logits"], atol=1e-5)
    hidden = write(tmp_path / "hidden.safetensors", hidden=penultimate, labels=inputs["labels"])
    head = write(tmp_path / "head.safetensors", weight=weights[1], bias=biases[1])
    a = run_json(["fit", str(hidden), "--head", str(head), "--no-write"])
    b = run_json(["fit", str(EXAMPLES / "digits_logits.safetensors"), "--no-write"])
    assert abs(a["temperature"] - b["temperature"]) / b["temperature"] < 1e-6
    for side in ("before", "after"):
        assert_same_figures(a[side], b[side])


def test_a_hugging_face_folder_as_head_fits_like_its_logits(tmp_path, run_json):
    hidden_states, logits = final_hidden_states(tiny_model("llama", tmp_path / "llama"), rows=8)
    y = torch.multinomial(torch.softmax(logits * 3, 1), 1, generator=torch.Generator().manual_seed(2))[:, 0]
    hidden = write(tmp_path / "hidden.safetensors", hidden=hidden_states, labels=y)
    materialised = write(tmp_path / "logits.safetensors", logits=logits, labels=y)
    a = run_json(["fit", str(hidden), "--head", str(tmp_path / "llama"), "--no-write"])
    b = run_json(["fit", str(materialised), "--no-write"])
    assert a["num_classes"] == VOCAB and abs(a["temperature"] - b["temperature"]) / b["temperature"] < 1e-5


@pytest.mark.slow  # the example script builds a model with transformers; --lm is tested directly elsewhere
def test_the_example_script_builds_a_demo_and_dumps_rows_that_fit(tmp_path, run_json):
    """--demo DIR: a tiny model and texts it sampled at T = 0.25, fitted by --lm; MODEL TEXTS OUT: rows for --head."""
    pytest.importorskip("transformers")
    script = [sys.executable, str(EXAMPLES / "lm_hidden_states.py")]
    done = subprocess.run([*script, "--demo", str(tmp_path / "m")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    texts = tmp_path / "m" / "texts.txt"
    by_lm = run_json(["fit", "--lm", str(tmp_path / "m"), "--text", str(texts), "--no-write", "--val-fraction", "1.0"])
    assert by_lm["n_fit"] == 64 * 31 and by_lm["num_classes"] == 513
    # The texts were sampled from the model at temperature 0.25: the fit recovers it (1984 tokens: within 10%).
    assert by_lm["temperature"] == pytest.approx(0.25, rel=0.1)
    out = tmp_path / "hidden.safetensors"
    done = subprocess.run([*script, str(tmp_path / "m"), str(texts), str(out)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    rows = load_file(str(out))
    assert rows["hidden"].shape == (64 * 31, 64) and rows["labels"].shape == (64 * 31,)
    by_head = run_json(["fit", str(out), "--head", str(tmp_path / "m"), "--no-write", "--val-fraction", "1.0"])
    assert abs(by_head["temperature"] - by_lm["temperature"]) / by_lm["temperature"] < 1e-9


@pytest.mark.parametrize("case", ["width", "label", "key", "no-config", "no-weights", "nan", "softcap", "probs"])
def test_bad_heads_are_one_line_errors_and_nothing_is_written(tmp_path, cli, case):
    h, w, b, y = hidden_and_head(200, 8, 50, seed=4)
    hidden = write(tmp_path / "hidden.safetensors", hidden=h, labels=y)
    head = tmp_path / "head.safetensors"
    extra: list[str] = []
    write(head, weight=w, bias=b)
    if case == "width":
        write(head, weight=w[:, :6], bias=b)
        expected = "'hidden' has width d = 8 but"
    elif case == "label":
        write(head, weight=w[:40], bias=b[:40])
        expected = "outside the vocabulary"
    elif case == "key":
        write(head, W=w)
        expected = "no tensor 'weight' (keys present: 'W'; choose one with --head-weight-key)"
    elif case in ("no-config", "no-weights"):
        head = tmp_path / "folder"
        head.mkdir()
        if case == "no-weights":
            (head / "config.json").write_text("{}")
        expected = "no config.json" if case == "no-config" else "no model.safetensors"
    elif case == "nan":
        w[7, 3] = math.nan
        write(head, weight=w, bias=b)
        expected = "NaN or inf (vocabulary row 7)"
    elif case == "softcap":
        extra = ["--softcap", "0"]
        expected = "--softcap 0.0: expected a number > 0"
    else:
        extra = ["--probs"]
        expected = "--probs applies to logits"
    before = snapshot(tmp_path)
    code, _, err = cli(["fit", str(hidden), "--head", str(head), "--json", str(tmp_path / "out.json"), *extra])
    assert code == 2 and err.count("\n") == 1 and err.startswith("error:") and expected in err, err
    assert snapshot(tmp_path) == before
    assert np.array_equal(load_file(str(hidden))["hidden"].numpy(), h.numpy())


# -- the hub's cache: snapshots whose files are links into the repository's blobs/ -----------------------------------


def hub_cache(folder, cache, repo: str = "models--org--tiny"):
    """``folder``'s files laid out as the hub's cache lays out a download: ``blobs/`` named by hash (sha256 for the
    weights, git's blob sha1 for the rest), ``refs/main`` naming the commit, and ``snapshots/COMMIT/NAME`` as
    relative links ``../../blobs/HASH``. Returns the snapshot folder."""
    root = cache / repo
    commit = hashlib.sha1(repo.encode()).hexdigest()
    snapshot = root / "snapshots" / commit
    for sub in (root / "blobs", root / "refs", snapshot):
        sub.mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    for file in sorted(folder.iterdir()):
        data = file.read_bytes()
        blob = (hashlib.sha256(data).hexdigest() if file.suffix == ".safetensors"
                else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        (root / "blobs" / blob).write_bytes(data)
        os.symlink(f"../../blobs/{blob}", snapshot / file.name)
    return snapshot


def head_fit_case(tmp_path, kind: str):
    """A tiny random model of ``kind`` saved by save_pretrained, its hidden states and labels, and float64 logits."""
    model = tiny_model(kind, tmp_path / kind)
    hidden_states, logits = final_hidden_states(model, rows=8)
    y = torch.multinomial(torch.softmax(logits * 3, 1), 1, generator=torch.Generator().manual_seed(2))[:, 0]
    hidden = write(tmp_path / f"{kind}-hidden.safetensors", hidden=hidden_states, labels=y)
    weights = load_file(str(tmp_path / kind / "model.safetensors")) if kind == "gpt2" else {}
    if kind == "llama":
        index = json.loads((tmp_path / kind / "model.safetensors.index.json").read_text())["weight_map"]
        weights = load_file(str(tmp_path / kind / index["lm_head.weight"]))
    w = weights["lm_head.weight" if kind == "llama" else "transformer.wte.weight"].double()
    return hidden, hidden_states.double() @ w.T, y


@pytest.mark.parametrize("kind", ["llama", "gpt2"])  # sharded (five shards of 20 kB) and a single model.safetensors
def test_a_snapshot_in_the_hubs_cache_fits_like_the_folder_it_came_from(tmp_path, run_json, kind):
    hidden, z, y = head_fit_case(tmp_path, kind)
    snapshot = hub_cache(tmp_path / kind, tmp_path / "hub")
    names = sorted(p.name for p in snapshot.iterdir())
    assert all((snapshot / n).is_symlink() and os.readlink(snapshot / n).startswith("../../blobs/") for n in names)
    assert ("model.safetensors.index.json" in names) == (kind == "llama")
    if kind == "llama":  # the command itself, as a user runs it
        done = subprocess.run([sys.executable, "-m", "tempcal", "fit", str(hidden), "--head", str(snapshot),
                               "--no-write", "--json", "-"], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        cached = json.loads(done.stdout)
    else:
        cached = run_json(["fit", str(hidden), "--head", str(snapshot), "--no-write"])
    plain = run_json(["fit", str(hidden), "--head", str(tmp_path / kind), "--no-write"])
    assert cached["temperature"] == plain["temperature"]
    rows = torch.from_numpy(tempcal.stratified_split(y.numpy(), 0.5, 0)[0])
    reference = optimal_temperature(z[rows], y[rows])
    assert abs(cached["temperature"] - reference) / reference < 1e-5


@pytest.mark.parametrize("where", ["shard-outside", "single-outside", "other-repository", "config-outside"])
def test_a_link_out_of_the_cache_repository_exits_2_naming_it(tmp_path, cli, where):
    """The snapshot's links followed into its own blobs/ only: one to a copy elsewhere, or into another repository's
    blobs/, is refused, for shards, a single model.safetensors and config.json alike."""
    kind = "gpt2" if where == "single-outside" else "llama"
    hidden, _, _ = head_fit_case(tmp_path, kind)
    snap = hub_cache(tmp_path / kind, tmp_path / "hub")
    if where in ("shard-outside", "other-repository"):
        name = json.loads((snap / "model.safetensors.index.json").read_text())["weight_map"]["lm_head.weight"]
    else:
        name = "model.safetensors" if where == "single-outside" else "config.json"
    if where == "other-repository":
        target = (hub_cache(tmp_path / kind, tmp_path / "hub", repo="models--someone--else") / name).resolve()
    else:
        target = tmp_path / "elsewhere" / name
        target.parent.mkdir()
        shutil.copy(snap / name, target)
    (snap / name).unlink()
    os.symlink(os.path.relpath(target, snap), snap / name)
    before = snapshot(tmp_path)
    code, _, err = cli(["fit", str(hidden), "--head", str(snap), "--json", str(tmp_path / "out.json")])
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {snap / name}: a link to {target}, outside {snap} or its cache "
                          "repository's blobs/"), err
    assert snapshot(tmp_path) == before
