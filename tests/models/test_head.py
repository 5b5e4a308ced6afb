"""tempcal.models.head: output layers from safetensors files and Hugging Face folders give the models' own logits."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from conftest import hidden_and_head, one_line
from model_builders import VOCAB, WIDTH, final_hidden_states, tiny_model
from safetensors.torch import save_file

from tempcal.errors import TempcalError
from tempcal.models.head import load_head


@pytest.mark.parametrize("kind", ["llama", "gpt2", "gemma2", "cohere", "granite"])
def test_hugging_face_folders_give_the_models_own_logits(tmp_path, kind):
    """lm_head (sharded checkpoint), tied embeddings, Gemma 2's soft cap, Cohere's scale, Granite's divisor."""
    model = tiny_model(kind, tmp_path)
    hidden, logits = final_hidden_states(model)
    head = load_head(tmp_path)
    assert head.vocab == VOCAB and head.width == WIDTH
    mine = head.logits(hidden, torch.empty(hidden.shape[0], VOCAB))
    assert torch.allclose(mine, logits, atol=1e-5, rtol=1e-5)
    assert (tmp_path / "model.safetensors.index.json").exists() == (kind == "llama")


def test_a_safetensors_head_in_bfloat16_is_widened_to_float32_a_tile_at_a_time(tmp_path, monkeypatch):
    h, w, b, _ = hidden_and_head(50, 16, 1000, seed=1)
    save_file({"weight": w.bfloat16(), "bias": b}, str(tmp_path / "head.safetensors"))
    monkeypatch.setattr("tempcal.models.head.TILE_ELEMENTS", 16 * 96)  # 96 vocabulary rows a tile, a ragged last
    head = load_head(tmp_path / "head.safetensors")
    assert head.weight.dtype == torch.bfloat16  # kept as stored: memory holds the head once
    z = head.logits(h, torch.empty(50, 1000))
    assert torch.equal(z, h @ w.bfloat16().float().T + b)


def test_softcap_replaces_the_configs(tmp_path):
    tiny_model("gemma2", tmp_path)
    assert load_head(tmp_path).softcap == 2.0
    assert load_head(tmp_path, softcap=5.0).softcap == 5.0
    with pytest.raises(TempcalError, match="softcap -1: expected a number > 0"):
        load_head(tmp_path, softcap=-1)


@pytest.mark.parametrize("config, message", [
    ({"logit_scale": "big"}, "'logit_scale' is 'big', not a positive number"),
    ({"final_logit_softcapping": -2}, "'final_logit_softcapping' is -2, not a positive number"),
])
def test_bad_config_values_are_named(tmp_path, config, message):
    import json

    tiny_model("gpt2", tmp_path)
    stored = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**stored, **config}))
    with pytest.raises(TempcalError, match=message):
        load_head(tmp_path)


def test_a_nan_in_the_bias_is_refused(tmp_path):
    _, w, b, _ = hidden_and_head(10, 8, 40)
    b[5] = math.inf
    save_file({"weight": w, "bias": b}, str(tmp_path / "head.safetensors"))
    with pytest.raises(TempcalError, match=r"the bias holds NaN or inf \(entry 5\)"):
        load_head(tmp_path / "head.safetensors")


# -- hostile JSON in a model folder: one line naming the file and where -----------------------------------------------


@pytest.mark.parametrize("case", ["deep", "deep-index", "digits", "nul", "index-depth-ok", "huge", "huge-index", "fifo",
                                  "shards"])
def test_hostile_config_and_index_files_are_refused_naming_the_place(tmp_path, case):
    """Written as text (json.dumps itself cannot write 100,000 levels or 5,000 digits) or by json.dumps."""
    folder = tmp_path / "m"
    tiny_model("llama" if "index" in case or case in ("nul", "shards") else "gpt2", folder)
    config, index = folder / "config.json", folder / "model.safetensors.index.json"
    stored = config.read_text()
    if case == "deep":  # 100,000 levels inside the config, from column 8 of its third line
        config.write_text('{\n  "model_type": "gpt2",\n  "x": ' + "[" * 100_000 + "]" * 100_000 + "\n}")
        expected = f"{config}: line 3 column {8 + 99}: nested more than 100 levels deep"  # the 101st level
    elif case == "deep-index":
        start = '{"metadata": {}, "weight_map": '
        index.write_text(start + '{"a": ' * 50_000 + "1" + "}" * 50_001)
        expected = f"{index}: line 1 column {len(start) + 1 + 99 * 6}: nested more than 100 levels deep"
    elif case == "index-depth-ok":  # strings with brackets in them do not count
        weight_map = json.loads(index.read_text())["weight_map"]
        index.write_text(json.dumps({"metadata": {"note": "[[[[" * 100}, "weight_map": weight_map}))
        assert load_head(folder).vocab == VOCAB
        return
    elif case == "digits":
        config.write_text(stored.rstrip().rstrip("}") + ',\n  "eos_token_id": ' + "7" * 5000 + "\n}\n")
        line = stored.rstrip().count("\n") + 2
        expected = f"{config}: line {line} column 19: an integer of more than 100 digits"
    elif case == "nul":
        found = json.loads(index.read_text())
        found["weight_map"]["lm_head.weight"] = "model-00001\x00.safetensors"
        index.write_text(json.dumps(found))
        expected = f"{index}: 'weight_map' entry 'lm_head.weight': 'model-00001\\x00.safetensors' is not the name of a"
    elif case == "shards":
        found = json.loads(index.read_text())
        found["weight_map"] = {f"t{i}": f"shard-{i}.safetensors" for i in range(70_000)}
        index.write_text(json.dumps(found))
        expected = f"{index}: 'weight_map' names more than 65536 shard files"
    elif case == "huge":
        with open(config, "r+b") as f:
            f.truncate(16 * 2**20 + 1)  # sparse: nothing is written, nothing should be read
        expected = f"{config}: {16 * 2**20 + 1} bytes, more than the {16 * 2**20} tempcal reads from a config.json"
    elif case == "huge-index":
        with open(index, "r+b") as f:
            f.truncate(64 * 2**20 + 1)
        expected = f"{index}: {64 * 2**20 + 1} bytes, more than the {64 * 2**20} tempcal reads from a {index.name}"
    else:
        config.unlink()
        os.mkfifo(config)
        expected = f"{config}: not a regular file"
    with pytest.raises(TempcalError) as exc:
        load_head(folder)
    assert one_line(exc).startswith(expected), one_line(exc)
