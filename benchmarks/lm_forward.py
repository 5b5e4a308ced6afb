"""``tempcal fit --lm``'s forward pass against a bare transformers loop over the same batches, and the fit's share.

The forward pass is the cost of calibrating a language model on texts; tempcal adds the batching, the
gathering of each position's final hidden state and its copy into the store. This script builds a
small random Llama from a configuration (no download; default d = 256, 4 layers, V = 8,192, float32) and
a word-level tokenizer, writes random texts of 16 to 256 tokens, and measures in one run, interleaved:

* **bare (base)**: ``model.model(input_ids, attention_mask)`` over tempcal's own padded batches (the same
  texts, lengths and order), the output dropped: the floor;
* **bare (logits)**: ``model(input_ids, attention_mask).logits`` over the same batches: what a user's
  loop computes (the full vocabulary's logits of every position);
* **tempcal**: :func:`tempcal.lm.forward.run_forward` into an in-memory store (building the
  batches, the forward pass, the rows gathered and stored).

It prints tokens per second of each, the ratio tempcal / bare (base) (target: at least 0.9), and then
runs ``tempcal fit --lm DIR --text FILE --no-write`` in this process (the model loaded, the forward
pass, the fit and the figures) for the forward pass's and the fit's shares of the command's time.

Run: ``python benchmarks/lm_forward.py [--texts 256] [--threads 2] [--results benchmarks/results/lm_forward.md]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import machine_lines


def build(folder: Path, width: int, layers: int, vocab: int, seed: int = 0):
    """A random Llama and a word tokenizer (``w0`` .. ``w{vocab - 1}``) saved in ``folder``; the model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=width * 8 // 3,
                         num_hidden_layers=layers, num_attention_heads=max(1, width // 64),
                         num_key_value_heads=max(1, width // 128), max_position_embeddings=1024)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    words = {f"w{i}": i for i in range(vocab)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w0").save_pretrained(folder)
    return model


def write_texts(path: Path, model, count: int, vocab: int, seed: int = 1) -> None:
    """Texts of 16 to 256 tokens the model samples itself at temperature 0.7 (so the fit has a T to find)."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    start = torch.randint(0, vocab, (count, 1), generator=g)
    with torch.inference_mode():
        ids = model.generate(start, attention_mask=torch.ones_like(start), do_sample=True, temperature=0.7, top_k=0,
                             max_new_tokens=255, min_new_tokens=255, pad_token_id=0)
    lengths = torch.randint(16, 257, (count,), generator=g)
    texts = [" ".join(f"w{i}" for i in row[: int(n)].tolist()) for row, n in zip(ids, lengths, strict=True)]
    path.write_text("\n".join(texts) + "\n")


def padded(tokenized, batch: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    width = len(tokenized.ids[batch[0]])
    ids = torch.zeros(len(batch), width, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for j, i in enumerate(batch):
        ids[j, : len(tokenized.ids[i])] = tokenized.ids[i]
        mask[j, : len(tokenized.ids[i])] = 1
    return ids, mask


def bare(model, tokenized, batches, logits: bool) -> tuple[float, float]:
    began, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for batch in batches:
            ids, mask = padded(tokenized, batch)
            if logits:
                model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # noqa: B018
            else:
                model.model(input_ids=ids, attention_mask=mask, use_cache=False)
    return time.perf_counter() - began, time.process_time() - cpu


def timed_tempcal(lm, tokenized, batch_tokens: int) -> tuple[float, float]:
    from tempcal.lm.forward import run_forward
    from tempcal.lm.hidden import HiddenStore

    store = HiddenStore(0, tokenized.rows, lm.head.width, lm.dtype, budget=1 << 40, folder=None)
    began, cpu = time.perf_counter(), time.process_time()
    run_forward(lm, tokenized, store, lo=0, hi=tokenized.rows, batch_size=512, batch_tokens=batch_tokens)
    return time.perf_counter() - began, time.process_time() - cpu


def command_shares(folder: Path, texts: Path) -> dict:
    """The whole command in this process: its time, and the forward pass's share."""
    import contextlib
    import io

    from tempcal.cli.main import main

    out = io.StringIO()
    began = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(["fit", "--lm", str(folder), "--text", str(texts), "--no-write", "--device", "cpu", "--json", "-"])
    total = time.perf_counter() - began
    assert code == 0
    result = json.loads(out.getvalue())
    forward = result["lm"]["texts"][0]["forward_seconds"]
    return {"total": total, "forward": forward, "passes": result["passes"], "rows": result["lm"]["texts"][0]["rows"],
            "temperature": result["temperature"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=128)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", default=None, help="write the table here (Markdown)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from tempcal.lm.forward import plan_batches, tokenize
    from tempcal.lm.model import load_causal_lm
    from tempcal.lm.texts import read_texts

    with tempfile.TemporaryDirectory() as scratch:
        folder, texts_path = Path(scratch) / "model", Path(scratch) / "texts.txt"
        write_texts(texts_path, build(folder, args.width, args.layers, args.vocab), args.texts, args.vocab)
        lm = load_causal_lm(folder, "cpu")
        texts = read_texts(texts_path)
        tokenized = tokenize(lm, texts.texts, texts.lines, str(texts_path), 1024)
        batches = plan_batches(tokenized, 0, tokenized.rows, 512, args.batch_tokens)
        times: dict[str, list[tuple[float, float]]] = {"bare (base)": [], "bare (logits)": [], "tempcal": []}
        timed_tempcal(lm, tokenized, args.batch_tokens)  # warm-up
        for _ in range(args.repeats):
            times["bare (base)"].append(bare(lm.model, tokenized, batches, logits=False))
            times["tempcal"].append(timed_tempcal(lm, tokenized, args.batch_tokens))
            times["bare (logits)"].append(bare(lm.model, tokenized, batches, logits=True))
        shares = command_shares(folder, texts_path)
    report(args, tokenized, batches, times, shares)


def report(args, tokenized, batches, times: dict[str, list[tuple[float, float]]], shares: dict) -> None:
    """The table: wall and CPU seconds (median of the runs), tokens per second, each against bare (base)."""
    tokens = tokenized.tokens
    wall = {name: statistics.median(w for w, _ in values) for name, values in times.items()}
    cpu = {name: statistics.median(c for _, c in values) for name, values in times.items()}
    title = f"# `tempcal fit --lm`: the forward pass against a bare transformers loop ({time.strftime('%Y-%m-%d')})"
    lines = [title, "", *machine_lines(), "",
             f"Model: random Llama, d = {args.width}, {args.layers} layers, V = {args.vocab}, float32, CPU, "
             f"{args.threads} thread(s). {args.texts} texts the model sampled at T = 0.7, {tokens} tokens, "
             f"{len(batches)} batches of at most {args.batch_tokens} padded tokens (longest first). Median of "
             f"{args.repeats} interleaved runs; CPU seconds are this process's (what other jobs on a shared machine "
             "take is not counted).", "",
             "| loop | wall s | CPU s | tokens/s (wall) | tokens/s (CPU) | vs bare (base), wall | vs bare, CPU |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name in times:
        lines.append(f"| {name} | {wall[name]:.3f} | {cpu[name]:.3f} | {tokens / wall[name]:,.0f} | "
                     f"{tokens / cpu[name]:,.0f} | {wall['bare (base)'] / wall[name]:.3f} | "
                     f"{cpu['bare (base)'] / cpu[name]:.3f} |")
    ratio = cpu["bare (base)"] / cpu["tempcal"]
    share = shares["forward"] / shares["total"]
    lines += ["", f"tempcal / bare (base), tokens per CPU second: **{ratio:.3f}** (target >= 0.9: "
              f"{'met' if ratio >= 0.9 else 'missed'})", "",
              f"The whole command (`tempcal fit --lm DIR --text FILE --no-write`, in this process, after the runs "
              f"above): {shares['total']:.2f} s wall, of which the forward pass {shares['forward']:.2f} s "
              f"({share:.0%}); loading, the fit and every figure the rest ({1 - share:.0%}): {shares['passes']} fit "
              f"passes over {shares['rows']} rows x V = {args.vocab}, T = {shares['temperature']:.6f}."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.results:
        Path(args.results).write_text(text)


if __name__ == "__main__":
    main()
