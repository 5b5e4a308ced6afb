"""``tempcal help [TOPIC]``: every option of a command, or a short text on one topic with the options it concerns
(read from the commands' panel of its name, so that the list stays true)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from ..errors import TempcalError
from .help_format import (
    TOPICS,
    HelpCommand,
    command_help,
    grouped,
    help_console,
    help_of,
    names,
    panel,
    paragraphs,
    prose,
    render,
    spaced,
)

#: Other names a topic answers to (lower case).
ALIASES = {
    "format": "formats", "input": "formats", "inputs": "formats", "input-formats": "formats",
    "model": "models", "language-models": "lm", "llm": "lm", "llms": "lm", "lm-eval": "lm",
    "configuration": "config", "tempcal.toml": "config", "gpu": "scale", "gpus": "scale", "torchrun": "scale",
    "exit": "exit-codes", "exit-code": "exit-codes", "exit-status": "exit-codes", "gates": "exit-codes",
}
COMMANDS = ("fit", "report", "ood")

# A topic: its title, the docs page, the panel whose options it lists, then its blocks: a paragraph (a string),
# a ("code", text) block shown as written, or a ("rows", [(term, text), ...]) list.
TOPIC_TEXTS: dict[str, tuple[str, str, str, list[Any]]] = {
    "formats": ("Input formats: SOURCE, --eval and --ood", "docs/formats.md", "Input", [
        ("rows", [
            (".safetensors", "'logits' [N, C] of any float dtype ([N] or [N, 1]: one binary logit; [B, L, V]: "
                             "token logits with labels [B, L]) and integer 'labels' [N]. T is stored in the "
                             "file's metadata, tempcal.temperature."),
            (".npz", "the same keys name the arrays (netcal's predictions / ground_truth too)."),
            (".npy", "logits.npy and its labels sibling (val_logits.npy -> val_labels.npy), or --labels-key "
                     "PATH.npy."),
            (".pt, .pth", "a dict of tensors (a model under these names is a model SOURCE)."),
            ("samples_*.jsonl", "an lm-evaluation-harness log (.gz too); lighteval's and inspect_ai's logs "
                                "too: tempcal help lm."),
            (".csv, .jsonl", "a confidence table (.parquet too): --confidence COLUMN, --correct COLUMN (0/1); "
                             "one binary row each."),
            (".pt2, .onnx, .ts", "a model, run over --inputs DATA: see tempcal help models."),
        ]),
        "Files other than .safetensors keep T in the sidecar FILE.tempcal.json, which records the file's size, "
        "mtime and SHA-256: a T stored for a file that changed since is ignored, with a warning. Nothing is "
        "unpickled: .npz and .npy are read with allow_pickle=False, .pt with weights_only=True.",
        "NaN and +inf logits are bad input; -inf means the class is impossible, unless it fills a row or holds "
        "the true class. Several files, or a quoted glob, are shards of one SOURCE (tempcal help scale); hidden "
        "states with --head HEAD are another kind of SOURCE (tempcal help lm).",
    ]),
    "models": ("Models as SOURCE", "docs/models.md", "Models", [
        "A model SOURCE is run over --inputs DATA.safetensors ('inputs' [N, ...] and integer 'labels' [N]) in "
        "batches of --batch-size on --device, in eval mode under torch.inference_mode, TF32 off. Three formats, "
        "in the order to prefer them:",
        ("rows", [
            (".pt2", "an exported program (torch.export.save), with a dynamic batch size."),
            (".onnx", "run with onnxruntime: pip install 'tempcal[onnx]'; --output-key NAME picks the logits "
                      "among several outputs."),
            (".pt, .ts ...", "TorchScript (.pt, .pth, .ts, .torchscript): deprecated by torch, still read."),
        ]),
        "Loading a model never runs code from the file: a .pt2 archive's members are checked before torch sees "
        "them, an ONNX model's external data must lie in its folder, and a pickle is never unpickled.",
        "fit --save-model PATH writes the model calibrated (its logits divided by T) in the format of PATH's "
        "suffix: .pt2 from a .pt2 or TorchScript model (the way off TorchScript), .onnx from an ONNX model, a "
        "TorchScript suffix from TorchScript; it is run back on the first inputs before it is kept. "
        "--save-logits PATH keeps the logits and labels, so later runs need not run the model. ood takes "
        "--ood-inputs DATA and ODIN's --odin-eps E.",
        ("code", "tempcal fit examples/digits_model.ts \\\n"
                 "    --inputs examples/digits_inputs.safetensors \\\n"
                 "    --save-model digits_calibrated.pt2"),
    ]),
    "lm": ("Language models", "docs/language-models.md", "Language models", [
        "--lm MODEL --text FILE runs the model once over the texts and fits T for next-token prediction; "
        "saved hidden states take --head (a .safetensors weight [V, d], or the model folder). Logits are "
        "computed block by block in float32, never all at once.",
        ("code", "tempcal fit --lm MODEL_DIR --text texts.txt\ntempcal fit hidden.safetensors --head MODEL_DIR"),
        "Multiple-choice evaluation logs are a SOURCE, one row per question, T in the sidecar FILE.tempcal.json "
        "(docs/evaluation-logs.md): lm-evaluation-harness samples_*.jsonl[.gz] and lighteval details_*.parquet "
        "(--lm-eval-norm chars|bytes normalises by length), inspect_ai .eval/.json logs recorded with --logprobs "
        "--top-logprobs 20; --group-by task (inspect_ai: or model).",
        ("code", "tempcal fit 'results/*/samples_hellaswag_*.jsonl' --json fit.json"),
    ]),
    "config": ("Project configuration", "docs/configuration.md", "Configuration", [
        "tempcal.toml in this folder or the nearest parent that has one (or a pyproject.toml with a "
        "[tool.tempcal] table) holds the commands' defaults: a top-level source, and a table per command with "
        "its options under their long names, without the dashes.",
        ("code", 'source = "val.safetensors"   # or a list of shards\n'
                 "[fit]\n"
                 "max-ece = 0.05               # the release gate: exit 3 above it\n"
                 'json = "fit.json"\n'
                 "[report]\n"
                 'tau = ["fitted", 1]\n'
                 "[ood]\n"
                 'ood = ["noise.safetensors"]'),
        ("rows", [
            ("-", "Switches take true or false; the command line turns them off again (--write, --no-probs, "
                  "--no-quiet). Paths are relative to the file's folder."),
            ("-", "The command line wins: a value given there replaces the file's, and a repeated option "
                  "(--tau, --ood) replaces the configured list."),
            ("-", "A run that applies a file says so on standard error, 'config: PATH', under --quiet too; "
                  "the JSON names it and the keys taken from it."),
            ("-", "Mistakes are exit 2 naming the file and key: an unknown key (with a did-you-mean), a wrong "
                  "type, a value out of range. Every table is checked on every run."),
            ("-", "In GitHub Actions every run also appends its Markdown section to $GITHUB_STEP_SUMMARY."),
        ]),
    ]),
    "scale": ("Scale: shards, chunks, processes and GPUs", "docs/scale.md", "Scale", [
        ("rows", [
            ("-", "Shards: SOURCE, --eval and --ood may be several .safetensors files or a quoted glob "
                  "('logits-*.safetensors'), of the same classes and dtype; fit writes T into every shard."),
            ("-", "Chunked reads: logits over 256 MiB are never loaded whole; each chunk of rows is read, "
                  "reduced and dropped (TEMPCAL_RESIDENT_BYTES moves the limit, --chunk-rows sizes the chunks)."),
            ("-", "Token-level logits [B, L, V] with labels [B, L] are B * L rows; --ignore-index skips rows."),
            ("-", "Reads are the cost: a fit takes at most 3 on typical data, the validating scan included; "
                  "report evaluates every temperature in one pass."),
            ("-", "torchrun: every rank reads its share of the rows and the sums are all-reduced (gloo on CPU, "
                  "NCCL on CUDA); every figure equals one process's, and only rank 0 prints and writes."),
            ("-", "GPUs: --device cuda (or auto) gives each process GPU LOCAL_RANK, cuda:N is used as given. "
                  "Models and heads run with TF32 off; TEMPCAL_ALLOW_TF32=1 trades that precision for speed."),
        ]),
        ("code", "torchrun --nproc-per-node 8 -m tempcal fit \\\n"
                 "    '/data/val-*.safetensors' --json fit.json"),
    ]),
    "exit-codes": ("Exit status", "docs/commands.md#exit-status", "Gates", [
        ("rows", [
            ("0", "success"),
            ("2", "bad input or usage: one line on standard error naming the file, key, count or first index; "
                  "no traceback; nothing written or changed"),
            ("3", "a gate failed (the options below); the JSON, the other files and T are still written, and "
                  "standard error says which figures failed"),
            ("1", "anything else (TEMPCAL_DEBUG=1 shows the traceback)"),
        ]),
        "In GitHub Actions a failed gate also adds a line to the step's summary ($GITHUB_STEP_SUMMARY).",
    ]),
}


def resolve(topic: str) -> str:
    """A topic or command as named on the command line (any case, aliases too); bad input lists the topics."""
    name = topic.strip().lower()
    name = ALIASES.get(name, name)
    if name in COMMANDS or name in TOPICS:
        return name
    raise TempcalError(f"unknown help topic '{topic}'; the topics are {', '.join([*COMMANDS, *TOPICS])}")


def _command_context(ctx: Any, name: str) -> tuple[Any, Any]:
    """The ``tempcal`` command ``name`` and its context. ``help`` runs only as the group's command (it is served by
    ``TempcalGroup.get_command``), so the group is ``ctx.parent``'s."""
    parent = ctx.parent
    command = parent.command.get_command(parent, name)
    return command, command.context_class(command, info_name=name, parent=parent)


def topic_options(ctx: Any, panel_name: str) -> list[tuple[str, str]]:
    """Every option the commands show in ``panel_name``, once, with the commands that take it (when not all)."""
    found: dict[str, tuple[str, str, list[str]]] = {}
    for name in COMMANDS:
        command, sub = _command_context(ctx, name)
        for param in grouped(name, command.get_params(sub)).get(panel_name, []):
            shown = names(param, sub)
            found.setdefault(shown, (shown, param, []))[2].append(name)
    return [(shown, help_of(param, ctx, note="" if len(takers) == len(COMMANDS) else f"({', '.join(takers)})"))
            for shown, param, takers in found.values()]


def topic_help(ctx: Any, name: str) -> str:
    """One topic's text, then the options it concerns."""
    title, page, panel_name, blocks = TOPIC_TEXTS[name]
    width = help_console().width
    parts = spaced(f"{title}  (more in {page})", [_block(block, width) for block in blocks])
    rows = topic_options(ctx, panel_name)
    if rows:
        parts.append(panel(f"Options: {panel_name}", rows, width))
    parts.append(prose(f"Other topics: tempcal help {' | '.join(t for t in TOPICS if t != name)}.", "dim"))
    return render(parts)


def _block(block: Any, width: int) -> Any:
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    if isinstance(block, str):
        return prose(block)
    kind, content = block
    if kind == "code":
        return Padding(Text(content, style="cyan", overflow="fold"), (0, 0, 0, 4))
    grid = Table.grid(padding=(0, 2), expand=True)
    grid.add_column(width=max(len(term) for term, _ in content), no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")
    for term, text in content:
        grid.add_row(Text(term, style="bold"), Text(text, overflow="fold"))
    return Padding(grid, (0, 0, 0, 2))


def topics_list() -> str:
    """``tempcal help``: the commands and the topics."""
    width = help_console().width
    commands = [(name, f"every option of tempcal {name}") for name in COMMANDS]
    topics = [(name, f"{text} ({TOPIC_TEXTS[name][1]})") for name, text in TOPICS.items()]
    return render([*spaced("Usage: tempcal help [TOPIC]", [prose(HELP_SUMMARY)]),
                   panel("Commands", commands, width), panel("Topics", topics, width),
                   prose("tempcal COMMAND --help shows a command's common options.", "dim")])


HELP_SUMMARY = paragraphs("""Every option of a command (tempcal help fit), or a topic: input formats, models, language
models, configuration, scale and GPUs, exit codes.""")[0]
help_app = typer.Typer(add_completion=False)


@help_app.command("help", cls=HelpCommand, help=HELP_SUMMARY)
def help_command(
    ctx: typer.Context,
    topic: Annotated[Optional[str], typer.Argument(
        metavar="TOPIC", show_default=False, help=f"A command ({', '.join(COMMANDS)}) or a topic "
        f"({', '.join(TOPICS)}); none lists them.")] = None,
) -> None:
    if topic is None:
        typer.echo(topics_list())
        return
    name = resolve(topic)
    if name in COMMANDS:
        command, sub = _command_context(ctx, name)
        typer.echo(command_help(command, sub, full=True))
    else:
        typer.echo(topic_help(ctx, name))


def help_click_command() -> Any:
    """``tempcal help`` as a click command, for the group to serve (it is no configured command)."""
    command = typer.main.get_command(help_app)
    command.name = "help"
    return command


__all__ = ["ALIASES", "TOPIC_TEXTS", "help_click_command", "resolve"]
