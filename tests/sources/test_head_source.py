"""Hidden states + an output head (``--head``): every figure equals the same command on the materialised logits."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from reference import optimal_temperature
from safetensors.torch import load_file, save_file

import tempcal
from tempcal.cli.main import main
from tempcal.models.head import load_head
from tempcal.models.torchscript import quiet_jit

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FIGURES = ("nll", "ece", "mce", "brier", "accuracy", "entropy", "mean_confidence")


def hidden_and_head(n: int, d: int, v: int, *, seed: int = 0, scale: float = 3.0, bias: bool = True):
    """Hidden states, a head, and labels drawn at a third of the logits' scale (overconfident by ``scale``)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(v, d, generator=g) / math.sqrt(d) * 2
    b = torch.randn(v, generator=g) * 0.3 if bias else None
    h = torch.randn(n, d, generator=g)
    z = h @ w.T + (0 if b is None else b)
    y = torch.multinomial(torch.softmax(z / scale, 1), 1, generator=g)[:, 0]
    return h, w, b, y


def write(path: Path, **tensors) -> Path:
    save_file({k: v.contiguous() for k, v in tensors.items() if v is not None}, str(path))
    return path


def run_json(capsys, argv: list[str]) -> dict:
    code = main([*argv, "--json", "-"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def assert_same_figures(a: dict, b: dict, tol: float = 1e-6) -> None:
    for key in FIGURES:
        assert a[key] == pytest.approx(b[key], abs=tol), key


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_fit_report_ood_equal_the_materialised_logits(tmp_path, capsys, dtype):
    h, w, b, y = hidden_and_head(1500, 24, 3000, seed=1)
    h, w, b = h.to(dtype), w.to(dtype), b.to(dtype)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    z = (h.to(compute) @ w.to(compute).T + b.to(compute))
    hidden = write(tmp_path / "hidden.safetensors", hidden=h, labels=y)
    head = write(tmp_path / "head.safetensors", weight=w, bias=b)
    logits = write(tmp_path / "logits.safetensors", logits=z, labels=y)
    by_head = run_json(capsys, ["fit", str(hidden), "--head", str(head), "--no-write"])
    by_logits = run_json(capsys, ["fit", str(logits), "--no-write"])
    assert abs(by_head["temperature"] - by_logits["temperature"]) / by_logits["temperature"] < 1e-6
    reference = optimal_temperature(z[torch.tensor(_fit_rows(y))], y[torch.tensor(_fit_rows(y))])
    assert abs(by_head["temperature"] - reference) / reference < 1e-6
    for side in ("before", "after"):
        assert_same_figures(by_head[side], by_logits[side])
    ra = run_json(capsys, ["report", str(hidden), "--head", str(head), "--tau", "0.7", "--tau", "2"])
    rb = run_json(capsys, ["report", str(logits), "--tau", "0.7", "--tau", "2"])
    for x, y_ in zip(ra["results"], rb["results"], strict=True):
        assert_same_figures(x, y_)
    ood_h = write(tmp_path / "ood_hidden.safetensors", hidden=torch.randn(400, 24).to(dtype) * 3)
    ood_z = write(tmp_path / "ood_logits.safetensors",
                  logits=load_file(str(ood_h))["hidden"].to(compute) @ w.to(compute).T + b.to(compute))
    oa = run_json(capsys, ["ood", str(hidden), "--head", str(head), "--ood", str(ood_h), "--score", "both"])
    ob = run_json(capsys, ["ood", str(logits), "--ood", str(ood_z), "--score", "both"])
    for x, y_ in zip(oa["results"], ob["results"], strict=True):
        for key in ("auroc", "aupr_in", "aupr_out", "fpr95"):
            assert x[key] == pytest.approx(y_[key], abs=1e-6)


def _fit_rows(y: torch.Tensor) -> np.ndarray:
    return tempcal.stratified_split(y.numpy(), 0.5, 0)[0]


def test_write_back_goes_into_the_hidden_states_file(tmp_path, capsys):
    h, w, b, y = hidden_and_head(400, 8, 300, seed=2)
    hidden = write(tmp_path / "hidden.safetensors", hidden=h, labels=y)
    head = write(tmp_path / "head.safetensors", weight=w, bias=b)
    fitted = run_json(capsys, ["fit", str(hidden), "--head", str(head)])
    assert tempcal.read_header(hidden).stored_temperature() == fitted["temperature"]
    assert torch.equal(load_file(str(hidden))["hidden"], h)
    again = run_json(capsys, ["report", str(hidden), "--head", str(head)])
    assert again["results"][0]["tau"] == fitted["temperature"]


def test_token_level_hidden_states_skip_the_ignore_index(tmp_path, capsys):
    h, w, b, y = hidden_and_head(6 * 40, 8, 200, seed=3)
    y[::7] = -100
    hidden = write(tmp_path / "hidden.safetensors", hidden=h.reshape(6, 40, 8), labels=y.reshape(6, 40))
    head = write(tmp_path / "head.safetensors", weight=w, bias=b)
    keep = y != -100
    logits = write(tmp_path / "logits.safetensors", logits=(h @ w.T + b)[keep], labels=y[keep])
    a = run_json(capsys, ["fit", str(hidden), "--head", str(head), "--no-write", "--val-fraction", "1"])
    b_ = run_json(capsys, ["fit", str(logits), "--no-write", "--val-fraction", "1"])
    assert a["n_fit"] == int(keep.sum()) and abs(a["temperature"] - b_["temperature"]) / b_["temperature"] < 1e-6


def test_the_shipped_digits_model_as_hidden_states_and_its_last_layer(tmp_path, capsys):
    """A real small model: the digits MLP's penultimate activations and its last layer give the shipped logits."""
    with_inputs = load_file(str(EXAMPLES / "digits_inputs.safetensors"))
    shipped = load_file(str(EXAMPLES / "digits_logits.safetensors"))
    with quiet_jit():
        state = torch.jit.load(str(EXAMPLES / "digits_model.ts")).state_dict()
    weights = [v for k, v in state.items() if k.endswith("weight")]
    biases = [v for k, v in state.items() if k.endswith("bias")]
    assert [tuple(w.shape) for w in weights] == [(128, 64), (10, 128)]
    penultimate = torch.relu(with_inputs["inputs"] @ weights[0].T + biases[0])
    assert torch.allclose(penultimate @ weights[1].T + biases[1], shipped["logits"], atol=1e-5)
    hidden = write(tmp_path / "hidden.safetensors", hidden=penultimate, labels=with_inputs["labels"])
    head = write(tmp_path / "head.safetensors", weight=weights[1], bias=biases[1])
    a = run_json(capsys, ["fit", str(hidden), "--head", str(head), "--no-write"])
    b = run_json(capsys, ["fit", str(EXAMPLES / "digits_logits.safetensors"), "--no-write"])
    assert abs(a["temperature"] - b["temperature"]) / b["temperature"] < 1e-6
    for side in ("before", "after"):
        assert_same_figures(a[side], b[side])


def _tiny(kind: str, folder: Path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    common = {"vocab_size": 257, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 4, "num_key_value_heads": 2}
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    elif kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=257, n_embd=32, n_layer=1, n_head=4))
    elif kind == "gemma2":
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**common, head_dim=8,
                                                                         final_logit_softcapping=2.0))
    elif kind == "cohere":
        model = transformers.CohereForCausalLM(transformers.CohereConfig(**common, logit_scale=0.5))
    else:
        model = transformers.GraniteForCausalLM(transformers.GraniteConfig(**common, logits_scaling=4.0))
    model.eval()
    shard = "20KB" if kind == "llama" else "1GB"
    model.save_pretrained(folder, max_shard_size=shard)
    return model


@pytest.mark.parametrize("kind", ["llama", "gpt2", "gemma2", "cohere", "granite"])
def test_hugging_face_folders_give_the_models_own_logits(tmp_path, capsys, kind):
    folder = tmp_path / kind
    model = _tiny(kind, folder)
    ids = torch.randint(0, 257, (4, 30), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        out = model(input_ids=ids, output_hidden_states=True)
    hidden_states = out.hidden_states[-1].reshape(-1, 32)
    head = load_head(folder)
    mine = head.logits(hidden_states, torch.empty(hidden_states.shape[0], head.vocab))
    assert torch.allclose(mine, out.logits.reshape(-1, 257).float(), atol=1e-5, rtol=1e-5)
    if kind == "llama":
        assert (folder / "model.safetensors.index.json").exists()  # sharded
    y = torch.multinomial(torch.softmax(out.logits.reshape(-1, 257) * 3, 1), 1)[:, 0]
    hidden = write(tmp_path / "hidden.safetensors", hidden=hidden_states, labels=y)
    logits = write(tmp_path / "logits.safetensors", logits=out.logits.reshape(-1, 257).float(), labels=y)
    a = run_json(capsys, ["fit", str(hidden), "--head", str(folder), "--no-write"])
    b = run_json(capsys, ["fit", str(logits), "--no-write"])
    assert abs(a["temperature"] - b["temperature"]) / b["temperature"] < 1e-5


def test_the_example_script_dumps_rows_that_fit(tmp_path, capsys):
    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, str(EXAMPLES / "lm_hidden_states.py"), "--demo", str(tmp_path / "m")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = load_file(str(tmp_path / "m" / "hidden.safetensors"))
    assert rows["hidden"].shape == (16, 32, 64) and rows["labels"].shape == (16, 32)
    assert bool((rows["labels"][:, -1] == -100).all())
    result = run_json(capsys, ["fit", str(tmp_path / "m" / "hidden.safetensors"), "--head", str(tmp_path / "m"),
                               "--no-write"])
    assert result["n_fit"] + result["n_eval"] == 16 * 31 and result["num_classes"] == 512


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("case", ["width", "label", "key", "no-config", "no-weights", "nan", "softcap"])
def test_bad_heads_are_one_line_errors_and_nothing_is_written(tmp_path, capsys, case):
    h, w, b, y = hidden_and_head(200, 8, 50, seed=4)
    hidden = write(tmp_path / "hidden.safetensors", hidden=h, labels=y)
    head = tmp_path / "head.safetensors"
    extra: list[str] = []
    if case == "width":
        write(head, weight=w[:, :6], bias=b)
        expected = "'hidden' has width d = 8 but"
    elif case == "label":
        write(head, weight=w[:40], bias=b[:40])
        expected = "outside the vocabulary"
    elif case == "key":
        write(head, W=w)
        expected = "no tensor 'weight' (keys present: 'W'; choose one with --head-weight-key)"
    elif case == "no-config":
        head = tmp_path / "folder"
        head.mkdir()
        expected = "no config.json"
    elif case == "no-weights":
        head = tmp_path / "folder"
        head.mkdir()
        (head / "config.json").write_text("{}")
        expected = "no model.safetensors"
    elif case == "nan":
        w[7, 3] = math.nan
        write(head, weight=w, bias=b)
        expected = "NaN or inf (vocabulary row 7)"
    else:
        write(head, weight=w, bias=b)
        extra = ["--softcap", "0"]
        expected = "--softcap 0.0: expected a number > 0"
    before = _snapshot(tmp_path)
    code = main(["fit", str(hidden), "--head", str(head), "--json", str(tmp_path / "out.json"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error:") and expected in err, err
    assert _snapshot(tmp_path) == before


def _torchrun() -> list[str] | None:
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    return [exe] if exe else None


@pytest.mark.skipif(_torchrun() is None, reason="torchrun not installed")
def test_two_gloo_processes_match_one(tmp_path):
    h, w, b, y = hidden_and_head(1200, 16, 700, seed=5)
    hidden = write(tmp_path / "hidden.safetensors", hidden=h, labels=y)
    head = write(tmp_path / "head.safetensors", weight=w, bias=b)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    common = ["fit", str(hidden), "--head", str(head), "--no-write", "--device", "cpu", "--quiet"]
    one = subprocess.run([sys.executable, "-m", "tempcal", *common, "--json", str(tmp_path / "one.json")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert one.returncode == 0, one.stderr
    two = subprocess.run([*_torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "tempcal", *common,
                          "--json", str(tmp_path / "two.json")], capture_output=True, text=True, env=env, timeout=300)
    assert two.returncode == 0, two.stderr[-2000:]
    a, b_ = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert abs(a["temperature"] - b_["temperature"]) / a["temperature"] < 1e-6
    for side in ("before", "after"):
        assert_same_figures(a[side], b_[side])
