"""``tempcal report``: calibration metrics at one or more temperatures, or over a sweep."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Optional

import typer

import tempcal.cli.options as opt

from ..errors import IGNORE_INDEX, TempcalError
from .config import ConfiguredCommand
from .main import app, check_paths, deliver

if TYPE_CHECKING:  # the command's imports of these wait until it runs: --help needs none
    from ..requests import ReportRequest

#: Memory per reliability bin and temperature: its sums, and its entry in the results and the JSON.
BIN_BYTES = 512


def parse_sweep(text: str) -> list[float]:
    """``START:STOP:COUNT`` as COUNT log-spaced temperatures."""
    from ..output.plots import log_spaced

    try:
        first, last, number = text.split(":")
        start, stop, count = float(first), float(last), int(number)
    except ValueError:
        raise TempcalError(f"--sweep {text}: expected START:STOP:COUNT, e.g. 0.5:5:20") from None
    if not (0 < start < stop and math.isfinite(stop) and 2 <= count <= 10_000):
        raise TempcalError(f"--sweep {text}: expected 0 < START < STOP and 2 <= COUNT <= 10000")
    return log_spaced(start, stop, count)


Sweep = Annotated[Optional[str], typer.Option("--sweep", metavar="START:STOP:COUNT",
                                              help="COUNT log-spaced temperatures from START to STOP.")]


@app.command(cls=ConfiguredCommand)
def report(
    ctx: typer.Context,
    source: opt.OptionalSource = None,
    tau: opt.Tau = None,
    sweep: Sweep = None,
    bins: opt.Bins = 15,
    json_out: opt.JsonOut = None,
    plot: opt.Plot = None,
    html: opt.Html = None,
    markdown: opt.Markdown = None,
    logits_key: opt.LogitsKey = "logits",
    labels_key: opt.LabelsKey = "labels",
    probs: opt.Probs = None,
    lm_eval_norm: opt.LmEvalNormOpt = opt.LmEvalNorm.none,
    confidence: opt.Confidence = None,
    correct: opt.Correct = None,
    confidence_scale: opt.ConfidenceScale = 1.0,
    device: opt.Device = "auto",
    chunk_rows: opt.ChunkRows = None,
    head: opt.Head = None,
    hidden_key: opt.HiddenKey = "hidden",
    head_weight_key: opt.HeadWeightKey = "weight",
    head_bias_key: opt.HeadBiasKey = "bias",
    softcap: opt.Softcap = None,
    ignore_index: opt.IgnoreIndex = IGNORE_INDEX,
    estimators: opt.Estimators = None,
    bootstrap: opt.Bootstrap = 0,
    seed: opt.Seed = 0,
    group_by: opt.GroupBy = None,
    eval_rows: opt.EvalRows = False,
    conformal_alpha: opt.ReportConformalAlpha = None,
    inputs: opt.Inputs = None,
    inputs_key: opt.InputsKey = "inputs",
    batch_size: opt.BatchSize = 512,
    output_key: opt.OutputKey = None,
    save_logits: opt.SaveLogits = None,
    lm: opt.Lm = None,
    text: opt.Text = None,
    text_field: opt.TextField = "text",
    max_length: opt.MaxLength = None,
    batch_tokens: opt.BatchTokens = None,
    device_map: opt.DeviceMap = None,
    save_hidden: opt.SaveHidden = None,
    spill_dir: opt.SpillDir = None,
    quiet: opt.Quiet = False,
    config: opt.ConfigFile = None,
    no_config: opt.NoConfig = False,
) -> None:
    """Calibration metrics (NLL, ECE, MCE, Brier, accuracy, entropy, reliability bins) at one or more temperatures.

    Without --tau: the T stored with SOURCE (with --lm: MODEL/tempcal.json's), else 1.
    """
    from ..requests import Outputs, ReportRequest, Texts
    from ..sources.base import SourceOptions

    reading = SourceOptions(
        logits_key=logits_key, labels_key=labels_key, probs=probs, ignore_index=ignore_index, inputs=inputs,
        inputs_key=inputs_key, batch_size=batch_size, output_key=output_key, device=device, head=head,
        hidden_key=hidden_key, head_weight_key=head_weight_key, head_bias_key=head_bias_key, softcap=softcap,
        lm_eval_norm=lm_eval_norm.value, confidence=confidence, correct=correct,
        confidence_scale=confidence_scale, lm=lm, text_field=text_field, max_length=max_length,
        batch_tokens=batch_tokens, device_map=device_map, spill_dir=spill_dir)
    outputs = Outputs(json_out=json_out, plot=plot, html=html, markdown=markdown, quiet=quiet, save_logits=save_logits,
                      save_hidden=save_hidden)
    _report(ctx, ReportRequest(
        source=source, reading=reading, outputs=outputs, texts=Texts(text=text), chunk_rows=chunk_rows, taus=tau,
        sweep=sweep, bins=bins, estimators=estimators, bootstrap=bootstrap, seed=seed, group_by=group_by,
        eval_rows=eval_rows, conformal_alpha=conformal_alpha))


def _report(ctx: typer.Context, request: ReportRequest) -> None:
    """The command, from its request: the checks before any work, the figures, the outputs."""
    source = opt.command_source(ctx, request)
    taus: list[float | str] = list(request.taus or [])
    grid = parse_sweep(request.sweep) if request.sweep else []
    reading, outputs = request.reading, request.outputs
    is_model = opt.is_model_source(source, reading.inputs, {"--save-logits": outputs.save_logits,
                                                            "--output-key": reading.output_key})
    opt.check_lm_eval_norm(source, reading.lm_eval_norm)
    check_paths(ctx, {**outputs.files(), **opt.lm_files(request)},
                {"SOURCE": source, "--inputs": reading.inputs, "--head": reading.head, "--lm": reading.lm})

    from ..core.limits import check_fits
    from ..output.console import print_report
    from ..output.markdown import report_markdown
    from ..workflows.report import report_file

    # every bin is kept, and listed in the output, at every temperature
    bins, temperatures = request.bins, len(taus) + len(grid) + 1
    check_fits("bins", bins, BIN_BYTES * temperatures, "cpu", f"{bins} bins at up to {temperatures} temperatures")
    options = opt.reading_options(ctx, reading, outputs)
    result = report_file(source, taus=taus, sweep=grid, bins=bins, device=options.device,
                         chunk_rows=request.chunk_rows, estimators=opt.parse_estimators(request.estimators),
                         bootstrap=request.bootstrap, seed=request.seed, group_by=request.group_by,
                         eval_rows=request.eval_rows, conformal_alpha=request.conformal_alpha or (), options=options)
    deliver(ctx, outputs, result, warnings=result.warnings, write=lambda: _write(result, request, is_model),
            payload=lambda: {**result.to_json(), **opt.lm_json(request, result.opened)}, render=print_report,
            summary=report_markdown)


def _write(result, request: ReportRequest, is_model: bool) -> list[str]:
    """The files asked for (--save-hidden, --save-logits, --plot, --markdown); the lines saying so."""
    from ..output.files import write_files

    outputs = request.outputs
    lines = [] if request.reading.lm is None else result.opened.keep_hidden(outputs.save_hidden)
    if is_model and outputs.save_logits:
        from ..models.save import save_logits as write_logits

        kept = write_logits(result.opened.data, outputs.save_logits, temperature=result.stored_temperature)
        lines.append(f"wrote the logits to {kept}")
    return lines + write_files("report", result, plot=outputs.plot, markdown=outputs.markdown)
