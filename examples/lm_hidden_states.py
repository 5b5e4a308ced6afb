"""Dump a causal language model's final hidden states and labels, for ``tempcal fit hidden.safetensors --head MODEL``.

A language model's logits are too large to save (100,000 tokens x a 128,000-token vocabulary is
51 GB in float32); its final hidden states are 16-64 times smaller, and tempcal computes the logits
from them and the output layer block by block. Two ways to choose the rows:

* ``next-token``: every position of every text, labelled with the next token (padding and the
  last position of each text get label -100, which tempcal skips);
* ``multiple-choice``: one row per question, the hidden state at the prompt's last token, labelled
  with the answer's first token (the logits then range over the whole vocabulary).

Needs ``transformers`` (``pip install transformers``). Usage::

    python examples/lm_hidden_states.py MODEL_DIR texts.txt hidden.safetensors
    tempcal fit hidden.safetensors --head MODEL_DIR

``MODEL_DIR`` is a Hugging Face model folder (``save_pretrained`` with safetensors weights) or a hub
name; ``texts.txt`` holds one text per line. ``--demo DIR`` builds a tiny randomly initialised
model from a configuration (nothing downloaded) and texts that model samples itself at temperature 0.25,
so the fitted T should come out near 0.25: the whole path on an answer known in advance.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

IGNORE_INDEX = -100
#: ``--demo`` samples its texts from the model at this temperature: the T the fit should find.
DEMO_TEMPERATURE = 0.25


@torch.inference_mode()
def next_token_rows(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Final hidden states ``[B, L, d]`` and next-token labels ``[B, L]`` (-100 where there is no next token)."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    hidden = out.hidden_states[-1]  # the output layer's input: after the final norm
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, :-1] = input_ids[:, 1:]
    if attention_mask is not None:
        labels[:, :-1][attention_mask[:, 1:] == 0] = IGNORE_INDEX
    return hidden, labels


@torch.inference_mode()
def multiple_choice_rows(model, prompts: Sequence[torch.Tensor], answers: Sequence[int]
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """One row per question: the hidden state at the prompt's last token ``[N, d]``, and the answer's token ``[N]``."""
    rows = []
    for ids in prompts:
        out = model(input_ids=ids[None], output_hidden_states=True)
        rows.append(out.hidden_states[-1][0, -1])
    return torch.stack(rows), torch.as_tensor(answers, dtype=torch.int64)


def save_rows(path: str | Path, hidden: torch.Tensor, labels: torch.Tensor, **metadata: str) -> None:
    """Write ``hidden`` and ``labels`` as the SOURCE of ``tempcal fit --head``."""
    save_file({"hidden": hidden.contiguous(), "labels": labels.to(torch.int64).contiguous()}, str(path),
              metadata=metadata or None)


def tiny_model(folder: str | Path, vocab_size: int = 512, seed: int = 0):
    """A small randomly initialised Llama-style model saved in ``folder`` (no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


@torch.inference_mode()
def sample_texts(model, *, rows: int, length: int, temperature: float, seed: int = 1) -> torch.Tensor:
    """Token sequences ``[rows, length]`` the model samples itself from ``softmax(logits / temperature)``.

    Every next token is drawn from the model's own distribution at ``temperature`` (no top-k or top-p), so a
    temperature fitted on these texts recovers ``temperature``: a demo whose answer is known.
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (rows, 1), generator=g)
    for _ in range(length - 1):
        logits = model(input_ids=ids).logits[:, -1].double()
        ids = torch.cat([ids, torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=g)], 1)
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", help="Hugging Face model folder or hub name")
    parser.add_argument("texts", nargs="?", help="a text file, one text per line")
    parser.add_argument("out", nargs="?", default="hidden.safetensors", help="where to write the rows")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--demo", metavar="DIR",
                        help="build a tiny random model in DIR and dump texts it samples at a known temperature")
    args = parser.parse_args()
    if args.demo:
        model = tiny_model(args.demo)
        ids = sample_texts(model, rows=32, length=32, temperature=DEMO_TEMPERATURE)
        hidden, labels = next_token_rows(model, ids)
        out = Path(args.demo) / "hidden.safetensors"
        save_rows(out, hidden, labels, model=str(args.demo), sampled_at=str(DEMO_TEMPERATURE))
        print(f"wrote {out}: texts the model itself sampled at temperature {DEMO_TEMPERATURE}, so the fit should "
              f"find T near {DEMO_TEMPERATURE}; now run: tempcal fit {out} --head {args.demo} --val-fraction 1.0")
        return
    if not (args.model and args.texts):
        parser.error("give MODEL and TEXTS, or --demo DIR")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    texts = [line for line in Path(args.texts).read_text(encoding="utf-8").splitlines() if line.strip()]
    batch = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=args.max_length)
    hidden, labels = next_token_rows(model, batch["input_ids"], batch["attention_mask"])
    save_rows(args.out, hidden, labels, model=str(args.model))
    print(f"wrote {args.out}; now run: tempcal fit {args.out} --head {args.model}")


if __name__ == "__main__":
    main()
