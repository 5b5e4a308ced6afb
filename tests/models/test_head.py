"""tempcal.models.head: output layers from safetensors files and Hugging Face folders give the models' own logits."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import hidden_and_head
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
