"""``tempcal ood``: out-of-distribution detection by training-free scores (MSP, energy, MaxLogit, entropy, GEN)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

import tempcal.cli.options as opt

from ..errors import TempcalError
from .config import ConfiguredCommand
from .main import app, check_paths, deliver

if TYPE_CHECKING:  # the command's imports of these wait until it runs: --help needs none
    from ..requests import OodRequest

# ood's own options (declared here, not in the signature, so that each run does not build them again).
OodFiles = Annotated[Optional[list[str]], typer.Option(
    "--ood", metavar="FILE", help="Out-of-distribution logits file ('labels' optional); repeat for several."),
    opt.INPUTS]
ScoresOut = Annotated[Optional[str], typer.Option(
    "--scores", metavar="PATH",
    help="Write the per-sample scores (one tensor per score, tau and side) as safetensors."), opt.OUTPUT]
OodInputs = Annotated[Optional[list[str]], typer.Option(
    "--ood-inputs", metavar="DATA", help="OOD inputs for a model SOURCE ('inputs'; labels optional); repeatable."),
    opt.INPUTS]
OdinEps = Annotated[Optional[float], typer.Option(
    "--odin-eps", metavar="E", help="ODIN: perturb each input by E against the gradient of the tau-scaled "
    "max log-softmax before scoring (model SOURCE, MSP; E >= 0)."), opt.NON_NEGATIVE]


@app.command(cls=ConfiguredCommand)
def ood(
    ctx: typer.Context,
    source: opt.OptionalSource = None,
    ood_files: OodFiles = None,
    tau: opt.Tau = None,
    score: opt.Score = "msp",
    gen_gamma: opt.GenGamma = 0.1,
    gen_top: opt.GenTop = 100,
    min_auroc: opt.MinAuroc = None,
    max_fpr95: opt.MaxFpr95 = None,
    bootstrap: opt.OodBootstrap = 0,
    seed: opt.Seed = 0,
    group_by: opt.GroupBy = None,
    json_out: opt.JsonOut = None,
    scores_out: ScoresOut = None,
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
    react: opt.React = None,
    inputs: opt.Inputs = None,
    ood_inputs: OodInputs = None,
    odin_eps: OdinEps = None,
    inputs_key: opt.InputsKey = "inputs",
    batch_size: opt.BatchSize = 512,
    output_key: opt.OutputKey = None,
    lm: opt.Lm = None,
    text: opt.Text = None,
    ood_text: opt.OodText = None,
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
    """Detect out-of-distribution inputs by training-free scores at each tau: AUROC, AUPR-In/Out, FPR95 (ID positive).

    Without --tau: 0.5 1 2 5 10 20 50 100 1000 and the T stored with SOURCE.
    """
    from ..requests import OodRequest, Outputs, Texts
    from ..sources.base import SourceOptions

    reading = SourceOptions(
        logits_key=logits_key, labels_key=labels_key, probs=probs, inputs=inputs, inputs_key=inputs_key,
        batch_size=batch_size, output_key=output_key, device=device, head=head, hidden_key=hidden_key,
        head_weight_key=head_weight_key, head_bias_key=head_bias_key, softcap=softcap, lm_eval_norm=lm_eval_norm.value,
        confidence=confidence, correct=correct, confidence_scale=confidence_scale,
        react=react, lm=lm, text_field=text_field, max_length=max_length, batch_tokens=batch_tokens,
        device_map=device_map, spill_dir=spill_dir)
    outputs = Outputs(json_out=json_out, plot=plot, html=html, markdown=markdown, quiet=quiet, scores=scores_out,
                      save_hidden=save_hidden)
    _ood(ctx, OodRequest(
        source=source, reading=reading, outputs=outputs, texts=Texts(text=text, ood_text=ood_text),
        chunk_rows=chunk_rows, ood_files=ood_files, ood_inputs=ood_inputs, taus=tau, score=score, gen_gamma=gen_gamma,
        gen_top=gen_top, odin_eps=odin_eps, min_auroc=min_auroc, max_fpr95=max_fpr95, bootstrap=bootstrap,
        seed=seed, group_by=group_by))


def _ood(ctx: typer.Context, request: OodRequest) -> None:
    """The command, from its request: the checks before any work, the scores, the outputs, the gate."""
    from ..scores import score_names

    reading, outputs = request.reading, request.outputs
    source = opt.command_source(ctx, request)
    scores = score_names(request.score)
    others = _ood_sets(source, request)
    opt.check_lm_eval_norm(source, reading.lm_eval_norm)
    check_paths(ctx, {**outputs.files(), **opt.lm_files(request)},
                {"SOURCE": source, "--ood": request.ood_files, "--inputs": reading.inputs,
                 "--ood-inputs": request.ood_inputs, "--head": reading.head, "--ood-text": request.texts.ood_text,
                 "--lm": reading.lm})

    from ..output.console import print_ood
    from ..output.markdown import ood_markdown
    from ..output.ood_checks import caveats
    from ..workflows.ood import ood_file

    options = opt.reading_options(ctx, reading, outputs)
    report = ood_file(source[0] if len(source) == 1 else source, others, taus=request.taus, scores=scores,
                      device=options.device, chunk_rows=request.chunk_rows, gen_gamma=request.gen_gamma,
                      gen_top=request.gen_top, bootstrap=request.bootstrap, seed=request.seed,
                      min_auroc=request.min_auroc, max_fpr95=request.max_fpr95, odin_eps=request.odin_eps,
                      group_by=request.group_by, options=options)
    notes = caveats(report)  # in the JSON, the page and the step summary; the console view prints them itself
    report.warnings.extend(notes)
    warned = [message for message in report.warnings if not (outputs.progress and message in notes)]
    deliver(ctx, outputs, report, warnings=warned, write=lambda: _write(report, request),
            payload=lambda: {**report.to_json(), "scores_file": outputs.scores, "plot": outputs.plot,
                             "markdown": outputs.markdown, "odin_eps": request.odin_eps,
                             **opt.lm_json(request, report.opened)},
            render=print_ood, summary=ood_markdown,
            gate=gate_message(report))


def _write(report, request: OodRequest) -> list[str]:
    """The files asked for (``--save-hidden``, ``--scores``, ``--plot``, ``--markdown``); the lines saying so."""
    from ..output.files import write_files

    outputs = request.outputs
    kept = [] if request.reading.lm is None else report.opened.keep_hidden(outputs.save_hidden)
    return kept + write_files("ood", report, scores=outputs.scores, plot=outputs.plot, markdown=outputs.markdown)


def _ood_sets(source: list[str], request: OodRequest) -> list[str]:
    """The OOD sets: logits files (``--ood``), inputs files for a model SOURCE (``--ood-inputs``), or texts for
    ``--lm`` (``--ood-text``), after refusing options that do not fit."""
    ood_files, ood_inputs, reading = request.ood_files, request.ood_inputs, request.reading
    if (lm := opt.lm_command(request)) is not None:
        return lm.ood_texts(ood_files, request.texts.ood_text)
    flags: dict[str, object] = {"--output-key": reading.output_key, "--ood-inputs": ood_inputs or None}
    if opt.is_model_source(source, reading.inputs, flags):
        if ood_files:
            raise TempcalError("--ood takes logits files; with a model SOURCE give --ood-inputs DATA")
        if not ood_inputs:
            raise TempcalError("missing option '--ood-inputs DATA': a model SOURCE needs out-of-distribution inputs")
    elif request.odin_eps is not None:
        raise TempcalError("--odin-eps needs a model SOURCE (.pt2 or TorchScript) with --inputs and --ood-inputs")
    elif not ood_files:
        raise TempcalError("missing option '--ood FILE': give at least one out-of-distribution logits file")
    return list(ood_files or ood_inputs or [])


def gate_message(report) -> str | None:
    """What standard error says when the gate fails: how many rows fail, then each failing row on its own line."""
    if not report.gate_failures:
        return None
    bounds = ", ".join(f"{flag} {value:g}" for flag, value in (("--min-auroc", report.min_auroc),
                                                                ("--max-fpr95", report.max_fpr95))
                       if value is not None)
    lines = [f"{len(report.gate_failures)} of {len(report.results)} reported rows fail {bounds}:"]
    lines.extend(f"  {failure.line()}" for failure in report.gate_failures)
    return "\n".join(lines)
