"""tempcal fit/report/ood --lm MODEL --text FILE: every figure equals the same command on the materialised logits."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import needs_cuda, snapshot
from lm_builders import lm_folder, load_tokenizer, materialised, sampled_texts, write_texts
from reference import optimal_temperature
from safetensors.torch import load_file, save_file

import tempcal

pytest.importorskip("transformers")
FIGURES = ("nll", "ece", "mce", "brier", "accuracy", "entropy", "mean_confidence")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny Llama (sharded checkpoint) with a word tokenizer, and texts it sampled at T = 0.5."""
    folder = tmp_path_factory.mktemp("llama") / "model"
    model = lm_folder("llama", folder)
    texts = sampled_texts(model, temperature=0.5)
    return folder, model, texts


def fresh(tmp_path, prepared) -> tuple:
    """A copy of a prepared model folder (tests write into it) and its texts file."""
    folder, model, texts = prepared
    copy = tmp_path / "model"
    shutil.copytree(folder, copy)
    return copy, model, write_texts(tmp_path / "texts.txt", texts)


def relative(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


@pytest.mark.parametrize("kind", ["gpt2", "llama-tied", "gemma2"])
def test_fit_equals_scipys_optimum_on_the_materialised_logits(tmp_path, run_json, kind):
    """GPT-2 (tied embeddings, learned positions), Llama with tied embeddings, Gemma 2 with its soft cap."""
    folder = tmp_path / kind
    model = lm_folder(kind, folder)
    texts = sampled_texts(model, temperature=0.7, seed=2)
    path = write_texts(tmp_path / "texts.txt", texts)
    z, y = materialised(model, load_tokenizer(folder), texts)
    fitted = run_json(["fit", "--lm", str(folder), "--text", str(path), "--val-fraction", "1", "--no-write",
                       "--device", "cpu"])
    assert fitted["n_fit"] == len(y) and fitted["num_classes"] == z.shape[1]
    assert relative(fitted["temperature"], optimal_temperature(z, y)) < 1e-6
    if kind == "gemma2":
        assert fitted["lm"]["softcap"] == 2.0 and float(z.abs().max()) < 2.0  # the cap is the model's, applied


def test_the_default_split_and_every_figure_match_the_logits_file(tmp_path, run_json, llama):
    folder, model, path = fresh(tmp_path, llama)
    texts = path.read_text().splitlines()
    z, y = materialised(model, load_tokenizer(folder), texts)
    logits = tmp_path / "logits.safetensors"
    save_file({"logits": z.float(), "labels": y}, str(logits))
    by_lm = run_json(["fit", "--lm", str(folder), "--text", str(path), "--no-write"])
    by_logits = run_json(["fit", str(logits), "--no-write"])
    rows = torch.from_numpy(tempcal.stratified_split(y.numpy(), 0.5, 0)[0])
    assert relative(by_lm["temperature"], optimal_temperature(z[rows], y[rows])) < 1e-6
    for side in ("before", "after"):
        for key in FIGURES:
            assert by_lm[side][key] == pytest.approx(by_logits[side][key], abs=1e-6), (side, key)
    a = run_json(["report", "--lm", str(folder), "--text", str(path), "--tau", "0.7", "--tau", "2"])
    b = run_json(["report", str(logits), "--tau", "0.7", "--tau", "2"])
    for x, x_ in zip(a["results"], b["results"], strict=True):
        for key in FIGURES:
            assert x[key] == pytest.approx(x_[key], abs=1e-6), key


def test_ood_texts_score_as_their_materialised_logits(tmp_path, run_json, llama):
    folder, model, path = fresh(tmp_path, llama)
    other = sampled_texts(model, rows=12, temperature=3.0, seed=5)
    ood = write_texts(tmp_path / "ood.txt", other)
    tokenizer = load_tokenizer(folder)
    z, y = materialised(model, tokenizer, path.read_text().splitlines())
    z_ood, _ = materialised(model, tokenizer, other)
    save_file({"logits": z.float(), "labels": y}, str(tmp_path / "id.safetensors"))
    save_file({"logits": z_ood.float()}, str(tmp_path / "ood.safetensors"))
    a = run_json(["ood", "--lm", str(folder), "--text", str(path), "--ood-text", str(ood), "--score", "both",
                  "--tau", "1", "--tau", "0.5"])
    b = run_json(["ood", str(tmp_path / "id.safetensors"), "--ood", str(tmp_path / "ood.safetensors"), "--score",
                  "both", "--tau", "1", "--tau", "0.5"])
    assert a["n_ood"] == b["n_ood"] and len(a["results"]) == 4
    for x, x_ in zip(a["results"], b["results"], strict=True):
        for key in ("auroc", "aupr_in", "aupr_out", "fpr95"):
            assert x[key] == pytest.approx(x_[key], abs=1e-6), key
    assert [t["path"] for t in a["lm"]["texts"]] == [str(path), str(ood)]


def test_texts_sampled_at_a_temperature_give_it_back(tmp_path, run_json):
    """The demo's claim: texts a model samples itself at T = 0.25 are fitted at T near 0.25."""
    folder = tmp_path / "demo"
    model = lm_folder("llama", folder)
    path = write_texts(tmp_path / "texts.txt", sampled_texts(model, rows=64, length=32, temperature=0.25, seed=3))
    fitted = run_json(["fit", "--lm", str(folder), "--text", str(path), "--val-fraction", "1", "--no-write"])
    assert abs(fitted["temperature"] - 0.25) < 0.03


def test_write_back_goes_into_tempcal_json_and_the_models_files_stay(tmp_path, run_json, llama):
    folder, _, path = fresh(tmp_path, llama)
    before = snapshot(folder)
    fitted = run_json(["fit", "--lm", str(folder), "--text", str(path), "--seed", "3"])
    after = snapshot(folder)
    assert set(after) - set(before) == {"tempcal.json"}
    assert all(after[name] == before[name] for name in before)  # every file of the model byte-identical
    record = json.loads((folder / "tempcal.json").read_text())
    assert record["temperature"] == fitted["temperature"]
    assert record["texts"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["texts"]["rows"] == fitted["n_fit"] + fitted["n_eval"]
    assert record["settings"]["seed"] == 3 and record["tempcal"]["version"] == tempcal.__version__
    assert fitted["written"] == str(folder / "tempcal.json")
    again = run_json(["report", "--lm", str(folder), "--text", str(path)])
    assert again["results"][0]["tau"] == fitted["temperature"]


def test_no_write_and_output(tmp_path, run_json, llama):
    folder, _, path = fresh(tmp_path, llama)
    before = snapshot(folder)
    run_json(["fit", "--lm", str(folder), "--text", str(path), "--no-write"])
    assert snapshot(folder) == before
    fitted = run_json(["fit", "--lm", str(folder), "--text", str(path), "--output", str(tmp_path / "t.json")])
    assert snapshot(folder) == before
    assert json.loads((tmp_path / "t.json").read_text())["temperature"] == fitted["temperature"]


def test_write_generation_config_sets_temperature_and_keeps_every_other_key(tmp_path, cli, run_json, llama):
    folder, _, path = fresh(tmp_path, llama)
    config = folder / "generation_config.json"
    original = {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": [2, 7], "top_p": 0.9,
                "do_sample": True, "temperature": 0.6, "transformers_version": "4.40.0"}
    config.write_text(json.dumps(original, indent=2))
    fitted = run_json(["fit", "--lm", str(folder), "--text", str(path), "--write-generation-config"])
    written = json.loads(config.read_text())
    assert list(written) == list(original)  # the order kept
    assert written == {**original, "temperature": fitted["temperature"]}
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []  # no temporary file left
    config.write_text(json.dumps({**original, "do_sample": False}))
    code, _, err = cli(["fit", "--lm", str(folder), "--text", str(path), "--write-generation-config", "--quiet"])
    assert code == 0 and "do_sample false" in err and "ignores the temperature" in err


def test_a_folder_without_generation_config_gets_the_models_own(tmp_path, run_json, llama):
    folder, model, path = fresh(tmp_path, llama)
    (folder / "generation_config.json").unlink()
    fitted = run_json(["fit", "--lm", str(folder), "--text", str(path), "--write-generation-config"])
    written = json.loads((folder / "generation_config.json").read_text())
    assert written["temperature"] == fitted["temperature"]
    assert written["eos_token_id"] == model.config.eos_token_id and written["bos_token_id"] == model.config.bos_token_id


def test_a_linked_generation_config_is_refused_before_any_work(tmp_path, cli, llama):
    folder, _, path = fresh(tmp_path, llama)
    blob = tmp_path / "blob.json"
    (folder / "generation_config.json").rename(blob)
    (folder / "generation_config.json").symlink_to(blob)
    before = snapshot(folder)
    code, _, err = cli(["fit", "--lm", str(folder), "--text", str(path), "--write-generation-config"])
    assert code == 2 and "is a symbolic link" in err and snapshot(folder) == before


def test_saved_hidden_states_fit_with_head_as_the_lm_does(tmp_path, run_json, llama):
    folder, _, path = fresh(tmp_path, llama)
    saved = tmp_path / "hidden.safetensors"
    a = run_json(["fit", "--lm", str(folder), "--text", str(path), "--no-write", "--save-hidden", str(saved)])
    tensors = load_file(str(saved))
    assert tensors["hidden"].shape == (a["n_fit"] + a["n_eval"], 32) and tensors["labels"].dtype == torch.int64
    b = run_json(["fit", str(saved), "--head", str(folder), "--no-write"])
    assert relative(a["temperature"], b["temperature"]) < 1e-9
    for side in ("before", "after"):
        assert a[side]["nll"] == pytest.approx(b[side]["nll"], abs=1e-9)


def test_spilled_hidden_states_give_the_same_fit_and_leave_nothing(tmp_path, run_json, monkeypatch, llama):
    folder, _, path = fresh(tmp_path, llama)
    spill = tmp_path / "spill"
    spill.mkdir()
    memory = run_json(["fit", "--lm", str(folder), "--text", str(path), "--no-write"])
    monkeypatch.setenv("TEMPCAL_LM_MEMORY_BYTES", "0")
    spilled = run_json(["fit", "--lm", str(folder), "--text", str(path), "--no-write", "--spill-dir", str(spill)])
    assert memory["lm"]["texts"][0]["hidden_storage"] == "memory"
    assert spilled["lm"]["texts"][0]["hidden_storage"] == "file"
    assert spilled["temperature"] == memory["temperature"] and spilled["after"] == memory["after"]
    assert list(spill.iterdir()) == []


def test_ctrl_c_during_the_fit_leaves_no_file(tmp_path, cli, monkeypatch, llama):
    folder, _, path = fresh(tmp_path, llama)
    spill = tmp_path / "spill"
    spill.mkdir()
    before = snapshot(folder)

    def interrupted(*args, **kwargs):
        assert list(spill.iterdir()) == []  # the spilled file has no name, even while it is used
        raise KeyboardInterrupt

    monkeypatch.setenv("TEMPCAL_LM_MEMORY_BYTES", "0")
    monkeypatch.setattr("tempcal.workflows.fit.fit_temperature", interrupted)
    code, _, err = cli(["fit", "--lm", str(folder), "--text", str(path), "--spill-dir", str(spill),
                       "--save-hidden", str(tmp_path / "h.safetensors")])
    assert code == 1 and err == "interrupted\n"  # the contract's status for "anything else", not Typer's 130
    assert list(spill.iterdir()) == [] and snapshot(folder) == before and not (tmp_path / "h.safetensors").exists()


def _spilled_file_open(pid: int, spill: Path) -> bool:
    """Whether process ``pid`` holds a file in ``spill`` open (its unnamed hidden-state file: the forward pass runs)."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        targets = [os.readlink(fd) for fd in fds.iterdir()]
    except OSError:  # the process ended, or a descriptor closed while listed
        return False
    return any(target.startswith(f"{spill}{os.sep}") for target in targets)


def _default_sigint() -> None:
    """In the child before it runs Python: SIGINT back to its default. A runner started in the background by a
    shell without job control ignores SIGINT, its children inherit that, and Python then never raises
    ``KeyboardInterrupt``, as it should not for a user who ran tempcal that way (``nohup``, ``cmd &``)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="watches the process's open files in /proc")
@pytest.mark.slow  # 20,000 texts; the default run: test_cli_main's interrupted commands (status 1, one line)
def test_sigint_to_a_running_fit_exits_1_in_one_line_and_leaves_no_file(tmp_path, llama):
    """``python -m tempcal fit --lm`` on 20,000 texts (half a minute of forward pass), sent SIGINT as Ctrl-C sends it
    once its forward pass writes the hidden states: status 1, one line, no traceback, nothing left behind."""
    folder, _, _ = fresh(tmp_path, llama)
    words = torch.randint(0, 20, (20_000, 24), generator=torch.Generator().manual_seed(0))
    path = write_texts(tmp_path / "many.txt", [" ".join(f"w{int(i)}" for i in row) for row in words])
    spill, hidden = tmp_path / "spill", tmp_path / "h.safetensors"
    spill.mkdir()
    before = snapshot(folder)
    env = {**os.environ, "TEMPCAL_LM_MEMORY_BYTES": "0"}  # the hidden states go to an unnamed file in --spill-dir
    process = subprocess.Popen([sys.executable, "-m", "tempcal", "fit", "--lm", str(folder), "--text", str(path),
                                "--spill-dir", str(spill), "--save-hidden", str(hidden), "--device", "cpu",
                                "--no-config"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 120
        while not _spilled_file_open(process.pid, spill) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() is None, "the fit ended before it could be interrupted"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 1, err
    assert (err, out) == ("interrupted\n", "")
    assert list(spill.iterdir()) == [] and not hidden.exists() and snapshot(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.txt", "model", "spill", "texts.txt"]


def test_bfloat16_stays_bfloat16_and_the_fit_is_the_heads_on_its_hidden_states(tmp_path, run_json):
    folder = tmp_path / "bf16"
    model = lm_folder("llama", folder, dtype=torch.bfloat16)
    path = write_texts(tmp_path / "texts.txt", sampled_texts(model, rows=16, length=16, temperature=0.5))
    saved = tmp_path / "hidden.safetensors"
    fitted = run_json(["fit", "--lm", str(folder), "--text", str(path), "--val-fraction", "1", "--no-write",
                       "--save-hidden", str(saved)])
    assert fitted["lm"]["dtype"] == "bfloat16"
    tensors = load_file(str(saved))
    assert tensors["hidden"].dtype == torch.bfloat16
    assert model.lm_head.weight.dtype == torch.bfloat16
    z = tensors["hidden"].float() @ model.lm_head.weight.detach().float().T  # the head in float32, as the contract says
    assert relative(fitted["temperature"], optimal_temperature(z, tensors["labels"])) < 1e-6


def test_jsonl_texts_max_length_and_a_trained_tokenizer(tmp_path, run_json):
    """A byte-pair tokenizer that starts every text with <s>; --text-field; texts cut at --max-length tokens."""
    folder = tmp_path / "gpt2"
    model = lm_folder("gpt2", folder, tokenizer="bpe")
    tokenizer = load_tokenizer(folder)
    lines = ["the quick brown fox jumps over the lazy dog and then the fox sleeps", "a penny saved",
             "language models predict the next token", "calibration"]
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"id": i, "body": text}) + "\n" for i, text in enumerate(lines)))
    fitted = run_json(["fit", "--lm", str(folder), "--text", str(path), "--text-field", "body", "--max-length", "6",
                       "--val-fraction", "1", "--no-write"])
    lengths = [min(len(tokenizer(text)["input_ids"]), 6) for text in lines]
    assert tokenizer(lines[0])["input_ids"][0] == tokenizer.bos_token_id
    assert fitted["n_fit"] == sum(n - 1 for n in lengths)
    z, y = materialised(model, tokenizer, lines, max_length=6)
    assert relative(fitted["temperature"], optimal_temperature(z, y)) < 1e-6
    assert fitted["lm"]["texts"][0]["texts_at_max_length"] == sum(n == 6 for n in lengths)


def test_eval_texts_run_through_the_same_model(tmp_path, run_json, llama):
    folder, model, path = fresh(tmp_path, llama)
    held_out = sampled_texts(model, rows=10, temperature=0.5, seed=9)
    other = write_texts(tmp_path / "eval.txt", held_out)
    fitted = run_json(["fit", "--lm", str(folder), "--text", str(path), "--eval", str(other), "--no-write"])
    z, y = materialised(model, load_tokenizer(folder), held_out)
    assert fitted["n_eval"] == len(y) and fitted["eval_source"] == f"{folder} on {other}"
    scaled = torch.log_softmax(z / fitted["temperature"], 1)
    assert fitted["after"]["nll"] == pytest.approx(float(-scaled[torch.arange(len(y)), y].mean()), abs=1e-6)


def test_small_batches_and_token_budgets_change_nothing(tmp_path, run_json, llama):
    folder, _, path = fresh(tmp_path, llama)
    one = run_json(["fit", "--lm", str(folder), "--text", str(path), "--no-write"])
    many = run_json(["fit", "--lm", str(folder), "--text", str(path), "--no-write", "--batch-size", "3",
                     "--batch-tokens", "40"])
    assert many["lm"]["texts"][0]["batches"] > one["lm"]["texts"][0]["batches"] == 1
    assert relative(many["temperature"], one["temperature"]) < 1e-6


@pytest.mark.parametrize("flags, shown", [([], True), (["--quiet"], False), (["--json", "-"], False)])
def test_bars_are_asked_for_unless_quiet_or_json_on_standard_output(tmp_path, cli, monkeypatch, llama, flags, shown):
    """The forward pass's bar and each head pass's bar: enabled on a plain run (they then draw on a terminal only)."""
    from tempcal.lm import hidden

    folder, _, path = fresh(tmp_path, llama)
    asked: list[tuple[str, object]] = []
    original = hidden.DelayedBar.__init__

    def recording(self, description, total, unit, *, enabled=True, delay=hidden.DELAY):
        if description:
            asked.append((description, enabled))
        original(self, description, total, unit, enabled=enabled, delay=delay)

    monkeypatch.setattr(hidden.DelayedBar, "__init__", recording)
    code, _, err = cli(["fit", "--lm", str(folder), "--text", str(path), "--no-write", *flags])
    assert code == 0 and err == ""
    assert asked[0][0] == "running model on texts.txt" and any("head: pass 2" in d for d, _ in asked)
    assert {bool(enabled) for _, enabled in asked} == {shown}


@pytest.mark.slow
def test_two_torchrun_processes_each_run_their_share_and_match_one(tmp_path, llama):
    from test_cli_distributed import _torchrun, one_and_two_processes

    if _torchrun() is None:
        pytest.skip("torchrun not installed")
    folder, _, path = fresh(tmp_path, llama)
    one, two = one_and_two_processes(tmp_path, ["fit", "--lm", str(folder), "--text", str(path), "--no-write"])
    assert relative(two["temperature"], one["temperature"]) < 1e-9
    for side in ("before", "after"):
        for key in FIGURES:
            assert two[side][key] == pytest.approx(one[side][key], abs=1e-9), (side, key)
    rows = one["lm"]["texts"][0]["rows"]
    assert two["lm"]["texts"][0]["forward_tokens"] < one["lm"]["texts"][0]["forward_tokens"]  # rank 0's share
    assert two["n_fit"] + two["n_eval"] == rows


def test_a_configuration_file_names_the_model_and_texts(tmp_path, cli, monkeypatch, llama):
    """[fit] lm and text, relative to the file; a top-level source (for other runs) is set aside for --lm."""
    folder, _, _ = fresh(tmp_path, llama)
    save_file({"logits": torch.randn(20, 3), "labels": torch.zeros(20, dtype=torch.int64)},
              str(tmp_path / "logits.safetensors"))
    (tmp_path / "tempcal.toml").write_text('source = "logits.safetensors"\n[fit]\nlm = "model"\ntext = "texts.txt"\n'
                                           'max-length = 12\n')
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(["fit", "--no-write", "--json", "-"])
    assert code == 0, err
    result = json.loads(out)
    assert (tmp_path / result["lm"]["model"]).resolve() == folder.resolve()
    assert result["lm"]["texts"][0]["max_length"] == 12 and result["n_fit"] + result["n_eval"] < 24 * 11
    assert "tempcal.toml" in result["config"]


@needs_cuda
def test_cuda_runs_the_model_and_the_fit_as_the_cpu_does(tmp_path, run_json, llama):
    """On CUDA: several batches through the pinned copies, spilled or not; T as on the CPU (float32, no TF32)."""
    folder, _, path = fresh(tmp_path, llama)
    cpu = run_json(["fit", "--lm", str(folder), "--text", str(path), "--no-write", "--device", "cpu"])
    gpu = run_json(["fit", "--lm", str(folder), "--text", str(path), "--no-write", "--device", "cuda",
                    "--batch-tokens", "64"])
    assert gpu["lm"]["device"].startswith("cuda") and gpu["lm"]["texts"][0]["batches"] > 3
    assert relative(gpu["temperature"], cpu["temperature"]) < 1e-5
    saved = tmp_path / "hidden.safetensors"
    run_json(["fit", "--lm", str(folder), "--text", str(path), "--no-write", "--device", "cuda", "--batch-tokens",
              "64", "--save-hidden", str(saved)])
    on_cpu = tmp_path / "cpu.safetensors"
    run_json(["fit", "--lm", str(folder), "--text", str(path), "--no-write", "--device", "cpu", "--save-hidden",
              str(on_cpu)])
    assert torch.allclose(load_file(str(saved))["hidden"], load_file(str(on_cpu))["hidden"], atol=1e-5)


def test_react_clips_the_models_hidden_states_as_head_does(tmp_path, run_json, llama):
    folder, model, path = fresh(tmp_path, llama)
    ood = write_texts(tmp_path / "ood.txt", sampled_texts(model, rows=10, temperature=3.0, seed=6))
    argv = ["--score", "both", "--tau", "1", "--react", "90"]
    a = run_json(["ood", "--lm", str(folder), "--text", str(path), "--ood-text", str(ood), *argv,
                  "--save-hidden", str(tmp_path / "id.safetensors")])
    run_json(["fit", "--lm", str(folder), "--text", str(ood), "--no-write", "--save-hidden",
              str(tmp_path / "ood.safetensors")])
    b = run_json(["ood", str(tmp_path / "id.safetensors"), "--head", str(folder), "--ood",
                  str(tmp_path / "ood.safetensors"), *argv])
    assert a["react_threshold"] == b["react_threshold"] is not None
    for x, x_ in zip(a["results"], b["results"], strict=True):
        assert x["auroc"] == pytest.approx(x_["auroc"], abs=1e-9) and x["fpr95"] == pytest.approx(x_["fpr95"], abs=1e-9)
