"""``tempcal inspect``: what a SOURCE holds (keys, shapes, dtypes, values, labels) and the T stored with it."""

from __future__ import annotations

import typer

import tempcal.cli.options as opt

from ..errors import IGNORE_INDEX
from .config import ConfiguredCommand
from .main import app, check_paths, deliver


@app.command(cls=ConfiguredCommand)
def inspect(
    ctx: typer.Context,
    source: opt.Source,
    json_out: opt.JsonOut = None,
    logits_key: opt.LogitsKey = "logits",
    labels_key: opt.LabelsKey = "labels",
    lm_eval_norm: opt.LmEvalNormOpt = opt.LmEvalNorm.none,
    confidence: opt.Confidence = None,
    correct: opt.Correct = None,
    confidence_scale: opt.ConfidenceScale = 1.0,
    ignore_index: opt.IgnoreIndex = IGNORE_INDEX,
    head: opt.Head = None,
    hidden_key: opt.HiddenKey = "hidden",
    head_weight_key: opt.HeadWeightKey = "weight",
    head_bias_key: opt.HeadBiasKey = "bias",
    softcap: opt.Softcap = None,
    inputs: opt.Inputs = None,
    inputs_key: opt.InputsKey = "inputs",
    batch_size: opt.BatchSize = 512,
    output_key: opt.OutputKey = None,
    device: opt.Device = "auto",
    quiet: opt.Quiet = False,
    config: opt.ConfigFile = None,
    no_config: opt.NoConfig = False,
) -> None:
    """What SOURCE holds: keys, shapes, dtypes, whether its values look like probabilities, its labels, the stored
    T and how it was fitted, and the sidecar's state.

    The first command to run on an unknown file; nothing in it is refused that can be shown.
    """
    opt.check_lm_eval_norm(source, lm_eval_norm.value)
    check_paths(ctx, {"--json": json_out}, {"SOURCE": source, "--inputs": inputs, "--head": head})

    from ..output.inspect import print_inspect
    from ..requests import Outputs
    from ..sources.base import SourceOptions
    from ..workflows.inspect import inspect_file

    reading = SourceOptions(
        logits_key=logits_key, labels_key=labels_key, ignore_index=ignore_index, inputs=inputs, inputs_key=inputs_key,
        batch_size=batch_size, output_key=output_key, device=device, head=head, hidden_key=hidden_key,
        head_weight_key=head_weight_key, head_bias_key=head_bias_key, softcap=softcap, lm_eval_norm=lm_eval_norm.value,
        confidence=confidence, correct=correct, confidence_scale=confidence_scale)
    outputs = Outputs(json_out=json_out, quiet=quiet)
    options = opt.reading_options(ctx, reading, outputs, parallel=False)
    report = inspect_file(source[0] if len(source) == 1 else source, options=options)
    deliver(ctx, outputs, report, warnings=report.warnings, write=list, payload=report.to_json, render=print_inspect)
