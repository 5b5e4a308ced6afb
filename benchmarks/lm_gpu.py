"""On a GPU: ``tempcal fit --lm`` on a ~600M-parameter model built from a configuration: tokens per second, the
forward pass against a bare loop, and the fit's share of the time.

Nothing is downloaded: a Llama-style model (default d = 1,536, 20 layers, GQA 12/4 heads, MLP 4,096,
V = 32,000: about 0.6B parameters) is initialised at random on the GPU in bfloat16 and saved with
``save_pretrained`` with a word-level tokenizer; ``--sampled`` texts of ``--length`` tokens are sampled
from it at temperature 0.7 (so the fit has a T to find) and repeated up to ``--texts`` texts. Then, timed:

* loading the model as tempcal does (:func:`tempcal.lm.model.load_causal_lm`);
* a bare transformers loop over tempcal's own batches (``model.model(ids, mask)``, the output dropped):
  tokens per second, the floor;
* the whole ``tempcal fit --lm DIR --text FILE --no-write --device cuda`` in this process: its forward
  pass (tokens per second, against the bare loop: target >= 0.9), and the rest of the command (the
  validating scan, the fit, the figures: ``passes`` head evaluations of ``h W^T`` in float32 without TF32)
  as the fit's share; peak GPU memory; where the hidden states were kept;
* the same with the hidden states forced into the temporary file (``TEMPCAL_LM_MEMORY_BYTES=0``): its
  time, and T equal to the in-memory run's.

Writes ``--results`` (Markdown, default ``lm-gpu.md``) and ``--json``. About 3-5 minutes on one H100/H200 with
the defaults; without CUDA it says so and exits 0.

Run: ``python benchmarks/lm_gpu.py [--texts 2048] [--length 1024] [--width 1536] [--layers 20] [--vocab 32000]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch


def build(folder: Path, args):
    """A random Llama in bfloat16 built on the GPU, and a word-level tokenizer, saved in ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.width, intermediate_size=args.mlp,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=max(2048, args.length),
                         torch_dtype="bfloat16")
    with torch.device(args.device):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(folder)
    words = {f"w{i}": i for i in range(args.vocab)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w0").save_pretrained(folder)
    return model


def write_texts(path: Path, model, args) -> None:
    """``--sampled`` texts the model samples at T = 0.7, repeated up to ``--texts`` texts, cut to varied lengths."""
    g = torch.Generator().manual_seed(1)
    start = torch.randint(0, args.vocab, (args.sampled, 1), generator=g).to(args.device)
    torch.manual_seed(1)
    with torch.inference_mode():
        ids = model.generate(start, attention_mask=torch.ones_like(start), do_sample=True, temperature=0.7, top_k=0,
                             max_new_tokens=args.length - 1, min_new_tokens=args.length - 1, pad_token_id=0).cpu()
    lengths = torch.randint(args.length // 4, args.length + 1, (args.texts,), generator=g)
    lines = [" ".join(f"w{i}" for i in ids[k % args.sampled, : int(n)].tolist()) for k, n in enumerate(lengths)]
    path.write_text("\n".join(lines) + "\n")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def bare_loop(folder: Path, texts: Path, batch_tokens: int, device: str) -> dict:
    """The model loaded as tempcal loads it, and a bare loop over tempcal's batches: seconds and tokens/s."""
    from tempcal.lm.forward import plan_batches, tokenize
    from tempcal.lm.model import load_causal_lm
    from tempcal.lm.texts import read_texts

    began = time.perf_counter()
    lm = load_causal_lm(folder, device)
    sync(device)
    load = time.perf_counter() - began
    read = read_texts(texts)
    tokenized = tokenize(lm, read.texts, read.lines, str(texts), args_length(lm))
    batches = plan_batches(tokenized, 0, tokenized.rows, 512, batch_tokens)
    with torch.inference_mode():
        for _ in range(2):  # the first run warms up kernels and the allocator
            sync(device)
            began = time.perf_counter()
            for batch in batches:
                width = len(tokenized.ids[batch[0]])
                ids = torch.zeros(len(batch), width, dtype=torch.int64)
                mask = torch.zeros_like(ids)
                for j, i in enumerate(batch):
                    ids[j, : len(tokenized.ids[i])] = tokenized.ids[i]
                    mask[j, : len(tokenized.ids[i])] = 1
                lm.base(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
            sync(device)
            seconds = time.perf_counter() - began
    out = {"load_seconds": load, "seconds": seconds, "tokens": tokenized.tokens, "batches": len(batches),
           "tokens_per_second": tokenized.tokens / seconds}
    del lm
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def args_length(lm) -> int:
    from tempcal.lm.model import max_length

    return max_length(lm, None)


def command(folder: Path, texts: Path, device: str, *extra: str) -> dict:
    """``tempcal fit --lm`` in this process: its JSON, wall seconds and peak GPU memory."""
    from tempcal.cli.main import main

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    out = io.StringIO()
    began = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(["fit", "--lm", str(folder), "--text", str(texts), "--no-write", "--device", device, "--json", "-",
                     *extra])
    seconds = time.perf_counter() - began
    if code != 0:
        raise SystemExit(f"tempcal fit --lm exited {code}")
    result = json.loads(out.getvalue())
    result["wall_seconds"] = seconds
    result["peak_gpu_bytes"] = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    return result


def summary(args, bare: dict, memory: dict, spilled: dict) -> str:
    run = memory["lm"]["texts"][0]
    forward, total, load = run["forward_seconds"], memory["wall_seconds"], memory["lm"]["load_seconds"]
    rest = total - load - run["tokenize_seconds"] - forward
    ratio = run["tokens_per_second"] / bare["tokens_per_second"]
    rows = [f"# `tempcal fit --lm` on a GPU ({time.strftime('%Y-%m-%d')})", "",
            f"device: {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}; torch {torch.__version__}; "
            f"transformers {__import__('transformers').__version__}", "",
            f"model: random Llama, d = {args.width}, {args.layers} layers, {args.heads}/{args.kv_heads} heads, MLP "
            f"{args.mlp}, V = {args.vocab}, {memory['lm']['dtype']}, {args.params_label} parameters", "",
            f"texts: {run['texts']} ({args.sampled} sampled at T = 0.7, repeated), {run['tokens']:,} tokens, "
            f"{run['rows']:,} rows, {run['batches']} batches of at most {args.batch_tokens} padded tokens, padding "
            f"{run['padding_fraction']:.1%}", "",
            "| what | seconds | tokens/s | note |", "|---|---:|---:|---|",
            f"| load the model (tempcal) | {load:.2f} | | tokenising the texts: {run['tokenize_seconds']:.2f} s |",
            f"| bare loop (base model) | {bare['seconds']:.2f} | {bare['tokens_per_second']:,.0f} | the floor |",
            f"| tempcal forward pass | {forward:.2f} | {run['tokens_per_second']:,.0f} | {ratio:.3f} x the bare loop "
            f"(target >= 0.9: {'met' if ratio >= 0.9 else 'missed'}) |",
            f"| the rest: head check, scan, fit, figures | {rest:.2f} | | {memory['passes']} fit passes; "
            f"{rest / total:.0%} of the command |",
            f"| whole command | {total:.2f} | {run['tokens'] / total:,.0f} | peak GPU memory "
            f"{memory['peak_gpu_bytes'] / 2**30:.1f} GiB; hidden states in {run['hidden_storage']} "
            f"({run['hidden_bytes'] / 2**30:.2f} GiB) |",
            f"| whole command, hidden states spilled | {spilled['wall_seconds']:.2f} | | in "
            f"{spilled['lm']['texts'][0]['hidden_storage']}; T equal: "
            f"{abs(spilled['temperature'] - memory['temperature']) <= 1e-9 * memory['temperature']} |",
            "", f"T = {memory['temperature']:.6f} (fit method {memory['fit_method']}, {memory['passes']} passes)"]
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=2048)
    parser.add_argument("--sampled", type=int, default=256)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--mlp", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch-tokens", type=int, default=65536)
    parser.add_argument("--scratch", default=None, help="folder for the model and texts (default: a temporary one)")
    parser.add_argument("--results", default="lm-gpu.md")
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to try the script with small sizes")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("lm_gpu: no CUDA device here; nothing to measure")
        return
    with tempfile.TemporaryDirectory(dir=args.scratch) as scratch:
        folder, texts = Path(scratch) / "model", Path(scratch) / "texts.txt"
        began = time.perf_counter()
        model = build(folder, args)
        args.params_label = f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B"
        write_texts(texts, model, args)
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
        print(f"built the model and texts in {time.perf_counter() - began:.0f} s", flush=True)
        bare = bare_loop(folder, texts, args.batch_tokens, args.device)
        print(f"bare loop: {bare['tokens_per_second']:,.0f} tokens/s", flush=True)
        extra = ["--batch-tokens", str(args.batch_tokens)]
        memory = command(folder, texts, args.device, *extra)
        os.environ["TEMPCAL_LM_MEMORY_BYTES"] = "0"
        spilled = command(folder, texts, args.device, *extra, "--spill-dir", scratch)
        del os.environ["TEMPCAL_LM_MEMORY_BYTES"]
    text = summary(args, bare, memory, spilled)
    print(text)
    Path(args.results).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"bare": bare, "memory": memory, "spilled": spilled}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
