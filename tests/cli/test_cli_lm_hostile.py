"""Hostile model folders for --lm: nothing fetched, nothing unpickled, no weight filled at random, side files bounded,
no traceback (exit status 2 and one line, nothing written)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import time

import pytest
from conftest import Evil, assert_one_error_line, snapshot
from lm_builders import lm_folder, sampled_texts, write_texts

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    model = lm_folder("gpt2", base / "gpt2")
    lm_folder("llama-tied", base / "tied")
    lm_folder("llama", base / "llama")  # sharded: model.safetensors.index.json
    return base, sampled_texts(model, rows=8, length=8)


@pytest.fixture
def folders(tmp_path, prepared):
    """Copies of the prepared model folders (``gpt2``, ``tied``, ``llama``) and a texts file."""
    for name in ("gpt2", "tied", "llama"):
        shutil.copytree(prepared[0] / name, tmp_path / name)
    return tmp_path, write_texts(tmp_path / "texts.txt", prepared[1])


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def listing(folder):
    """Every file under ``folder`` by size and time of change: a snapshot that does not read sparse giants."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def refused(cli, tmp_path, argv, *details, light=False):
    look = listing if light else snapshot
    before = look(tmp_path)
    code, out, err = cli(argv)
    assert code == 2, err
    line = assert_one_error_line(err, *details)
    assert out == "" and look(tmp_path) == before
    assert "trust_remote_code=True" not in line
    return line


@pytest.mark.parametrize("changes, details", [
    ({"attn_implementation": "kernels-community/flash-attn"}, ["'attn_implementation'", "a hub kernel"]),
    ({"_attn_implementation": "flash_attention_2"}, ["'_attn_implementation'", "not one transformers runs locally"]),
    ({"text_config": {"attn_implementation": "org/name"}}, ["'text_config.attn_implementation'", "hub kernel"]),
    ({"attn_implementation": {"": "sdpa", "vision_config": "org/kernel"}}, ["'attn_implementation'", "'org/kernel'"]),
    ({"experts_implementation": "deepgemm"}, ["'experts_implementation'"]),
    ({"auto_map": {"AutoModelForCausalLM": "modeling.Evil"}}, ["'auto_map' asks for code"]),
    ({"trust_remote_code": True}, ["'trust_remote_code' asks for code"]),
    ({"n_layer": 100_000}, ["'n_layer' is 100000, more than the 1024"]),
])
def test_configs_that_name_code_kernels_or_huge_counts_are_refused(tmp_path, cli, folders, changes, details):
    base, texts = folders
    edit_json(base / "gpt2" / "config.json", **changes)
    began = time.perf_counter()
    refused(cli, tmp_path, ["fit", "--lm", str(base / "gpt2"), "--text", str(texts)], *details)
    assert time.perf_counter() - began < 30


def test_a_tokenizer_config_naming_code_is_refused(tmp_path, cli, folders):
    base, texts = folders
    edit_json(base / "gpt2" / "tokenizer_config.json", auto_map={"AutoTokenizer": ["tok.Evil", None]})
    refused(cli, tmp_path, ["fit", "--lm", str(base / "gpt2"), "--text", str(texts)],
            "tokenizer_config.json: 'auto_map' asks for code")


def test_nothing_reaches_the_network(tmp_path, cli, folders, monkeypatch):
    """Every offline switch is set while transformers loads, and no socket connects during a whole fit."""
    base, texts = folders
    import huggingface_hub.constants as hub

    seen = []
    load = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.append((hub.HF_HUB_OFFLINE, os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"),
                     os.environ.get("HF_DATASETS_OFFLINE")))
        return load(*args, **kwargs)

    def no_network(*args, **kwargs):
        raise AssertionError(f"a socket connected: {args}")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    was = hub.HF_HUB_OFFLINE
    code, _, err = cli(["fit", "--lm", str(base / "gpt2"), "--text", str(texts), "--no-write", "--quiet"])
    assert code == 0, err
    assert seen == [(True, "1", "1", "1")]
    assert was == hub.HF_HUB_OFFLINE  # restored for the rest of the process


@pytest.mark.parametrize("shard", ["pytorch_model-00001.bin", "model.pt", "weights.ckpt"])
def test_an_index_naming_a_pickle_is_refused_before_it_is_read(tmp_path, cli, folders, shard, monkeypatch):
    base, texts = folders
    folder = base / "llama"
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = shard
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    marker = tmp_path / "unpickled.marker"
    (folder / shard).write_bytes(pickle.dumps(Evil(marker)))
    monkeypatch.chdir(tmp_path)
    refused(cli, tmp_path, ["fit", "--lm", str(folder), "--text", str(texts)], f"'{shard}'",
            "not a .safetensors file", "never unpickles")
    assert not marker.exists()


def test_a_config_asking_for_more_layers_than_the_checkpoint_holds_is_refused(tmp_path, cli, folders):
    base, texts = folders
    edit_json(base / "gpt2" / "config.json", n_layer=2)
    refused(cli, tmp_path, ["fit", "--lm", str(base / "gpt2"), "--text", str(texts)],
            "the checkpoint has no 'transformer.h.1.", "not fill missing weights at random")


def test_untied_embeddings_without_an_output_layer_are_refused(tmp_path, cli, folders):
    base, texts = folders
    code, _, err = cli(["fit", "--lm", str(base / "tied"), "--text", str(texts), "--no-write", "--quiet"])
    assert code == 0, err  # tied: the checkpoint holds the embedding only, and that is the output layer
    edit_json(base / "tied" / "config.json", tie_word_embeddings=False)
    refused(cli, tmp_path, ["fit", "--lm", str(base / "tied"), "--text", str(texts)],
            "the checkpoint has no 'lm_head.weight'")


def test_a_config_larger_than_the_checkpoint_is_refused_before_allocating(tmp_path, cli, folders):
    base, texts = folders
    edit_json(base / "gpt2" / "config.json", n_embd=1 << 20)
    refused(cli, tmp_path, ["fit", "--lm", str(base / "gpt2"), "--text", str(texts)], "has shape [",
            "but config.json asks for [")


@pytest.mark.parametrize("name, size", [("tokenizer.json", (256 << 20) + 1),
                                        ("tokenizer_config.json", (16 << 20) + 1),
                                        ("special_tokens_map.json", 2 << 30)])
def test_side_files_are_bounded(tmp_path, cli, folders, name, size):
    base, texts = folders
    path = base / "gpt2" / name
    with open(path, "ab") as f:
        f.truncate(size)  # sparse: no disk used
    refused(cli, tmp_path, ["fit", "--lm", str(base / "gpt2"), "--text", str(texts)], f"{name}: ",
            "more than the", "side file", light=True)


class PanicException(BaseException):
    """What the tokenizers library raises when it panics (pyo3's PanicException is a BaseException)."""


@pytest.mark.parametrize("where", ["load", "encode"])
def test_a_tokenizer_panic_is_one_line(tmp_path, cli, folders, monkeypatch, where):
    base, texts = folders
    if where == "load":
        def panic(*args, **kwargs):
            raise PanicException("called `Result::unwrap()` on an `Err` value")

        monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", panic)
        detail = "cannot load the tokenizer"
    else:
        def panic(self, *args, **kwargs):
            raise PanicException("regex panicked")

        monkeypatch.setattr(transformers.PreTrainedTokenizerFast, "__call__", panic)
        detail = "the tokenizer of"
    refused(cli, tmp_path, ["fit", "--lm", str(base / "gpt2"), "--text", str(texts)], detail, "panicked"
            if where == "encode" else "unwrap")


def test_a_huge_line_is_cut_before_it_is_tokenised(tmp_path, cli, folders, monkeypatch):
    """A line of 1.2 MB with --max-length 16: the tokenizer sees at most 64 characters a token, and the figures equal
    those of the same file with that line replaced by its first 16 words."""
    base, texts = folders
    lines = texts.read_text().splitlines()
    words = [f"w{i % 200}" for i in range(200_000)]
    long_file = write_texts(tmp_path / "long.txt", [lines[0], " ".join(words), *lines[1:]])
    short_file = write_texts(tmp_path / "short.txt", [lines[0], " ".join(words[:16]), *lines[1:]])
    seen: list[int] = []
    call = transformers.PreTrainedTokenizerFast.__call__

    def spy(self, text, *args, **kwargs):
        seen.append(max(len(t) for t in ([text] if isinstance(text, str) else text)))
        return call(self, text, *args, **kwargs)

    monkeypatch.setattr(transformers.PreTrainedTokenizerFast, "__call__", spy)
    results = []
    for path in (long_file, short_file):
        code, out, err = cli(["fit", "--lm", str(base / "gpt2"), "--text", str(path), "--max-length", "16",
                              "--no-write", "--json", "-"])
        assert code == 0, err
        results.append(json.loads(out))
    assert max(seen) <= 64 * 17
    long_run, short_run = (r["lm"]["texts"][0] for r in results)
    assert long_run["texts_cut"] == 1 and short_run["texts_cut"] == 0
    assert long_run["rows"] == short_run["rows"]
    for key in ("nll", "ece", "brier", "accuracy"):
        assert results[0]["before"][key] == pytest.approx(results[1]["before"][key], rel=1e-9)
    assert "before tokenising" not in err
