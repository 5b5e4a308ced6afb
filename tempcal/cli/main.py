"""The ``tempcal`` command line: parses options, calls the Python API, renders the result.

Heavy modules (torch, the numerical core) are imported inside the commands, so that
``tempcal --help`` starts fast.
"""

from __future__ import annotations

import json
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .._version import __version__

EXIT_BAD_INPUT = 2
EXIT_GATE = 3

app = typer.Typer(
    name="tempcal",
    help="Post-hoc temperature scaling and calibration metrics for classifier logits.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class Objective(str, Enum):
    nll = "nll"
    ece = "ece"


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


LogitsKey = Annotated[str, typer.Option("--logits-key", help="Tensor holding the logits [N, C] (or [N] binary).")]
LabelsKey = Annotated[str, typer.Option("--labels-key", help="Tensor holding the integer labels [N].")]
Probs = Annotated[bool, typer.Option("--probs", help="The logits tensor holds probabilities; work on log(p).")]
Device = Annotated[str, typer.Option("--device", help="auto (CUDA when available), cpu or cuda.")]
Bins = Annotated[int, typer.Option("--bins", min=1, help="Number of equal-width bins for ECE/MCE.")]
JsonOut = Annotated[Optional[str], typer.Option("--json", metavar="PATH",
                                                help="Write the result as JSON to PATH ('-' for standard output).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print only warnings and errors.")]
ChunkRows = Annotated[Optional[int], typer.Option("--chunk-rows", min=1,
                                                  help="Rows per reduction chunk (default: automatic).")]
Estimators = Annotated[Optional[str], typer.Option(
    "--estimators", metavar="NAMES", help="More estimators, comma-separated or 'all': ece_equal_mass, ece_classwise, "
    "rms_ce, l2_ce_debiased.")]
Bootstrap = Annotated[int, typer.Option(
    "--bootstrap", metavar="N", min=0, help="95% percentile intervals for ECE and NLL from N seeded resamples.")]
Inputs = Annotated[Optional[str], typer.Option(
    "--inputs", metavar="DATA", help="Inputs file (.safetensors: 'inputs', 'labels') for a TorchScript model SOURCE.")]
InputsKey = Annotated[str, typer.Option("--inputs-key", help="Tensor holding the model inputs [N, ...].")]
BatchSize = Annotated[int, typer.Option("--batch-size", min=1, help="Rows per model batch (model SOURCE).")]
OutputKey = Annotated[Optional[str], typer.Option(
    "--output-key", metavar="KEY", help="The logits among a model's outputs: a dict key or a tuple index.")]
SaveLogits = Annotated[Optional[str], typer.Option(
    "--save-logits", metavar="PATH", help="Keep a model SOURCE's logits (and labels) as a logits file.")]
IgnoreIndex = Annotated[int, typer.Option("--ignore-index",
                                          help="Rows whose label is this value are skipped (token-level logits).")]


@app.command()
def fit(
    source: Annotated[list[str], typer.Argument(
        metavar="SOURCE", help="Logits file (.safetensors) with 'logits' and 'labels'; several files or a glob "
        "pattern are read as shards.")],
    eval_file: Annotated[Optional[str], typer.Option("--eval", metavar="FILE",
                                                     help="Fit on all of SOURCE and report on FILE.")] = None,
    val_fraction: Annotated[float, typer.Option("--val-fraction",
                                                help="Fraction of SOURCE used to fit T (class-stratified); "
                                                "the rest is used to report.")] = 0.5,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the split.")] = 0,
    objective: Annotated[Objective, typer.Option("--objective", help="Minimise NLL (default) or ECE.")] = Objective.nll,
    bins: Bins = 15,
    json_out: JsonOut = None,
    output: Annotated[Optional[str], typer.Option("--output", metavar="PATH",
                                                  help="Write the updated copy to PATH; SOURCE is untouched.")] = None,
    no_write: Annotated[bool, typer.Option("--no-write", help="Write nothing back.")] = False,
    max_ece: Annotated[Optional[float], typer.Option("--max-ece", metavar="X",
                                                     help="Exit 3 when the calibrated ECE is above X.")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", metavar="PATH",
                                                help="Reliability diagrams before and after (.png, .svg, .pdf).")
                    ] = None,
    markdown: Annotated[Optional[str], typer.Option("--markdown", metavar="PATH",
                                                    help="Write a calibration section for a model card.")] = None,
    logits_key: LogitsKey = "logits",
    labels_key: LabelsKey = "labels",
    probs: Probs = False,
    device: Device = "auto",
    chunk_rows: ChunkRows = None,
    ignore_index: IgnoreIndex = -100,
    estimators: Estimators = None,
    bootstrap: Bootstrap = 0,
    inputs: Inputs = None,
    inputs_key: InputsKey = "inputs",
    batch_size: BatchSize = 512,
    output_key: OutputKey = None,
    save_logits: SaveLogits = None,
    save_model: Annotated[Optional[str], typer.Option(
        "--save-model", metavar="PATH", help="Write a TorchScript model whose logits are the model SOURCE's / T.")
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Fit one temperature T by L-BFGS on the NLL, report calibration before and after, write T back."""
    if no_write and output is not None:
        usage("--output and --no-write contradict each other")
    if output is not None and (len(source) > 1 or any(ch in source[0] for ch in "*?[")):
        usage("--output takes a single SOURCE file; shards get T written into each of them")
    if max_ece is not None and not max_ece >= 0:
        usage(f"--max-ece must be a number >= 0, got {max_ece}")
    is_model = is_model_source(source, inputs, [save_model, save_logits, output_key])
    if is_model and output is not None:
        usage("--output writes a logits file; for a model SOURCE use --save-model PATH (and --save-logits PATH)")
    if is_model and probs:
        usage("--probs applies to logits files, not to a model SOURCE")
    if plot:
        from ..output.plots import check_plot_path

        check_plot_path(plot)

    from ..core.distributed import init_from_environment, rank
    from ..workflows.common import fit_file

    device = init_from_environment(device)
    fit_source: object = source
    eval_source: object = eval_file
    if is_model:
        fit_source, eval_source, model_path = model_sources(source[0], inputs, eval_file, inputs_key=inputs_key,
                                                            labels_key=labels_key, batch_size=batch_size,
                                                            device=device, output_key=output_key,
                                                            progress=json_out != "-" and not quiet)
    report = fit_file(fit_source, eval_file=eval_source, val_fraction=val_fraction, seed=seed,
                      objective=objective.value, bins=bins, device=device, logits_key=logits_key,
                      labels_key=labels_key, probs=probs, chunk_rows=chunk_rows, ignore_index=ignore_index,
                      estimators=parse_estimators(estimators), bootstrap=bootstrap)
    gate_failed = max_ece is not None and report.after.ece > max_ece
    if rank() != 0:  # under torch.distributed only rank 0 prints and writes
        raise typer.Exit(EXIT_GATE if gate_failed else 0)
    warn(report.warnings)
    written = None
    if not no_write:
        from ..sources.formats import write_stored_temperature

        written = ", ".join(str(write_stored_temperature(path, report.temperature, output))
                            for path in report.paths) or None
    if is_model:
        from ..models.torchscript import save_calibrated_model
        from ..models.torchscript import save_logits as write_logits

        if save_logits:
            write_logits(fit_source.data, save_logits, temperature=None if no_write else report.temperature,  # type: ignore[attr-defined]
                         metadata={"tempcal.model": model_path, "tempcal.inputs": str(inputs)})
        if save_model and not no_write:
            written = str(save_calibrated_model(model_path, report.temperature, save_model, output_key=output_key,
                                                check_inputs=inputs, inputs_key=inputs_key))
    if plot:
        from ..output.plots import reliability_diagram

        reliability_diagram([("before (T = 1)", report.before), (f"after (T = {report.temperature:.4g})",
                                                                  report.after)], plot)
    if markdown:
        from ..io.atomic import write_text_atomic
        from ..output.markdown import fit_markdown

        write_text_atomic(markdown, fit_markdown(report, markdown, plot), what="--markdown")
    payload = report.to_json()
    payload["written"] = written
    payload["max_ece"] = max_ece
    payload["gate_passed"] = None if max_ece is None else not gate_failed
    emit_json(json_out, payload)
    if json_out != "-" and not quiet:
        from ..output.console import print_fit

        out = console()
        print_fit(report, out)
        if report.extras and any(report.extras):
            from ..output.console import extras_table

            out.print(extras_table([report.before.tau, report.after.tau], report.extras))
        if written:
            out.print(f"wrote tempcal.temperature = {report.temperature!r} into {written}")
    if gate_failed:
        stderr(f"gate failed: calibrated ECE {report.after.ece:.4f} is above --max-ece {max_ece:g}")
        raise typer.Exit(EXIT_GATE)


def parse_estimators(text: str | None) -> list[str]:
    """``--estimators a,b`` or ``all`` as a checked list of names."""
    if not text:
        return []
    from ..metrics.estimators import ESTIMATORS

    names = list(ESTIMATORS) if text.strip() == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ESTIMATORS]
    if unknown:
        usage(f"--estimators {text}: unknown {', '.join(unknown)}; choose from {', '.join(ESTIMATORS)} or 'all'")
    return names


MODEL_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript")


def is_model_source(source: list[str], inputs: str | None, model_only: list[str | None]) -> bool:
    """A TorchScript model SOURCE: a model suffix and either ``--inputs`` or a TorchScript archive."""
    model = len(source) == 1 and Path(source[0]).suffix.lower() in MODEL_SUFFIXES and (
        inputs is not None or model_suffix(source[0]))
    if not model and (inputs is not None or any(v is not None for v in model_only)):
        usage("--inputs, --save-model, --save-logits and --output-key apply to a TorchScript model SOURCE")
    return model


def model_sources(model_path: str, inputs: str | None, eval_inputs: str | None, **options):
    """The model run over ``--inputs`` (and over an ``--eval`` inputs file) as sources; and the model's path."""
    from ..models.torchscript import load_model, open_model_source

    model = load_model(model_path, options["device"])
    main_source = open_model_source(model_path, inputs, model=model, **options)
    eval_source = open_model_source(model_path, eval_inputs, model=model, **options) if eval_inputs else None
    return main_source, eval_source, model_path


def model_suffix(path: str) -> bool:
    """A TorchScript model file (a ``.pt`` holding a dict of tensors is a logits file)."""
    if Path(path).suffix.lower() not in MODEL_SUFFIXES:
        return False
    from ..sources.formats import is_torchscript

    return not Path(path).exists() or is_torchscript(path)


def console():
    from rich.console import Console

    return Console(highlight=False)


def emit_json(target: str | None, payload: dict) -> None:
    if target is None:
        return
    text = json.dumps(payload, indent=2, allow_nan=False) + "\n"
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from ..io.atomic import write_text_atomic

    write_text_atomic(target, text, what="--json")


def warn(messages: list[str]) -> None:
    for message in messages:
        stderr(f"warning: {message}")


def stderr(message: str) -> None:
    sys.stderr.write(message.rstrip("\n") + "\n")


def bad(message: str):
    from ..errors import TempcalError

    return TempcalError(message)


def usage(message: str):
    raise bad(message)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: one-line errors and the contract's exit statuses (0, 1, 2, 3)."""
    # Typer re-exports click's exception classes under different module paths across versions.
    usage_error: Any = _click_class("UsageError")
    click_exception: Any = _click_class("ClickException")
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="tempcal", standalone_mode=False)
    except usage_error as exc:
        hint = f" (see tempcal {exc.ctx.info_name} --help)" if exc.ctx and exc.ctx.parent else ""
        stderr(f"error: {exc.format_message()}{hint}")
        return EXIT_BAD_INPUT
    except click_exception as exc:
        stderr(f"error: {exc.format_message()}")
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        stderr("aborted")
        return 1
    except typer.Exit as exc:
        return exc.exit_code
    except Exception as exc:  # every failure becomes one line and an exit status
        from ..errors import TempcalError

        if isinstance(exc, TempcalError):
            stderr(f"error: {exc}")
            return EXIT_BAD_INPUT
        if os.environ.get("TEMPCAL_DEBUG"):
            raise
        stderr(f"internal error: {type(exc).__name__}: {exc} (set TEMPCAL_DEBUG=1 for the traceback)")
        return 1
    return result if isinstance(result, int) else 0




def _click_class(name: str) -> type[Exception]:
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


def run() -> None:
    """The ``tempcal`` command: :func:`main`, then an exit that skips the interpreter's teardown.

    Every file is closed (and renamed into place) before ``main`` returns, so once standard output
    and error are flushed nothing is left to do; tearing down torch's modules would still take about
    half a second. A flush that fails (a closed pipe) takes the ordinary exit, which reports it.
    """
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        sys.exit(code)
    os._exit(code)


if __name__ == "__main__":
    run()
