"""``tempcal apply``: write a SOURCE's calibrated probabilities (or logits / T) at its stored T, streamed."""

from __future__ import annotations

import os
from enum import Enum
from typing import Annotated, Optional

import typer

import tempcal.cli.options as opt

from ..errors import TempcalError
from .config import ConfiguredCommand
from .config_schema import OUTPUT
from .main import app, check_paths, deliver


class ApplyAs(str, Enum):
    probs = "probs"
    logits = "logits"
    log_probs = "log-probs"


ApplyOutput = Annotated[Optional[str], typer.Option(
    "--output", "-o", metavar="OUT", help="Where to write (.safetensors; .npz; .npy: the values alone, no labels; "
    "a confidence table: a table of its format with a column calibrated_confidence added)."),
    OUTPUT]
ApplyAsOpt = Annotated[ApplyAs, typer.Option(
    "--as", case_sensitive=False, parser=opt.choice(ApplyAs),
    help="What to write: softmax(logits / T) (probs), logits / T (logits) or log_softmax(logits / T) (log-probs).")]
ApplyTau = Annotated[Optional[str], typer.Option(
    "--tau", metavar="T", help="The temperature for every row (> 0), instead of the stored T ('fitted', the "
    "default)."), opt.TAU_VALUE]
Groups = Annotated[bool, typer.Option(
    "--groups/--no-groups", help="Apply each row's stored group T where SOURCE stores per-group temperatures "
    "(--no-groups: the global T for every row).")]


@app.command(cls=ConfiguredCommand)
def apply(
    ctx: typer.Context,
    source: opt.Source,
    output: ApplyOutput = None,
    as_: ApplyAsOpt = ApplyAs.probs,
    tau: ApplyTau = None,
    groups: Groups = True,
    json_out: opt.JsonOut = None,
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
    inputs: opt.Inputs = None,
    inputs_key: opt.InputsKey = "inputs",
    batch_size: opt.BatchSize = 512,
    output_key: opt.OutputKey = None,
    quiet: opt.Quiet = False,
    config: opt.ConfigFile = None,
    no_config: opt.NoConfig = False,
) -> None:
    """Write SOURCE's calibrated probabilities (or logits / T) at its stored T to OUT, chunk by chunk.

    Each row at its group's T where SOURCE stores per-group temperatures. Labels are optional (copied when present).
    """
    from ..workflows.apply import check_output

    if output is None:
        raise TempcalError("missing option '--output OUT': where to write the calibrated values")
    if not opt.own_apply_format(source, confidence, correct):  # a confidence table: its format, checked when read
        check_output(output)
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise TempcalError("tempcal apply writes one file from one process: run it without torchrun")
    opt.is_model_source(source, inputs, {"--output-key": output_key})
    opt.check_lm_eval_norm(source, lm_eval_norm.value)
    check_paths(ctx, {"--output": output, "--json": json_out}, {"SOURCE": source, "--inputs": inputs, "--head": head})

    from ..output.inspect import print_apply
    from ..requests import Outputs
    from ..sources.base import SourceOptions
    from ..workflows.apply import WHAT, apply_file

    reading = SourceOptions(
        logits_key=logits_key, labels_key=labels_key, probs=probs, inputs=inputs, inputs_key=inputs_key,
        batch_size=batch_size, output_key=output_key, device=device, head=head, hidden_key=hidden_key,
        head_weight_key=head_weight_key, head_bias_key=head_bias_key, softcap=softcap, lm_eval_norm=lm_eval_norm.value,
        confidence=confidence, correct=correct, confidence_scale=confidence_scale)
    outputs = Outputs(json_out=json_out, quiet=quiet)
    options = opt.reading_options(ctx, reading, outputs, parallel=False)
    result = apply_file(source[0] if len(source) == 1 else source, output, as_=as_.value, tau=tau, groups=groups,
                        device=device, chunk_rows=chunk_rows, options=options)
    deliver(ctx, outputs, result, warnings=result.warnings, payload=result.to_json, render=print_apply,
            write=lambda: [f"wrote the {WHAT[result.as_]} to {result.output}"])
