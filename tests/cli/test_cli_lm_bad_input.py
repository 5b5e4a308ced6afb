"""Bad input to --lm (folders, texts, options): exit status 2, one line naming what and where, nothing written."""

from __future__ import annotations

import json
import shutil
import sys

import lm_builders
import pytest
import torch
from lm_builders import refused, word_tokenizer, write_texts
from safetensors.torch import save_file

transformers = pytest.importorskip("transformers")
prepared, setup = lm_builders.prepared, lm_builders.setup  # fixtures: a model folder and texts of its own


def test_without_transformers_the_error_names_the_extra(tmp_path, cli, setup, monkeypatch):
    folder, texts = setup
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    refused(cli, tmp_path, ["fit", "--lm", str(folder), "--text", str(texts)], "--lm needs transformers",
            "pip install 'tempcal[lm]'")


@pytest.mark.parametrize("case, details", [
    ("missing", ["no such folder"]),
    ("file", ["not a folder"]),
    ("empty", ["no config.json"]),
    ("pickle-weights", ["no model.safetensors", "safetensors weights only"]),
    ("no-tokenizer", ["no tokenizer"]),
    ("outside-link", ["tokenizer.json: a link to", "outside"]),
    ("not-causal", ["not a causal language model", "'vit'"]),
    ("bad-config", ["config.json", "line 1 column"]),
])
def test_folders_that_hold_no_causal_lm_are_refused(tmp_path, cli, setup, case, details):
    folder, texts = setup
    target = tmp_path / "other"
    if case == "file":
        target.write_text("{}")
    elif case == "empty":
        target.mkdir()
    elif case == "pickle-weights":
        transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=40, n_embd=8, n_layer=1, n_head=2)
                                     ).save_pretrained(target, safe_serialization=False)
        word_tokenizer(target)
        for name in target.glob("*.safetensors"):
            name.unlink()
    elif case == "no-tokenizer":
        shutil.copytree(folder, target)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (target / name).unlink()
    elif case == "outside-link":
        shutil.copytree(folder, target)
        (tmp_path / "elsewhere.json").write_bytes((target / "tokenizer.json").read_bytes())
        (target / "tokenizer.json").unlink()
        (target / "tokenizer.json").symlink_to(tmp_path / "elsewhere.json")
    elif case == "not-causal":
        config = transformers.ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=8, image_size=8, patch_size=4)
        transformers.ViTModel(config).save_pretrained(target)
        word_tokenizer(target)
    elif case == "bad-config":
        shutil.copytree(folder, target)
        (target / "config.json").write_text("{ not json")
    refused(cli, tmp_path, ["fit", "--lm", str(target), "--text", str(texts)], *details)


@pytest.mark.parametrize("name, content, details", [
    ("empty.txt", b"", ["empty.txt: holds no text"]),
    ("blank.txt", b"\n  \n\t\n", ["holds no text", "only blank lines"]),
    ("latin1.txt", "w1 w2\nw3 w4\nw5 caf\u00e9 w6\n".encode("latin-1"), ["latin1.txt: line 3: not UTF-8 text (byte 7"]),
    ("texts.csv", b"w1 w2\n", ["not a text file", "'.csv'"]),
    ("bad.jsonl", b'{"text": "w1 w2"}\n{"text": w3}\n', ["bad.jsonl: line 2: not valid JSON"]),
    ("field.jsonl", b'{"text": "w1 w2"}\n{"body": "w3 w4"}\n', ["field.jsonl: line 2: no field 'text'", "'body'",
                                                              "--text-field"]),
    ("number.jsonl", b'{"text": 7}\n', ["number.jsonl: line 1: 'text' is 7, not a string"]),
    ("array.jsonl", b'["w1 w2"]\n', ["array.jsonl: line 1: a JSON array, not an object"]),
    ("short.txt", b"w1\nw2\n", ["short.txt: no text has two tokens"]),
])
def test_text_files_that_hold_no_texts_are_refused(tmp_path, cli, setup, name, content, details):
    folder, _ = setup
    path = tmp_path / name
    path.write_bytes(content)
    refused(cli, tmp_path, ["fit", "--lm", str(folder), "--text", str(path)], *details)


def test_tokens_outside_the_models_vocabulary_name_the_line(tmp_path, cli):
    folder = tmp_path / "small"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=100, n_embd=8, n_layer=1, n_head=2)
                                 ).save_pretrained(folder)
    word_tokenizer(folder)  # 257 words for a model of 100
    texts = write_texts(tmp_path / "texts.txt", ["w1 w2 w3", "w4 w150 w5"])
    refused(cli, tmp_path, ["fit", "--lm", str(folder), "--text", str(texts)],
            "texts.txt: line 2: token id 150 is outside the vocabulary", "(V = 100)")


@pytest.mark.parametrize("argv, details", [
    (["fit", "SRC", "--lm", "{m}", "--text", "{t}"], ["--lm runs MODEL over --text FILE: give no SOURCE"]),
    (["fit", "SRC", "--text", "{t}"], ["--text applies to a language model run with --lm MODEL"]),
    (["report", "SRC", "--max-length", "8", "--save-hidden", "h.safetensors"],
     ["--max-length, --save-hidden apply to a language model run"]),
    (["fit", "--lm", "{m}"], ["--lm MODEL needs --text FILE"]),
    (["ood", "--lm", "{m}", "--text", "{t}", "--ood", "SRC"], ["--ood takes logits files", "--ood-text FILE"]),
    (["ood", "--lm", "{m}", "--text", "{t}"], ["missing option '--ood-text FILE'"]),
    (["ood", "SRC", "--ood", "SRC", "--ood-text", "{t}"], ["--ood-text applies to a language model run"]),
    (["fit", "--lm", "{m}", "--text", "{t}", "--write-generation-config", "--no-write"], ["contradict"]),
    (["fit", "--lm", "{m}", "--text", "{t}", "--probs"], ["--probs applies to logits files"]),
    (["fit", "--lm", "{m}", "--text", "{t}", "--head", "{m}"], ["drop --head"]),
    (["fit", "--lm", "{m}", "--text", "{t}", "--max-length", "5000"], ["--max-length 5000: more than the 1024"]),
    (["fit", "--lm", "{m}", "--text", "{t}", "--max-length", "1"], ["--max-length"]),
    (["fit", "--lm", "{m}", "--text", "{t}", "--spill-dir", "{t}"], ["--spill-dir", "not a folder"]),
    (["fit", "--text-field", "body", "SRC"], ["--text-field applies to a language model run"]),
])
def test_options_that_do_not_fit_together_are_refused(tmp_path, cli, setup, argv, details):
    folder, texts = setup
    source = tmp_path / "logits.safetensors"
    save_file({"logits": torch.randn(10, 3), "labels": torch.zeros(10, dtype=torch.int64)}, str(source))
    args = [a.replace("{m}", str(folder)).replace("{t}", str(texts)).replace("SRC", str(source)) for a in argv]
    refused(cli, tmp_path, args, *details)


def test_a_broken_record_is_replaced_by_a_fit_and_refused_by_report(tmp_path, cli, setup):
    folder, texts = setup
    (folder / "tempcal.json").write_text(json.dumps({"temperature": "hot"}))
    refused(cli, tmp_path, ["report", "--lm", str(folder), "--text", str(texts)], "tempcal.json: not a tempcal record")
    code, _, err = cli(["fit", "--lm", str(folder), "--text", str(texts), "--quiet"])
    assert code == 0, err
    assert json.loads((folder / "tempcal.json").read_text())["temperature"] > 0
