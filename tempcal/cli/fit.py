"""``tempcal fit``: fit one temperature T, report calibration before and after, write T back."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

import tempcal.cli.options as opt

from ..errors import IGNORE_INDEX, TempcalError
from ..subsets.options import settle_folds
from .config import ConfiguredCommand, given_in
from .main import app, check_paths, deliver

if TYPE_CHECKING:  # the command's imports of these wait until it runs: --help needs none
    from ..requests import FitRequest


@app.command(cls=ConfiguredCommand)
def fit(
    ctx: typer.Context,
    source: opt.OptionalSource = None,
    eval_file: opt.EvalFile = None,
    val_fraction: opt.ValFraction = 0.5,
    folds: opt.Folds = None,
    group_by: opt.GroupBy = None,
    group_prior: opt.GroupPrior = None,
    seed: opt.Seed = 0,
    objective: opt.ObjectiveOpt = opt.Objective.nll,
    bins: opt.Bins = 15,
    json_out: opt.JsonOut = None,
    output: opt.OutputCopy = None,
    no_write: opt.NoWrite = False,
    max_ece: opt.MaxEce = None,
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
    conformal_alpha: opt.ConformalAlpha = None,
    inputs: opt.Inputs = None,
    inputs_key: opt.InputsKey = "inputs",
    batch_size: opt.BatchSize = 512,
    output_key: opt.OutputKey = None,
    save_logits: opt.SaveLogits = None,
    save_model: opt.SaveModel = None,
    lm: opt.Lm = None,
    text: opt.Text = None,
    text_field: opt.TextField = "text",
    max_length: opt.MaxLength = None,
    batch_tokens: opt.BatchTokens = None,
    device_map: opt.DeviceMap = None,
    save_hidden: opt.SaveHidden = None,
    spill_dir: opt.SpillDir = None,
    write_generation_config: opt.WriteGenerationConfig = False,
    quiet: opt.Quiet = False,
    config: opt.ConfigFile = None,
    no_config: opt.NoConfig = False,
) -> None:
    """Fit one temperature T (the NLL's minimum, certified in a few reads of the data), report calibration before and
    after, write T back."""
    from ..requests import FitRequest, Outputs, Texts
    from ..sources.base import SourceOptions

    reading = SourceOptions(
        logits_key=logits_key, labels_key=labels_key, probs=probs, ignore_index=ignore_index, inputs=inputs,
        inputs_key=inputs_key, batch_size=batch_size, output_key=output_key, device=device, head=head,
        hidden_key=hidden_key, head_weight_key=head_weight_key, head_bias_key=head_bias_key, softcap=softcap,
        lm_eval_norm=lm_eval_norm.value, confidence=confidence, correct=correct,
        confidence_scale=confidence_scale, lm=lm, text_field=text_field, max_length=max_length,
        batch_tokens=batch_tokens, device_map=device_map, spill_dir=spill_dir)
    outputs = Outputs(json_out=json_out, plot=plot, html=html, markdown=markdown, quiet=quiet, output=output,
                      no_write=no_write, save_model=save_model, save_logits=save_logits, save_hidden=save_hidden,
                      write_generation_config=write_generation_config)
    _fit(ctx, FitRequest(
        source=source, reading=reading, outputs=outputs, texts=Texts(text=text), chunk_rows=chunk_rows,
        eval_file=eval_file, val_fraction=val_fraction, folds=folds, group_by=group_by, group_prior=group_prior,
        seed=seed, objective=objective.value, bins=bins, max_ece=max_ece, estimators=estimators,
        bootstrap=bootstrap, conformal_alpha=conformal_alpha))


def _fit(ctx: typer.Context, request: FitRequest) -> None:
    """The command, from its request: the checks before any work, the fit, the write-back and the outputs."""
    request = settle_folds(request, lambda name: given_in(ctx, name))  # --folds against --val-fraction and --eval
    source = opt.command_source(ctx, request)
    is_model = _check_writes(source, request)
    reading, outputs = request.reading, request.outputs
    check_paths(ctx, {**outputs.files(), **_record_outputs(request)},
                {"SOURCE": source, "--eval": request.eval_file, "--inputs": reading.inputs, "--head": reading.head,
                 "--lm": reading.lm},
                write_back=None if outputs.no_write or outputs.output is not None or is_model or reading.lm else source)

    from ..output.console import print_fit
    from ..output.markdown import fit_markdown
    from ..progress import Progress
    from ..workflows.fit import fit_file

    options = opt.reading_options(ctx, reading, outputs)
    report = fit_file(source, eval_file=request.eval_file, val_fraction=request.split, seed=request.seed,
                      objective=request.objective, bins=request.bins, device=options.device,
                      chunk_rows=request.chunk_rows, estimators=opt.parse_estimators(request.estimators),
                      bootstrap=request.bootstrap, conformal_alpha=request.conformal_alpha or (), folds=request.folds,
                      group_by=request.group_by, group_prior=request.group_prior, options=options,
                      progress=Progress("fitting T", enabled=options.progress))
    max_ece = request.max_ece
    gate_failed = max_ece is not None and report.after.ece > max_ece
    written: list[str] = []
    if (lm := opt.lm_command(request)) is not None:
        report.warnings.extend(lm.sampling_notes(request))
    deliver(ctx, outputs, report, warnings=report.warnings, write=lambda: _write(report, request, written),
            payload=lambda: {**report.to_json(), "written": ", ".join(written) or None, "max_ece": max_ece,
                             "gate_passed": None if max_ece is None else not gate_failed,
                             **opt.lm_json(request, report.opened)},
            render=print_fit, summary=fit_markdown,
            gate=f"calibrated ECE {report.after.ece:.4f} is above --max-ece {max_ece:g}" if gate_failed else None)


def _check_writes(source: list[str], request: FitRequest) -> bool:
    """Refuse contradictory options before any file is read; whether SOURCE is a model."""
    outputs = request.outputs
    opt.check_lm_eval_norm(source, request.reading.lm_eval_norm)
    if outputs.no_write and outputs.output is not None:
        raise TempcalError("--output and --no-write contradict each other")
    if outputs.output is not None and (len(source) > 1 or any(ch in source[0] for ch in "*?[")):
        raise TempcalError("--output takes a single SOURCE file; shards get T written into each of them")
    is_model = opt.is_model_source(source, request.reading.inputs, {"--save-model": outputs.save_model,
                                                                    "--save-logits": outputs.save_logits,
                                                                    "--output-key": request.reading.output_key})
    if is_model and outputs.output is not None:
        raise TempcalError("--output writes a logits file; for a model SOURCE use --save-model PATH "
                           "(and --save-logits PATH)")
    if is_model and request.reading.probs:
        raise TempcalError("--probs applies to logits files, not to a model SOURCE")
    if is_model and outputs.save_model is not None:
        from ..models.detect import save_format

        save_format(source[0], outputs.save_model)  # a format that cannot be written from SOURCE's: refused early
    return is_model


def _record_outputs(request: FitRequest) -> dict[str, str | None]:
    """Where T goes, to check before any work: ``--output`` (and its sidecar, when the copy is no safetensors file
    whose metadata can hold T), or, with --lm, MODEL's files."""
    output = request.outputs.output
    if request.reading.lm is not None:
        return opt.lm_files(request, record=not request.outputs.no_write)
    if output is None or output.lower().endswith(".safetensors"):
        return {"--output": output}
    from ..io.paths import sidecar_path

    return {"--output": output, "the sidecar of --output": str(sidecar_path(output))}


def _write(report, request: FitRequest, written: list[str]) -> list[str]:
    """Keep T where SOURCE's kind keeps it (``written`` gains those files) and write the files asked for; the lines
    saying so."""
    from ..output.files import write_files
    from ..workflows.fit import keep_fit

    outputs = request.outputs
    settings = None if request.reading.lm is None else dict(  # what --lm's record keeps of the command
        command="fit", val_fraction=request.val_fraction, seed=request.seed, objective=request.objective,
        bins=request.bins, eval=request.eval_file, device=report.device)
    kept = keep_fit(report, output=outputs.output, store=not outputs.no_write, save_model=outputs.save_model,
                    save_logits=outputs.save_logits, generation=outputs.write_generation_config,
                    save_hidden=outputs.save_hidden, settings=settings)
    written.extend(kept.paths)
    return kept.lines + write_files("fit", report, plot=outputs.plot, markdown=outputs.markdown)
