"""``tempcal inspect``: a user's first command on an unknown file, on every kind of SOURCE, each file written by the
library that owns its format (and by ``tempcal fit``, for the stored T)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import EXAMPLE, assert_one_error_line, hidden_and_head, miscalibrated, write_inputs, write_logits
from lm_eval_logs import random_mc_records, write_log
from model_builders import MLP, save_program
from safetensors.torch import save_file

import tempcal


def test_a_fitted_safetensors_file(tmp_path, cli, run_json):
    path = tmp_path / "digits.safetensors"
    path.write_bytes(EXAMPLE.read_bytes())
    before = run_json(["inspect", str(path)])
    assert before["kind"] == "safetensors" and before["rows"] == 1348 and before["num_classes"] == 10
    assert {(t["name"], tuple(t["shape"]), t["dtype"], t["role"]) for t in before["tensors"]} == {
        ("logits", (1348, 10), "float32", "logits"), ("labels", (1348,), "int64", "labels")}
    assert before["values"]["looks_like"] == "logits" and before["values"]["sampled_rows"] == 1348
    assert before["labels"] == {"present": True, "key": "labels", "rows": 1348, "ignored": 0, "ignore_index": -100,
                                "min": 0, "max": 9, "distinct": 10, "out_of_range": 0}
    assert before["stored"]["temperature"] is None and before["sidecar"] is None
    assert any("run tempcal fit" in h for h in before["hints"])
    fitted = run_json(["fit", str(path)])
    after = run_json(["inspect", str(path)])
    assert after["stored"]["temperature"] == fitted["temperature"] and after["stored"]["where"] == "metadata"
    assert after["stored"]["probs"] is False and not after["problems"]
    code, out, _ = cli(["inspect", str(path)])
    assert code == 0 and f"stored T = {fitted['temperature']!r} in the metadata" in out
    assert "logits  [1348, 10]  float32" in out


def test_probabilities_and_log_probabilities_are_told_apart(tmp_path, cli, run_json):
    logits, labels = miscalibrated(300, 5, 2.0, dtype=torch.float64)
    for name, values in (("p", torch.softmax(logits, 1)), ("logp", torch.log_softmax(logits, 1)), ("z", logits)):
        save_file({"logits": values, "labels": labels}, str(tmp_path / f"{name}.safetensors"))
    looks = {name: run_json(["inspect", str(tmp_path / f"{name}.safetensors")]) for name in ("p", "logp", "z")}
    assert [looks[n]["values"]["looks_like"] for n in ("p", "logp", "z")] == ["probabilities", "log-probabilities",
                                                                             "logits"]
    assert any("--probs" in h and "--no-probs" in h for h in looks["p"]["hints"])
    said = [h for h in tempcal.inspect_file(tmp_path / "p.safetensors").hints if "look like probabilities" in h]
    assert len(said) == 1 and "pass probs=True" in said[0] and "or probs=False" in said[0] and "--" not in said[0]
    code, _, err = cli(["fit", str(tmp_path / "p.safetensors"), "--probs", "-q"])
    assert code == 0, err
    fitted = run_json(["inspect", str(tmp_path / "p.safetensors")])
    assert fitted["stored"]["probs"] is True and fitted["values"]["looks_like"] == "probabilities"  # raw values
    assert not any("--probs" in h for h in fitted["hints"])  # already stored with T


def test_an_npz_sidecar_fresh_then_stale(tmp_path, cli, run_json):
    logits, labels = miscalibrated(400, 4, 2.5)
    path = write_logits("npz", tmp_path, logits.numpy(), labels.numpy())
    code, _, err = cli(["fit", str(path), "-q"])
    assert code == 0, err
    t = tempcal.read_stored_temperature(path)[0]
    fresh = run_json(["inspect", str(path)])
    assert fresh["sidecar"] == {"path": f"{path}.tempcal.json", "state": "fresh", "detail": None}
    assert fresh["stored"]["temperature"] == t and fresh["stored"]["where"] == "sidecar"
    assert {t["name"]: t["shape"] for t in fresh["tensors"]} == {"logits": [400, 4], "labels": [400]}
    np.savez(path, logits=logits.numpy()[:300], labels=labels.numpy()[:300])  # the file changes under its sidecar
    stale = run_json(["inspect", str(path)])
    assert stale["sidecar"]["state"] == "stale" and stale["stored"]["temperature"] is None
    assert stale["stored"]["recorded"] == t and "different version" in stale["stored"]["ignored"]
    assert any("run tempcal fit again" in h for h in stale["hints"])
    code, out, _ = cli(["inspect", str(path)])
    assert f"sidecar {path}.tempcal.json: stale" in out


@pytest.mark.parametrize("kind", ["npy", "pt"])
def test_npy_pairs_and_torch_dicts(tmp_path, run_json, kind):
    logits, labels = miscalibrated(200, 3, 2.0)
    path = write_logits(kind, tmp_path, logits.numpy(), labels.numpy())
    out = run_json(["inspect", str(path)])
    roles = {t["role"]: (t["shape"], t["dtype"]) for t in out["tensors"] if t["role"]}
    assert roles == {"logits": ([200, 3], "float32"), "labels": ([200], "int64")}
    assert out["kind"] == kind and out["rows"] == 200 and out["sidecar"]["state"] == "none"
    if kind == "pt":  # a dict may hold more than tensors: listed by type
        note = next(t for t in out["tensors"] if t["name"] == "note")
        assert note["dtype"] == "str" and note["shape"] is None


def test_a_file_without_logits_names_the_tensor_that_could_be(tmp_path, run_json):
    logits, labels = miscalibrated(50, 3, 2.0)
    path = tmp_path / "preds.safetensors"
    save_file({"scores": logits, "targets": labels}, str(path))
    out = run_json(["inspect", str(path)])
    assert any("no tensor 'logits'" in p for p in out["problems"])
    assert any("--logits-key scores" in h for h in out["hints"])
    assert out["values"]["looks_like"] == "logits"  # read from 'scores'
    assert out["labels"]["present"] is False and any("--labels-key" in h for h in out["hints"])


def test_hidden_states_without_and_with_a_head(tmp_path, run_json, cli):
    h, w, b, y = hidden_and_head(64, 8, 20)
    path, head = tmp_path / "hidden.safetensors", tmp_path / "head.safetensors"
    save_file({"hidden": h, "labels": y}, str(path))
    save_file({"weight": w, "bias": b}, str(head))
    without = run_json(["inspect", str(path)])
    assert any("--head HEAD" in h for h in without["hints"]) and without["values"] is None
    with_head = run_json(["inspect", str(path), "--head", str(head)])
    assert with_head["kind"] == "head" and with_head["num_classes"] == 20 and not with_head["problems"]
    assert {t["name"]: t["role"] for t in with_head["tensors"]} == {"hidden": "hidden", "labels": "labels"}
    assert with_head["values"]["looks_like"] == "logits"
    code, _, err = cli(["fit", str(path)])  # the other commands point at --head too
    assert code == 2 and "pass --head HEAD" in assert_one_error_line(err)


def test_an_lm_eval_log_fitted_under_a_normalisation(tmp_path, cli, run_json):
    records, _, _ = random_mc_records(60, seed=5, choice_counts=(3, 4))
    path = write_log(tmp_path / "samples_hellaswag_2024-09-05T12-34-56.jsonl", records)
    code, _, err = cli(["fit", str(path), "--lm-eval-norm", "chars", "-q"])
    assert code == 0, err
    raw = run_json(["inspect", str(path)])
    assert raw["kind"] == "lm-eval" and raw["rows"] == 60 and raw["num_classes"] == 4
    assert raw["stored"]["lm_eval_norm"] == "chars" and raw["stored"]["temperature"] is None
    assert raw["stored"]["recorded"] == tempcal.read_stored_temperature(path)[0]
    assert any("--lm-eval-norm chars" in h for h in raw["hints"])
    assert raw["details"][0]["task"] == "hellaswag" and raw["details"][0]["records"] == 60
    same = run_json(["inspect", str(path), "--lm-eval-norm", "chars"])
    assert same["stored"]["temperature"] == raw["stored"]["recorded"]


def test_stored_group_temperatures(tmp_path, run_json):
    logits, labels = miscalibrated(40, 3, 2.0)
    path = tmp_path / "g.safetensors"
    save_file({"logits": logits, "labels": labels, "domain": torch.arange(40) % 2}, str(path),
              metadata={"tempcal.temperature": "2.0", "tempcal.group_key": "domain",
                        "tempcal.group_temperatures": json.dumps({"0": 1.25, "1": 2.5})})
    out = run_json(["inspect", str(path)])
    assert out["stored"]["group_key"] == "domain" and out["stored"]["group_temperatures"] == {"0": 1.25, "1": 2.5}


def test_a_model_with_and_without_its_inputs(tmp_path, run_json):
    torch.manual_seed(0)
    x = torch.randn(30, 8)
    model = save_program(MLP(), x[:2], tmp_path / "model.pt2")
    alone = run_json(["inspect", str(model)])
    assert alone["details"]["format"].startswith("an exported program") and alone["stored"]["temperature"] is None
    assert any("--inputs" in h for h in alone["hints"]) and not alone["problems"]
    inputs = write_inputs(tmp_path / "inputs.safetensors", x, torch.randint(0, 5, (30,)))
    run = run_json(["inspect", str(model), "--inputs", str(inputs)])
    assert run["rows"] == 30 and run["num_classes"] == 5 and run["values"]["looks_like"] == "logits"
    assert {t["name"]: t["role"] for t in run["tensors"]} == {"inputs": "inputs", "labels": "labels"}


def test_a_missing_file_is_one_error_line(tmp_path, cli):
    code, out, err = cli(["inspect", str(tmp_path / "nothing.safetensors")])
    assert code == 2 and not out
    assert_one_error_line(err, "nothing.safetensors: no such file")


@pytest.mark.parametrize("command", ["inspect", "apply"])
def test_help_does_not_import_torch(command):
    code = (f"import sys\nfrom tempcal.cli.main import main\ncode = main([{command!r}, '--help'])\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert done.returncode == 0, done.stderr
    assert f"tempcal {command}" in done.stdout
