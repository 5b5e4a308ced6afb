"""Tiny causal language models with tokenizers, and the texts and logits the ``--lm`` tests compare against.

Models are built from configurations and saved with ``save_pretrained`` (nothing downloaded); tokenizers
are built in the test with the ``tokenizers`` library and saved beside the model with
``PreTrainedTokenizerFast.save_pretrained``, as a user's checkpoint folder holds them: a word-level
vocabulary ``w0 .. w255`` (token i is the word ``wi``, so sampled token sequences round-trip through text
exactly), or a byte-pair tokenizer trained on a small corpus with a beginning-of-text token.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from model_builders import VOCAB, tiny_model

#: Words of the word-level tokenizer: ``w0`` .. ``w255`` are tokens 0..255, ``<unk>`` is token 256.
WORDS = VOCAB - 1
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a stitch in time saves nine and a penny saved is a penny earned",
    "temperature scaling divides the logits by one number fitted on held out data",
    "calibration means that predicted probabilities match observed frequencies",
    "language models predict the next token from the tokens before it",
    "out of distribution inputs should receive lower confidence than familiar ones",
]


def word_tokenizer(folder: Path) -> None:
    """A word-level tokenizer of ``w0`` .. ``w255`` (and ``<unk>``) saved in ``folder``."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(WORDS)}
    vocab["<unk>"] = WORDS
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>")
    fast.save_pretrained(folder)


def bpe_tokenizer(folder: Path, vocab_size: int = 200) -> None:
    """A byte-pair tokenizer trained on :data:`CORPUS` that starts every text with ``<s>``, saved in ``folder``."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>")
    fast.save_pretrained(folder)


def lm_folder(kind: str, folder: Path, *, tokenizer: str = "words", dtype: torch.dtype | None = None):
    """A tiny model of ``kind`` (``tiny_model``'s kinds, or ``llama-tied``) and a tokenizer, saved in ``folder``."""
    if kind == "llama-tied":
        transformers = pytest.importorskip("transformers")
        torch.manual_seed(0)
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
        model = transformers.LlamaForCausalLM(config).eval()
        model.save_pretrained(folder)
    elif dtype is not None:  # built in float32 elsewhere, saved here in ``dtype``
        model = tiny_model(kind, folder.with_name(folder.name + "-float32")).to(dtype)
        model.save_pretrained(folder)
    else:
        model = tiny_model(kind, folder)
    (word_tokenizer if tokenizer == "words" else bpe_tokenizer)(folder)
    return model


def sampled_texts(model, *, rows: int = 24, length: int = 24, temperature: float = 1.0, seed: int = 1) -> list[str]:
    """Texts of ``w`` words that the model samples itself at ``temperature`` (never ``<unk>``), varied in length."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, WORDS, (rows, 1), generator=g)
    with torch.inference_mode():
        for _ in range(length - 1):
            logits = model(input_ids=ids).logits[:, -1].double()
            logits[:, WORDS:] = -torch.inf
            ids = torch.cat([ids, torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=g)], 1)
    cuts = torch.randint(2, length + 1, (rows,), generator=g)
    return [" ".join(f"w{i}" for i in row[: int(cut)].tolist()) for row, cut in zip(ids, cuts, strict=True)]


def write_texts(path: Path, texts: list[str]) -> Path:
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path


def materialised(model, tokenizer, texts: list[str], max_length: int | None = None):
    """The model's own logits (float64) and next-token labels, text by text, without batching or padding."""
    zs, ys = [], []
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(text)["input_ids"][:max_length]
            if len(ids) < 2:
                continue
            out = model(input_ids=torch.tensor([ids]))
            zs.append(out.logits[0, :-1].double())
            ys.append(torch.tensor(ids[1:]))
    return torch.cat(zs), torch.cat(ys)


def load_tokenizer(folder: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)


# -- the bad-input tests' model and texts (tests/cli/test_cli_lm_bad_input.py, test_cli_model_folders.py) --------
@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A small GPT-2 folder and texts sampled from it, built once per test module."""
    folder = tmp_path_factory.mktemp("gpt2") / "model"
    model = lm_folder("gpt2", folder)
    return folder, sampled_texts(model, rows=8, length=8)


@pytest.fixture
def setup(tmp_path, prepared):
    """A model folder and a texts file of the test's own, in ``tmp_path``."""
    folder = tmp_path / "model"
    shutil.copytree(prepared[0], folder)
    return folder, write_texts(tmp_path / "texts.txt", prepared[1])


def refused(cli, tmp_path, argv: list[str], *details: str) -> str:
    """Run ``argv``: exit status 2, one error line naming ``details``, nothing printed, nothing in ``tmp_path``
    changed; the line."""
    from conftest import assert_one_error_line, snapshot

    before = snapshot(tmp_path)
    code, out, err = cli(argv)
    assert code == 2, err
    line = assert_one_error_line(err, *details)
    assert out == "" and snapshot(tmp_path) == before
    return line
