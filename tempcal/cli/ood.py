"""``tempcal ood``: out-of-distribution detection by training-free scores (MSP, energy, MaxLogit, entropy, GEN)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..errors import TempcalError
from .config import ConfiguredCommand
from .lm import kept_hidden, lm_json, lm_outputs, lm_source
from .main import app, check_paths, deliver, start
from .options import (
    INPUTS,
    NON_NEGATIVE,
    OUTPUT,
    BatchSize,
    BatchTokens,
    ChunkRows,
    ConfigFile,
    Device,
    DeviceMap,
    GenGamma,
    GenTop,
    GroupBy,
    Head,
    HeadBiasKey,
    HeadWeightKey,
    HiddenKey,
    Html,
    Inputs,
    InputsKey,
    JsonOut,
    LabelsKey,
    Lm,
    LmEvalNorm,
    LmEvalNormOpt,
    LogitsKey,
    Markdown,
    MaxFpr95,
    MaxLength,
    MinAuroc,
    NoConfig,
    OodBootstrap,
    OodText,
    OptionalSource,
    OutputKey,
    Plot,
    Probs,
    Quiet,
    React,
    SaveHidden,
    Score,
    Seed,
    Softcap,
    SpillDir,
    Tau,
    Text,
    TextField,
    check_lm_eval_norm,
    is_model_source,
    source_options,
)


@app.command(cls=ConfiguredCommand)
def ood(
    ctx: typer.Context,
    source: OptionalSource = None,
    ood_files: Annotated[Optional[list[str]], typer.Option(
        "--ood", metavar="FILE", help="Out-of-distribution logits file ('labels' optional); repeat for several."),
        INPUTS] = None,
    tau: Tau = None,
    score: Score = "msp",
    gen_gamma: GenGamma = 0.1,
    gen_top: GenTop = 100,
    min_auroc: MinAuroc = None,
    max_fpr95: MaxFpr95 = None,
    bootstrap: OodBootstrap = 0,
    seed: Seed = 0,
    group_by: GroupBy = None,
    json_out: JsonOut = None,
    scores_out: Annotated[Optional[str], typer.Option(
        "--scores", metavar="PATH",
        help="Write the per-sample scores (one tensor per score, tau and side) as safetensors."), OUTPUT] = None,
    plot: Plot = None,
    html: Html = None,
    markdown: Markdown = None,
    logits_key: LogitsKey = "logits",
    labels_key: LabelsKey = "labels",
    probs: Probs = None,
    lm_eval_norm: LmEvalNormOpt = LmEvalNorm.none,
    device: Device = "auto",
    chunk_rows: ChunkRows = None,
    head: Head = None,
    hidden_key: HiddenKey = "hidden",
    head_weight_key: HeadWeightKey = "weight",
    head_bias_key: HeadBiasKey = "bias",
    softcap: Softcap = None,
    react: React = None,
    inputs: Inputs = None,
    ood_inputs: Annotated[Optional[list[str]], typer.Option(
        "--ood-inputs", metavar="DATA", help="OOD inputs for a model SOURCE ('inputs'; labels optional); repeatable."),
        INPUTS] = None,
    odin_eps: Annotated[Optional[float], typer.Option(
        "--odin-eps", metavar="E", help="ODIN: perturb each input by E against the gradient of the tau-scaled "
        "max log-softmax before scoring (model SOURCE, MSP; E >= 0)."), NON_NEGATIVE] = None,
    inputs_key: InputsKey = "inputs",
    batch_size: BatchSize = 512,
    output_key: OutputKey = None,
    lm: Lm = None,
    text: Text = None,
    ood_text: OodText = None,
    text_field: TextField = "text",
    max_length: MaxLength = None,
    batch_tokens: BatchTokens = None,
    device_map: DeviceMap = None,
    save_hidden: SaveHidden = None,
    spill_dir: SpillDir = None,
    quiet: Quiet = False,
    config: ConfigFile = None,
    no_config: NoConfig = False,
) -> None:
    """Detect out-of-distribution inputs by training-free scores at each tau: AUROC, AUPR-In/Out, FPR95 (ID positive).

    Without --tau: 0.5 1 2 5 10 20 50 100 1000 and the T stored with SOURCE.
    """
    source, scores, others = _checked(ctx, locals())

    from ..output.console import print_ood
    from ..output.markdown import ood_markdown
    from ..workflows.ood import ood_file

    device = start(device)
    options = source_options(locals(), device=device, progress=json_out != "-" and not quiet)
    report = ood_file(source[0] if len(source) == 1 else source, others, taus=tau, scores=scores, device=device,
                      chunk_rows=chunk_rows, gen_gamma=gen_gamma, gen_top=gen_top, bootstrap=bootstrap, seed=seed,
                      min_auroc=min_auroc, max_fpr95=max_fpr95, odin_eps=odin_eps, group_by=group_by, options=options)
    warned = _with_caveats(report, shown=json_out != "-" and not quiet)
    values = locals()
    deliver(ctx, warnings=warned, write=lambda: _write(report, values),
            payload=lambda: _payload(report, values), render=lambda out: print_ood(report, out),
            summary=lambda: ood_markdown(report), json_out=json_out, quiet=quiet, html=html,
            gate=gate_message(report))


def _with_caveats(report, *, shown: bool) -> list[str]:
    """The caveats (scores that mean nothing on probabilities; float32-fragile taus) join the report's warnings, for
    the JSON, the page and the step summary; the warnings to print, without them when the console view is ``shown``
    (it prints them as notes beside the tables: said once)."""
    from ..output.ood_checks import caveats

    notes = caveats(report)
    report.warnings.extend(notes)
    return [message for message in report.warnings if not (shown and message in notes)]


def _checked(ctx, values: dict) -> tuple[list[str], list[str], list[str]]:
    """Before any work: SOURCE (with --lm, the --text file), the scores, the OOD sets, every path; what they are."""
    from ..scores import score_names

    source = lm_source(ctx, values["source"], values=values)
    scores = score_names(values["score"])
    ood_files, ood_inputs, ood_text = values["ood_files"], values["ood_inputs"], values["ood_text"]
    others = _ood_sets(source, values["inputs"], ood_files, ood_inputs, values["odin_eps"], values["output_key"],
                       lm=values["lm"], ood_text=ood_text)
    check_lm_eval_norm(source, values["lm_eval_norm"])
    check_paths(ctx, {"--json": values["json_out"], "--scores": values["scores_out"], "--plot": values["plot"],
                      "--html": values["html"], "--markdown": values["markdown"],
                      **lm_outputs(values["lm"], record=False, save_hidden=values["save_hidden"])},
                {"SOURCE": source, "--ood": ood_files, "--inputs": values["inputs"], "--ood-inputs": ood_inputs,
                 "--head": values["head"], "--ood-text": ood_text, "--lm": values["lm"]})
    return source, scores, others


def _write(report, values: dict) -> list[str]:
    """The files asked for (``--save-hidden``, ``--scores``, ``--plot``, ``--markdown``); the lines saying so."""
    from ..output.files import write_ood_files

    kept = kept_hidden(report.opened, values["save_hidden"]) if values["lm"] else []
    return kept + write_ood_files(report, scores=values["scores_out"], plot=values["plot"],
                                  markdown=values["markdown"])


def _payload(report, values: dict) -> dict:
    out = report.to_json()
    out.update(scores_file=values["scores_out"], plot=values["plot"], markdown=values["markdown"],
               odin_eps=values["odin_eps"])
    return {**out, **lm_json(report.opened, values["lm"])}


def _ood_sets(source: list[str], inputs: str | None, ood_files: list[str] | None, ood_inputs: list[str] | None,
              odin_eps: float | None, output_key: str | None, *, lm: str | None = None,
              ood_text: list[str] | None = None) -> list[str]:
    """The OOD sets: logits files (``--ood``), inputs files for a model SOURCE (``--ood-inputs``), or texts for
    ``--lm`` (``--ood-text``), after refusing options that do not fit."""
    if lm is not None:
        return _lm_ood_sets(ood_files, ood_text)
    is_model = is_model_source(source, inputs, {"--output-key": output_key, "--ood-inputs": ood_inputs or None})
    if is_model:
        if ood_files:
            raise TempcalError("--ood takes logits files; with a model SOURCE give --ood-inputs DATA")
        if not ood_inputs:
            raise TempcalError("missing option '--ood-inputs DATA': a model SOURCE needs out-of-distribution inputs")
    elif odin_eps is not None:
        raise TempcalError("--odin-eps needs a model SOURCE (.pt2 or TorchScript) with --inputs and --ood-inputs")
    elif not ood_files:
        raise TempcalError("missing option '--ood FILE': give at least one out-of-distribution logits file")
    return list(ood_files or ood_inputs or [])


def _lm_ood_sets(ood_files: list[str] | None, ood_text: list[str] | None) -> list[str]:
    """The OOD texts of an --lm run (--ood takes logits files, which --lm does not read)."""
    if ood_files:
        raise TempcalError("--ood takes logits files; with --lm give out-of-distribution texts with --ood-text FILE")
    if not ood_text:
        raise TempcalError("missing option '--ood-text FILE': --lm needs out-of-distribution texts")
    return list(ood_text)


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
