"""How tempcal's help reads: a command's common options by panel (``--help``), every option with ``tempcal help
COMMAND``, in two columns wrapped at any width rather than cut (rich is imported only while help is shown)."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import Any

from typer.core import TyperCommand, TyperGroup

#: Help is never wider than this, however wide the terminal: longer lines are hard to read.
MAX_WIDTH = 100
#: The largest share of the width the names column takes; a longer name goes on a line of its own.
NAME_SHARE = 0.3
OTHER_PANEL = "Other options"
HELP_PANEL = "Help"
#: Panels in the order they are shown; any other panel comes after them, in the order its options are declared.
PANEL_ORDER = ("Arguments", "Input", "Fit", "Temperatures", "Scores", "Metrics", "Groups", "Gates", "Output", "Models",
               "Language models", "Scale", "Configuration")
#: The panel of options declared without one (in a command's own module, or not yet given one).
FALLBACK_PANELS = {"--ood": "Input", "--sweep": "Temperatures", "--scores": "Output", "--ood-inputs": "Models",
                   "--odin-eps": "Models", "--folds": "Fit", "--group-by": "Groups", "--group-prior": "Groups"}
#: Where one command shows a shared option in another panel than the declaration's.
PANEL_OVERRIDES = {("report", "--seed"): "Metrics", ("ood", "--seed"): "Metrics", ("ood", "--tau"): "Scores",
                   ("fit", "--group-by"): "Fit", ("fit", "--group-prior"): "Fit"}
#: The options ``COMMAND --help`` shows (``tempcal help COMMAND`` shows them all); ``source`` is the argument.
#: The headline options of each release belong here: ``--help`` is where a user looks first.
COMMON = {
    "fit": ("source", "--eval", "--probs", "--val-fraction", "--folds", "--seed", "--objective", "--conformal-alpha",
            "--group-by", "--max-ece", "--json", "--output", "--no-write", "--plot", "--markdown", "--html", "--quiet",
            "--lm", "--text", "--config", "--no-config"),
    "report": ("source", "--probs", "--eval-rows", "--tau", "--sweep", "--bins", "--bootstrap", "--conformal-alpha",
               "--group-by", "--json", "--plot", "--markdown", "--html", "--quiet", "--config", "--no-config"),
    "ood": ("source", "--ood", "--probs", "--tau", "--score", "--group-by", "--min-auroc", "--max-fpr95", "--json",
            "--scores", "--plot", "--markdown", "--quiet", "--config", "--no-config"),
}
#: ``tempcal help TOPIC``: the topics besides the commands, with what each covers.
TOPICS = {
    "formats": "input formats: logits files, lm-eval logs, shards",
    "models": "models as SOURCE (.pt2, ONNX, TorchScript) and --save-model",
    "lm": "language models: hidden states with --head, lm-eval logs",
    "config": "tempcal.toml and [tool.tempcal]: every option's default",
    "scale": "shards, chunked reads, torchrun and GPUs",
    "exit-codes": "exit statuses 0, 1, 2, 3 and the gates",
}
_TYPE_NAMES = {"int": "INTEGER", "int range": "INTEGER", "float": "FLOAT", "float range": "FLOAT", "str": "TEXT",
               "integer": "INTEGER", "text": "TEXT", "boolean": "BOOLEAN", "bool": "BOOLEAN"}


# -- what an option shows ------------------------------------------------------------------------------------


def long_name(param: Any) -> str:
    """The name an option is known by in :data:`COMMON` and the panel tables: its first long flag (or its name)."""
    return next((opt for opt in param.opts if opt.startswith("--")), param.name or "")


def is_argument(param: Any) -> bool:
    return getattr(param, "param_type_name", "") == "argument"


def value_name(param: Any, ctx: Any) -> str:
    """What an option takes, as its help shows it: its metavar, else its type (``FLOAT``, ``nll|ece``); nothing
    for a switch."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    if param.metavar:
        return str(param.metavar)
    shown = ""
    if hasattr(param, "display_type"):  # Typer's own description of the type: "<float>", "<nll|ece>"
        shown = str(param.display_type(ctx) or "").strip("<>")
    elif getattr(param, "type", None) is not None:
        shown = str(getattr(param.type, "name", "") or "")
    shown = shown[len("list["):-1] if shown.startswith("list[") and shown.endswith("]") else shown  # repeatable
    return _TYPE_NAMES.get(shown.lower(), shown.upper() if shown.isalpha() else shown) or "VALUE"


def names(param: Any, ctx: Any) -> str:
    """``-q, --quiet / --no-quiet``, ``--val-fraction FLOAT``, ``SOURCE...``: how an option is written."""
    if is_argument(param):
        return f"{param.metavar or (param.name or '').upper()}{'...' if param.nargs != 1 else ''}"
    value = value_name(param, ctx)
    text = ", ".join(sorted(param.opts, key=lambda opt: opt.startswith("--"))) + (f" {value}" if value else "")
    return text + (" / " + ", ".join(param.secondary_opts) if param.secondary_opts else "")


def extras(param: Any, ctx: Any) -> str:
    """``[default: 0.5; 0<=x<=1]``: the default a command line without the option gets, and the range."""
    default = _shown_default(param, ctx)
    describe = getattr(param, "_get_number_range_help_str", None)
    parts = [f"default: {default}" if default else "", str(describe() or "") if callable(describe) else ""]
    shown = "; ".join(part for part in parts if part)
    return f"[{shown}]" if shown else ""


def _shown_default(param: Any, ctx: Any) -> str:
    """The default, when it says something: not for switches, arguments, unset values or empty lists."""
    if is_argument(param) or getattr(param, "is_flag", False) or param.show_default is False:
        return ""
    if isinstance(param.show_default, str):
        return param.show_default
    default = param.get_default(ctx, call=False)
    if default is None or callable(default) or (isinstance(default, (list, tuple)) and not default):
        return ""
    value = getattr(default, "value", default)  # an Enum: its value
    return ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def help_of(param: Any, ctx: Any, note: str = "") -> str:
    """An option's help text, then ``note``, then its default and range."""
    text = " ".join(inspect.cleandoc(getattr(param, "help", None) or "").split())
    return " ".join(part for part in (text, note, extras(param, ctx)) if part)


def panel_of(command: str, param: Any) -> str:
    """The panel an option is shown in by ``command``: an override, its declaration's, a fallback, or 'Other'."""
    flag = long_name(param)
    if flag == "--help":
        return HELP_PANEL
    return (PANEL_OVERRIDES.get((command, flag)) or getattr(param, "rich_help_panel", None)
            or FALLBACK_PANELS.get(flag) or ("Arguments" if is_argument(param) else OTHER_PANEL))


def grouped(command: str, params: Iterable[Any]) -> dict[str, list[Any]]:
    """The options by panel, panels in :data:`PANEL_ORDER` (others after, then 'Other options', then 'Help')."""
    panels: dict[str, list[Any]] = {}
    for param in params:
        if not getattr(param, "hidden", False):
            panels.setdefault(panel_of(command, param), []).append(param)
    rank = {name: k for k, name in enumerate((*PANEL_ORDER, "", OTHER_PANEL, HELP_PANEL))}
    return {name: panels[name] for name in sorted(panels, key=lambda name: rank.get(name, rank[""]))}


# -- rendering -----------------------------------------------------------------------------------------------


def help_console() -> Any:
    """A console that records what is printed, as wide and as colourful as standard output allows."""
    import io

    from rich.console import Console

    probe = Console()
    color: Any = probe.color_system if probe.is_terminal else None
    return Console(file=io.StringIO(), width=min(probe.width, MAX_WIDTH), color_system=color,
                   force_terminal=probe.is_terminal, no_color=probe.no_color, highlight=False, emoji=False,
                   markup=False)


def render(renderables: Sequence[Any]) -> str:
    """The renderables as text (with colour codes when standard output is a terminal)."""
    console = help_console()
    for item in renderables:
        console.print(item)
    return "\n".join(line.rstrip(" ") for line in console.file.getvalue().rstrip("\n").split("\n"))


def name_width(rows: Iterable[tuple[str, str]], width: int) -> int:
    """The names column's width: the longest name that fits in :data:`NAME_SHARE` of the panel, shared by every
    panel of one help so that the columns line up."""
    cap = int((width - 4) * NAME_SHARE)  # the panel's border and padding take 4
    return max((len(name) for name, _ in rows if len(name) <= cap), default=cap)


def option_rows(rows: Sequence[tuple[str, str]], width: int, names_width: int) -> Any:
    """Options as two columns, names then help; the help wraps, and a longer name gets a line of its own."""
    from rich.console import Group
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    help_width = width - 4 - names_width - 2
    items: list[Any] = []
    for name, text in rows:
        help_text = _help_text(text, help_width)
        if len(name) > names_width:
            items += [Text(name, style="bold cyan"), Padding(help_text, (0, 0, 0, names_width + 2))]
            continue
        grid = Table.grid(padding=(0, 2), expand=True)
        grid.add_column(width=names_width, no_wrap=True)
        grid.add_column(ratio=1, overflow="fold")
        grid.add_row(Text(name, style="bold cyan"), help_text)
        items.append(grid)
    return Group(*items)


def _help_text(text: str, width: int) -> Any:
    """Help text with its ``[default: ...]`` tail dimmed, and on a line of its own rather than broken."""
    from rich.text import Text

    body, bracket, tail = text.rpartition(" [") if text.endswith("]") else (text, "", "")
    if not bracket:
        return Text(text, overflow="fold")
    tail = f"[{tail}"
    last = Text(f"{body} {tail}").wrap(help_console(), max(width, 1))[-1].plain.rstrip()
    out = Text(body, overflow="fold")
    out.append("\n" if not last.endswith(tail) or len(last) < len(tail) else " ")
    out.append(tail, style="dim")
    return out


def panel(title: str, rows: Sequence[tuple[str, str]], width: int, names_width: int | None = None) -> Any:
    """A titled panel of options (``names_width``: the names column's, when several panels share it)."""
    from rich import box
    from rich.panel import Panel

    shared = name_width(rows, width) if names_width is None else names_width
    return Panel(option_rows(rows, width, shared), title=title, title_align="left", border_style="dim",
                 box=box.ROUNDED, padding=(0, 1))


def prose(text: str, style: str = "") -> Any:
    from rich.text import Text

    return Text(text, style=style, overflow="fold")


def spaced(title: str, blocks: Iterable[Any]) -> list[Any]:
    """A bold title, then the blocks, each of them followed by a blank line."""
    return [item for block in (prose(title, "bold"), *blocks) for item in (block, prose(""))]


def paragraphs(doc: str | None) -> list[str]:
    """A docstring's paragraphs, each on one line (Typer's ``\\f`` cuts off what help should not show)."""
    text = inspect.cleandoc(doc or "").partition("\f")[0]
    return [" ".join(part.split()) for part in text.split("\n\n") if part.strip()]


def usage(command: Any, ctx: Any) -> str:
    """``Usage: tempcal fit [OPTIONS] SOURCE...``: SOURCE unbracketed, whether or not a configuration gives it."""
    pieces = ["[OPTIONS]"] if any(not is_argument(p) for p in command.get_params(ctx)) else []
    for param in command.get_params(ctx):
        if is_argument(param):
            shown = names(param, ctx)
            pieces.append(shown if param.required else f"[{shown}]")
    if isinstance(command, TyperGroup):
        pieces.append("COMMAND [ARGS]...")
    return f"Usage: {ctx.command_path} {' '.join(pieces)}".rstrip()


def command_help(command: Any, ctx: Any, *, full: bool) -> str:
    """A command's help: usage, summary, then its common options by panel (every option when ``full``)."""
    name = str(command.name or "")
    every = [p for p in command.get_params(ctx) if not getattr(p, "hidden", False)]
    common = COMMON.get(name)  # a command without a list shows every option
    params = [p for p in every if full or common is None or long_name(p) in common]
    docs = paragraphs(command.help)
    panels = {title: [(names(p, ctx), help_of(p, ctx)) for p in members]
              for title, members in grouped(name, params).items()}
    topics = f"tempcal help {', '.join(TOPICS)}"  # then where the rest is: every option, and the topics
    more = f"More options: tempcal help {name} (all {len(every)} options); topics: {topics}."
    return _page(usage(command, ctx), docs if full else docs[:2], panels,
                 more if len(params) < len(every) else f"Topics: {topics}. Docs: docs/commands.md.")


def group_help(group: Any, ctx: Any) -> str:
    """``tempcal --help``: the commands with their summaries, the app's options, and where the topics are."""
    commands = [(name, group.get_command(ctx, name)) for name in group.list_commands(ctx)]
    rows = [(name, (paragraphs(cmd.short_help or cmd.help) or [""])[0]) for name, cmd in commands
            if cmd is not None and not cmd.hidden]
    options = [(names(p, ctx), help_of(p, ctx)) for p in group.get_params(ctx)]
    return _page(usage(group, ctx), paragraphs(group.help), {"Commands": rows, "Options": options},
                 "Each command's common options: tempcal COMMAND --help; every option: tempcal help COMMAND; "
                 f"topics: tempcal help {' | '.join(TOPICS)}.")


def _page(head: str, docs: Sequence[str], panels: dict[str, list[tuple[str, str]]], footer: str) -> str:
    """The usage line, the paragraphs, the panels (one names column across them) and a dim footer, rendered."""
    width = help_console().width
    shared = name_width([row for rows in panels.values() for row in rows], width)
    return render([*spaced(head, [prose(text) for text in docs]),
                   *(panel(title, rows, width, shared) for title, rows in panels.items()), prose(footer, "dim")])


class HelpCommand(TyperCommand):
    """A Typer command whose ``--help`` shows its common options by panel, wrapped (see the module)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        formatter.write(command_help(self, ctx, full=False))


class HelpGroup(TyperGroup):
    """The Typer group whose ``--help`` lists the commands and the app's options the same way."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        formatter.write(group_help(self, ctx))


__all__ = ["COMMON", "TOPICS", "HelpCommand", "HelpGroup", "command_help", "grouped", "help_console", "help_of",
           "names", "panel", "panel_of", "render", "spaced"]
