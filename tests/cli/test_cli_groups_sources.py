"""--folds and --group-by on every kind of SOURCE that names a group tensor: hidden states with an output head
(token rows, ignored labels), a model run over an inputs file, .npz and .pt; every figure equals the same
command on the materialised logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import hidden_and_head, script_model, write_inputs
from safetensors.torch import save_file

ARGS = ["--folds", "3", "--group-by", "domain", "--seed", "4"]


def assert_same(one: dict, two: dict) -> None:
    assert one["temperature"] == pytest.approx(two["temperature"], rel=1e-6)
    assert one["folds"]["sizes"] == two["folds"]["sizes"]
    for a, b in zip(one["folds"]["temperatures"], two["folds"]["temperatures"], strict=True):
        assert a == pytest.approx(b, rel=1e-6)
    for key in ("nll", "ece", "brier", "accuracy"):
        assert one["after"][key] == pytest.approx(two["after"][key], abs=1e-6)
    assert [g["group"] for g in one["groups"]] == [g["group"] for g in two["groups"]]
    for a, b in zip(one["groups"], two["groups"], strict=True):
        assert (a["n_fit"], a["n_eval"]) == (b["n_fit"], b["n_eval"])
        assert a["temperature"] == pytest.approx(b["temperature"], rel=1e-6)
        assert a["after"]["ece"] == pytest.approx(b["after"]["ece"], abs=1e-6)


def test_head_token_rows_match_the_materialised_logits(tmp_path, run_json):
    h, w, b, y = hidden_and_head(12 * 25, 16, 300, seed=3)
    labels = y.reshape(12, 25).clone()
    labels[:, -5:] = -100
    domain = (torch.arange(12)[:, None] % 3).expand(12, 25).contiguous()
    save_file({"hidden": h.reshape(12, 25, 16), "labels": labels, "domain": domain},
              str(tmp_path / "hidden.safetensors"))
    save_file({"weight": w, "bias": b}, str(tmp_path / "head.safetensors"))
    logits = (h @ w.T + b).reshape(12, 25, 300)
    save_file({"logits": logits, "labels": labels, "domain": domain}, str(tmp_path / "logits.safetensors"))
    head = run_json(["fit", str(tmp_path / "hidden.safetensors"), "--head", str(tmp_path / "head.safetensors"),
                     *ARGS, "--no-write"])
    assert head["n_fit"] == int((labels != -100).sum())
    assert_same(head, run_json(["fit", str(tmp_path / "logits.safetensors"), *ARGS, "--no-write"]))


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")
def test_model_source_reads_groups_from_its_inputs(tmp_path, run_json):
    torch.manual_seed(0)
    model = script_model(torch.nn.Linear(6, 4), tmp_path / "model.pt")
    x = torch.randn(300, 6) * 3
    domain = torch.arange(300) % 4
    with torch.no_grad():
        logits = torch.jit.load(str(model))(x)
    y = torch.multinomial(torch.softmax(logits / 2, 1), 1, generator=torch.Generator().manual_seed(1))[:, 0]
    inputs = write_inputs(tmp_path / "inputs.safetensors", x, y, domain=domain)
    save_file({"logits": logits, "labels": y, "domain": domain}, str(tmp_path / "logits.safetensors"))
    fitted = run_json(["fit", str(model), "--inputs", str(inputs), *ARGS])
    assert fitted["written"] is None  # a model SOURCE keeps its group temperatures in the JSON
    assert_same(fitted, run_json(["fit", str(tmp_path / "logits.safetensors"), *ARGS, "--no-write"]))


@pytest.mark.parametrize("suffix", [".npz", ".pt"])
def test_npz_and_pt_sources(tmp_path, run_json, suffix):
    g = torch.Generator().manual_seed(6)
    z = torch.randn(240, 5, generator=g) * 4
    y = torch.multinomial(torch.softmax(z / 4, 1), 1, generator=g)[:, 0]
    domain = torch.arange(240) % 2
    path = tmp_path / f"logits{suffix}"
    if suffix == ".npz":
        np.savez(path, logits=z.numpy(), labels=y.numpy(), domain=domain.numpy())
    else:
        torch.save({"logits": z, "labels": y, "domain": domain}, path)
    save_file({"logits": z, "labels": y, "domain": domain}, str(tmp_path / "logits.safetensors"))
    assert_same(run_json(["fit", str(path), *ARGS, "--no-write"]),
                run_json(["fit", str(tmp_path / "logits.safetensors"), *ARGS, "--no-write"]))
