"""tempcal.lm.model and tempcal.lm.forward: a local folder loaded without running its code; one batched forward pass."""

from __future__ import annotations

import json

import pytest
import torch
from lm_builders import lm_folder, load_tokenizer, sampled_texts

from tempcal.errors import TempcalError
from tempcal.lm.forward import plan_batches, run_forward, tokenize
from tempcal.lm.hidden import HiddenStore
from tempcal.lm.model import check_head, load_causal_lm

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2") / "model"
    model = lm_folder("gpt2", folder)
    return folder, model, sampled_texts(model, rows=12, length=20, seed=4)


def test_batched_padded_hidden_states_are_each_texts_own(gpt2):
    """Every row equals the model's last hidden state for the text alone (no padding, no neighbours)."""
    folder, model, texts = gpt2
    lm = load_causal_lm(folder, "cpu")
    tokenized = tokenize(lm, texts, list(range(1, len(texts) + 1)), "texts", 64)
    store = HiddenStore(0, tokenized.rows, lm.head.width, lm.dtype, budget=1 << 30, folder=None)
    stats = run_forward(lm, tokenized, store, lo=0, hi=tokenized.rows, batch_size=4, batch_tokens=60)
    assert stats.batches >= 3 and stats.tokens == tokenized.tokens
    tokenizer = load_tokenizer(folder)
    rows, labels = [], []
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(text)["input_ids"]
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
            rows.append(out.hidden_states[-1][0, :-1])
            labels.extend(ids[1:])
    assert torch.allclose(store.tensor(), torch.cat(rows), atol=1e-5, rtol=1e-5)
    assert tokenized.labels.tolist() == labels


def test_batches_run_longest_first_within_both_caps(gpt2):
    folder, _, texts = gpt2
    lm = load_causal_lm(folder, "cpu")
    tokenized = tokenize(lm, texts, list(range(len(texts))), "texts", 64)
    lengths = [len(t) for t in tokenized.ids]
    batches = plan_batches(tokenized, 0, tokenized.rows, 3, 50)
    order = [i for batch in batches for i in batch]
    assert sorted(order) == list(range(len(texts)))
    assert [lengths[i] for i in order] == sorted(lengths, reverse=True)
    for batch in batches:
        assert len(batch) <= 3 and (len(batch) == 1 or len(batch) * lengths[batch[0]] <= 50)
    lo, hi = int(tokenized.starts[5]) + 1, int(tokenized.starts[8]) - 1  # a share that cuts texts 5 and 7
    assert sorted(i for b in plan_batches(tokenized, lo, hi, 3, 50) for i in b) == [5, 6, 7]


def test_a_head_that_does_not_give_the_models_logits_is_refused(gpt2):
    folder, _, _ = gpt2
    lm = load_causal_lm(folder, "cpu")
    ids = list(range(10))
    assert check_head(lm, ids) < 1e-5
    lm.head.scale = 0.5  # as if the model scaled its logits in a way tempcal does not know
    with pytest.raises(TempcalError, match="the model's logits are not its output layer applied"):
        check_head(lm, ids)


def test_gemma2s_soft_cap_and_the_models_dtype_are_kept(tmp_path):
    folder = tmp_path / "gemma"
    lm_folder("gemma2", folder)
    lm = load_causal_lm(folder, "cpu")
    assert lm.head.softcap == 2.0 and lm.dtype == torch.float32
    assert check_head(lm, list(range(12))) < 1e-5


def test_code_in_the_folder_is_never_run(tmp_path):
    """A configuration asking for the folder's own modelling code (auto_map) is refused; the code never runs."""
    folder = tmp_path / "remote"
    lm_folder("gpt2", folder)
    marker = tmp_path / "ran.marker"
    (folder / "configuration_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="evil", auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                                               "AutoModelForCausalLM": "configuration_evil.EvilModel"})
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(TempcalError, match=r"config.json: 'auto_map' asks for code") as caught:
        load_causal_lm(folder, "cpu")
    assert not marker.exists() and "trust_remote_code=True" not in str(caught.value)


def test_loading_prints_nothing(tmp_path, capfd):
    folder = tmp_path / "llama"
    lm_folder("llama", folder)
    capfd.readouterr()
    load_causal_lm(folder, "cpu")
    out, err = capfd.readouterr()
    assert out == "" and err == ""
