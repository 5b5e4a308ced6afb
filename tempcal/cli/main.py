"""The ``tempcal`` app: the exit statuses, one-line errors, and the steps every command ends with (:func:`deliver`);
heavy modules are imported inside the commands, so that ``tempcal --help`` starts fast."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .._version import __version__
from .help_format import HelpGroup

if TYPE_CHECKING:
    from ..requests import Outputs

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_GATE = 3
#: The arguments of the command being run (after ``tempcal``).
_ARGV: list[str] = []
HELP_COMMAND = "help"


class Interrupted(BaseException):
    """Ctrl-C (SIGINT) during a command, carried past Typer, which would make a ``KeyboardInterrupt`` its own exit
    status 130; the contract's status for it is 1 ("anything else")."""


class TempcalGroup(HelpGroup):
    """The ``tempcal`` group: its commands, and ``help``, which is served here rather than registered, so that
    the configuration file's tables stay the configured commands'."""

    def invoke(self, ctx: Any) -> Any:
        """The command; a ``KeyboardInterrupt`` leaves as :class:`Interrupted`, once the files being written (each
        command's ``with`` and ``finally`` blocks) are removed."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise Interrupted from None

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), HELP_COMMAND]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name != HELP_COMMAND:
            return super().get_command(ctx, cmd_name)
        from .help_topics import help_click_command

        return help_click_command()


app = typer.Typer(
    name="tempcal",
    cls=TempcalGroup,
    help="Post-hoc temperature scaling and calibration metrics for classifier logits.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"tempcal {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version_callback, is_eager=True,
                                          help="Show the version and exit.")] = False,
) -> None:
    """Post-hoc temperature scaling and calibration metrics for classifier logits."""


def deliver(ctx: Any, outputs: Outputs, result: Any, *, warnings: list[str], write: Callable[[], list[str]],
            payload: Callable[[], dict], render: Callable[[Any, Any], None],
            summary: Callable[[Any], str] | None = None, gate: str | None = None) -> None:
    """How every command ends, on rank 0 only: the configuration file used, warnings, the files asked for, the JSON,
    ``--html``, the step ``summary``, the console view and the lines saying what was written; then the gate."""
    from ..core.parallel import rank

    if rank() != 0:
        raise typer.Exit(EXIT_GATE if gate else 0)
    from ..errors import Info, for_cli
    from .config import config_state

    state = config_state(ctx)
    if state.config is not None:
        stderr(f"config: {state.config.display}")
    for message in warnings:  # notes (Info) are left out under --quiet; warnings never are
        if not (isinstance(message, Info) and outputs.quiet):
            stderr(f"{'note' if isinstance(message, Info) else 'warning'}: {for_cli(message)}")
    written = write()
    from ..output.files import STEP_SUMMARY_ENV, append_step_summary, emit_json, step_summary_path, write_extras

    data = payload()
    for key in ("warnings", "problems", "hints"):  # messages, as the command line names the options
        if key in data:
            data[key] = [for_cli(message) for message in data[key]]
    data.update(state.to_json())
    json_out = outputs.json_out
    emit_json(json_out, data)
    if json_out not in (None, "-"):
        written.append(f"wrote the JSON to {json_out}")
    written += write_extras({"--html": outputs.html}, ctx.info_name, result, data, _ARGV)
    if summary is not None:
        problem = append_step_summary(lambda: summary(result), gate=gate)
        if problem:
            stderr(f"warning: {problem}")
        elif step_summary_path() is not None:
            written.append(f"appended the Markdown section to ${STEP_SUMMARY_ENV} ({step_summary_path()})")
    if json_out != "-" and not outputs.quiet:
        from ..output.console import output_console

        out = output_console(NeutralText(sys.stdout), highlight=False)
        render(result, out)
        for line in written:
            out.print(line, soft_wrap=True)
    if gate:
        stderr(f"gate failed: {gate}")
        raise typer.Exit(EXIT_GATE)


def check_paths(ctx: Any, outputs: dict[str, str | None], inputs: dict[str, str | list[str] | None], *,
                write_back: list[str] | None = None) -> None:
    """Before any work: each output can be written where it is named, no output is the same file as another output
    or an input (SOURCE's sidecar, the configuration file and ``$GITHUB_STEP_SUMMARY`` included), and none, nor a
    file T is written back into (``write_back``: SOURCE files), lies in a model folder but the record of T."""
    from ..io.paths import check_distinct, check_target, expand, sidecar_path
    from ..output.files import STEP_SUMMARY_ENV, check_extra, step_summary_path
    from ..output.plots import check_plot_path
    from .config import config_state

    given = [(flag, str(path)) for flag, path in outputs.items() if path is not None and path != "-"]
    read = [(label, path) for label, value in inputs.items() for path in expand([value] if isinstance(value, str)
                                                                                else value or [])]
    read += [("the sidecar of SOURCE", str(sidecar_path(path))) for label, path in read if label == "SOURCE"]
    config = config_state(ctx).config
    if config is not None:
        read.append(("the configuration file", str(config.path)))
    summary = step_summary_path()
    summary_flag = f"${STEP_SUMMARY_ENV}"
    folders = [(label, str(value)) for label, value in inputs.items()
               if label in MODEL_FOLDERS and isinstance(value, str) and os.path.isdir(value)]
    # each SOURCE file T is written back into takes it itself, or in its sidecar; a missing one is for opening to say
    backs = [("writing T back into", path if path.lower().endswith(".safetensors") else str(sidecar_path(path)))
             for path in expand(write_back or []) if os.path.isfile(path)]
    records: list[str] = []  # the outputs that are the record of T kept in an --lm folder
    if any(option == "--lm" for option, _ in folders):
        from ..lm.command import record_outputs

        records = record_outputs(given, folders)
    check_distinct([*given, *([(summary_flag, summary)] if summary else [])], read, appends=[summary_flag],
                   folders=folders, writable=records, updates=backs)
    for flag, path in given:
        check_target(path, f"{flag} {path}", hint=" (--json - writes to standard output)" if flag == "--json" else "")
        if flag == "--plot":
            check_plot_path(path)
        check_extra(flag, path)
    for _, target in backs:
        check_target(target, target, follow_link=target.lower().endswith(".safetensors"))


#: Input options that name a model folder, which tempcal never writes into (but for its record of T).
MODEL_FOLDERS = ("--lm", "--head")


class NeutralText:
    """A text stream that writes bidirectional control characters as escapes (:func:`tempcal.errors.neutral`):
    what the console shows of a hostile file or group name cannot reorder the line around it."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        from ..errors import neutral

        return self.stream.write(neutral(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def stderr(message: str) -> None:
    from ..errors import neutral

    sys.stderr.write(neutral(message.rstrip("\n")) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Console entry point: one-line errors and the contract's exit statuses (0, 1, 2, 3); Ctrl-C is one line
    ("interrupted") and status 1."""
    # Typer re-exports click's exception classes under different module paths across versions.
    usage_error: Any = _click_class("UsageError")
    click_exception: Any = _click_class("ClickException")
    command = typer.main.get_command(app)
    _ARGV[:] = list(sys.argv[1:] if argv is None else argv)  # the command line an HTML page shows
    try:
        result = _run(command, argv)
    except usage_error as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # a bare ``tempcal``: the help, as click gives it
            exc.show()
            return EXIT_BAD_INPUT
        hint = f" (see tempcal {exc.ctx.info_name} --help)" if exc.ctx and exc.ctx.parent else ""
        stderr(f"error: {exc.format_message()}{hint}")
        return EXIT_BAD_INPUT
    except click_exception as exc:
        stderr(f"error: {exc.format_message()}")
        return exc.exit_code
    except (Interrupted, KeyboardInterrupt):
        stderr("interrupted")
        return EXIT_FAILURE
    except typer.Abort:
        stderr("aborted")
        return EXIT_FAILURE
    except typer.Exit as exc:
        return exc.exit_code
    except Exception as exc:  # every failure becomes one line and an exit status
        from ..errors import TempcalError, for_cli

        if isinstance(exc, TempcalError):
            stderr(f"error: {for_cli(exc)}")
            return EXIT_BAD_INPUT
        if os.environ.get("TEMPCAL_DEBUG"):
            raise
        stderr(f"internal error: {type(exc).__name__}: {exc} (set TEMPCAL_DEBUG=1 for the traceback)")
        return EXIT_FAILURE
    return result if isinstance(result, int) else 0


def _run(command: Any, argv: list[str] | None) -> Any:
    """The command, then the process group it joined under torchrun (if any) destroyed, whatever happened."""
    try:
        return command.main(args=argv, prog_name="tempcal", standalone_mode=False)
    finally:
        parallel = sys.modules.get("tempcal.core.parallel")  # imported only by commands that computed
        if parallel is not None:
            parallel.shutdown()


def _click_class(name: str) -> type[Exception]:
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


def run() -> None:
    """The ``tempcal`` command: :func:`main`, then, once standard output and error are flushed, an exit that skips
    tearing down torch (about half a second); a flush that fails (a closed pipe) takes the ordinary exit."""
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        sys.exit(code)
    os._exit(code)


__all__ = ["Interrupted", "app", "check_paths", "deliver", "main", "run", "stderr"]
