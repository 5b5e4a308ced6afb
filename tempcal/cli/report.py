"""``tempcal report``: calibration metrics at one or more temperatures, or over a sweep."""

from __future__ import annotations

import math
from typing import Annotated, Optional

import typer

from ..validation import check_taus
from .main import (
    BatchSize,
    Bins,
    Bootstrap,
    ChunkRows,
    Device,
    Estimators,
    IgnoreIndex,
    Inputs,
    InputsKey,
    JsonOut,
    LabelsKey,
    LogitsKey,
    OutputKey,
    Probs,
    Quiet,
    SaveLogits,
    app,
    console,
    emit_json,
    is_model_source,
    model_sources,
    parse_estimators,
    usage,
    warn,
)


def parse_sweep(text: str) -> list[float]:
    """``START:STOP:COUNT`` as COUNT log-spaced temperatures."""
    from ..output.plots import log_spaced

    parts = text.split(":")
    try:
        start, stop, count = float(parts[0]), float(parts[1]), int(parts[2])
        if len(parts) != 3:
            raise ValueError
    except (ValueError, IndexError):
        usage(f"--sweep {text}: expected START:STOP:COUNT, e.g. 0.5:5:20")
    if not (0 < start < stop and math.isfinite(stop) and 2 <= count <= 10_000):
        usage(f"--sweep {text}: expected 0 < START < STOP and 2 <= COUNT <= 10000")
    return log_spaced(start, stop, count)


@app.command()
def report(
    source: Annotated[list[str], typer.Argument(
        metavar="SOURCE", help="Logits file (.safetensors) with 'logits' and 'labels'; several files or a glob "
        "pattern are read as shards.")],
    tau: Annotated[Optional[list[str]], typer.Option("--tau", metavar="T",
                                                     help="Temperature (repeatable); 'fitted' = the stored T. "
                                                     "Default: the stored T, else 1.")] = None,
    sweep: Annotated[Optional[str], typer.Option("--sweep", metavar="START:STOP:COUNT",
                                                 help="COUNT log-spaced temperatures from START to STOP.")] = None,
    bins: Bins = 15,
    json_out: JsonOut = None,
    plot: Annotated[Optional[str], typer.Option("--plot", metavar="PATH",
                                                help="Reliability diagram (or, with --sweep, metrics against tau); "
                                                ".png, .svg or .pdf.")] = None,
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
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap resamples.")] = 0,
    inputs: Inputs = None,
    inputs_key: InputsKey = "inputs",
    batch_size: BatchSize = 512,
    output_key: OutputKey = None,
    save_logits: SaveLogits = None,
    quiet: Quiet = False,
) -> None:
    """Calibration metrics (NLL, ECE, MCE, Brier, accuracy, entropy, reliability bins) at one or more temperatures."""
    taus: list[float | str] = list(tau or [])
    check_taus(taus)  # numbers are checked before any file is read
    grid = parse_sweep(sweep) if sweep else []
    if plot:
        from ..output.plots import check_plot_path

        check_plot_path(plot)

    from ..core.distributed import init_from_environment, rank
    from ..workflows.common import report_file

    device = init_from_environment(device)
    target: object = source
    if is_model_source(source, inputs, [save_logits, output_key]):
        target, _, _ = model_sources(source[0], inputs, None, inputs_key=inputs_key, labels_key=labels_key,
                                     batch_size=batch_size, device=device, output_key=output_key,
                                     progress=json_out != "-" and not quiet)
        if save_logits:
            from ..models.torchscript import save_logits as write_logits

            write_logits(target.data, save_logits, temperature=target.stored_temperature)  # type: ignore[attr-defined]
    result = report_file(target, taus=taus, sweep=grid, bins=bins, device=device, logits_key=logits_key,
                         labels_key=labels_key, probs=probs, chunk_rows=chunk_rows, ignore_index=ignore_index,
                         estimators=parse_estimators(estimators), bootstrap=bootstrap, seed=seed)
    if rank() != 0:  # under torch.distributed only rank 0 prints and writes
        return
    warn(result.warnings)
    if plot:
        from ..output.plots import reliability_diagram, sweep_plot

        if grid:
            marks: dict[str, float] = {}
            if result.sweep_best is not None:
                marks["min NLL"] = result.sweep_best
            if result.stored_temperature is not None:
                marks["stored T"] = result.stored_temperature
            sweep_plot(result.results, marks, plot)
        else:
            reliability_diagram([(f"tau = {m.tau:.4g}", m) for m in result.results[:4]], plot)
    if markdown:
        from ..io.atomic import write_text_atomic
        from ..output.markdown import report_markdown

        write_text_atomic(markdown, report_markdown(result, markdown, plot), what="--markdown")
    emit_json(json_out, result.to_json())
    if json_out != "-" and not quiet:
        from ..output.console import print_report

        print_report(result, console())
