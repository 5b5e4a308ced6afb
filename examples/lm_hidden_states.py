"""A language model calibrated on texts: a demo to try ``tempcal fit --lm``, and hidden states kept for ``--head``.

tempcal runs a causal language model itself (``pip install 'tempcal[lm]'``)::

    tempcal fit --lm MODEL_DIR --text texts.txt

This script is a thin caller of the same library code, for two things the command does not do alone:

* ``--demo DIR`` builds a tiny randomly initialised Llama-style model and a word-level tokenizer in DIR
  (nothing downloaded), and ``DIR/texts.txt``: texts the model samples itself at temperature 0.25, so the
  fitted T should come out near 0.25, the whole path on an answer known in advance;
* ``MODEL_DIR TEXTS OUT`` writes the final hidden states and next-token labels to OUT (what
  ``tempcal fit --lm MODEL_DIR --text TEXTS --save-hidden OUT`` keeps), a SOURCE for later
  ``tempcal fit OUT --head MODEL_DIR`` runs.

Multiple-choice prompts are calibrated from lm-evaluation-harness logs instead (``tempcal fit samples_*.jsonl``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

#: ``--demo`` samples its texts from the model at this temperature: the T the fit should find.
DEMO_TEMPERATURE = 0.25
#: The demo's words ``w0`` .. ``w511`` are its tokens 0..511; ``<unk>`` is token 512.
DEMO_WORDS = 512


def tiny_model(folder: str | Path, seed: int = 0):
    """A small randomly initialised Llama-style model and a word-level tokenizer saved in ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=DEMO_WORDS + 1, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    vocab = {f"w{i}": i for i in range(DEMO_WORDS)} | {"<unk>": DEMO_WORDS}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>").save_pretrained(folder)
    return model


@torch.inference_mode()
def sample_texts(model, *, rows: int, length: int, temperature: float, seed: int = 1) -> list[str]:
    """Texts the model samples itself from ``softmax(logits / temperature)`` (no top-k or top-p, never ``<unk>``),
    so a temperature fitted on them recovers ``temperature``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, DEMO_WORDS, (rows, 1), generator=g)
    for _ in range(length - 1):
        logits = model(input_ids=ids).logits[:, -1].double()
        logits[:, DEMO_WORDS:] = -torch.inf
        ids = torch.cat([ids, torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=g)], 1)
    return [" ".join(f"w{i}" for i in row) for row in ids.tolist()]


def demo(folder: Path) -> None:
    model = tiny_model(folder)
    texts = folder / "texts.txt"
    texts.write_text("\n".join(sample_texts(model, rows=64, length=32, temperature=DEMO_TEMPERATURE)) + "\n")
    print(f"wrote a tiny model and {texts}: texts the model itself sampled at temperature {DEMO_TEMPERATURE}, so the "
          f"fit should find T near {DEMO_TEMPERATURE}; now run:\n"
          f"  tempcal fit --lm {folder} --text {texts} --val-fraction 1.0")


def save_hidden_states(model: str, texts: str, out: str, *, max_length: int | None, device: str) -> None:
    """The model over the texts, through tempcal's own source, and its rows kept as a ``--head`` SOURCE."""
    from tempcal.sources.registry import open_source

    opened = open_source(texts, lm=model, max_length=max_length, device=device)
    path = opened.save_hidden(out)  # type: ignore[attr-defined]
    print(f"wrote {path} ({opened.data.num_samples} rows); now run: tempcal fit {path} --head {model}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", help="a Hugging Face model folder")
    parser.add_argument("texts", nargs="?", help="a text file: .txt (one text per line) or .jsonl (field 'text')")
    parser.add_argument("out", nargs="?", default="hidden.safetensors", help="where to write the rows")
    parser.add_argument("--max-length", type=int, default=None, help="tokens per text (default: the model's limit)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--demo", metavar="DIR", help="build a tiny random model and texts it sampled in DIR")
    args = parser.parse_args()
    if args.demo:
        demo(Path(args.demo))
    elif args.model and args.texts:
        save_hidden_states(args.model, args.texts, args.out, max_length=args.max_length, device=args.device)
    else:
        parser.error("give MODEL and TEXTS, or --demo DIR")


if __name__ == "__main__":
    main()
