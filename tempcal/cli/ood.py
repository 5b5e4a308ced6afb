"""``tempcal ood``: out-of-distribution detection by training-free scores (MSP, energy, MaxLogit, entropy, GEN)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..errors import TempcalError
from .config import ConfiguredCommand
from .lm import lm_outputs, lm_source
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
    Head,
    HeadBiasKey,
    HeadWeightKey,
    HiddenKey,
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
    json_out: JsonOut = None,
    scores_out: Annotated[Optional[str], typer.Option(
        "--scores", metavar="PATH",
        help="Write the per-sample scores (one tensor per score, tau and side) as safetensors."), OUTPUT] = None,
    plot: Plot = None,
    markdown: Markdown = None,
    logits_key: LogitsKey = "logits",
    labels_key: LabelsKey = "labels",
    probs: Probs = False,
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

    Without --tau: 0.5 1 2 5 10 20 50 100 1000 and the T stored with SOURCE. With --lm MODEL --text FILE
    --ood-text FILE: a causal language model's next-token predictions on in- and out-of-distribution texts.
    """
    from ..scores import score_names
    from .report import lm_only

    source = lm_source(ctx, source, lm=lm, text=text, lm_only=lm_only(locals()))
    scores = score_names(score)
    others = _lm_ood_sets(ood_files, ood_text) if lm else _ood_sets(source, inputs, ood_files, ood_inputs, odin_eps,
                                                                       output_key)
    check_lm_eval_norm(source, lm_eval_norm)
    check_paths(ctx, {"--json": json_out, "--scores": scores_out, "--plot": plot, "--markdown": markdown,
                      **lm_outputs(lm, record=False, save_hidden=save_hidden)},
                {"SOURCE": source, "--ood": ood_files, "--inputs": inputs, "--ood-inputs": ood_inputs, "--head": head,
                 "--ood-text": ood_text})

    from ..output.console import print_ood
    from ..output.files import write_ood_files
    from ..output.markdown import ood_markdown
    from ..workflows.ood import ood_file

    device = start(device)
    options = source_options(locals(), device=device, progress=json_out != "-" and not quiet)
    opened = None
    if lm is not None:  # opened here: the JSON describes its model and every text file it ran over
        from ..sources.registry import open_source

        opened = open_source(source, options)
    report = ood_file(opened or (source[0] if len(source) == 1 else source), others, taus=tau, scores=scores,
                      device=device, chunk_rows=chunk_rows, gen_gamma=gen_gamma, gen_top=gen_top, bootstrap=bootstrap,
                      seed=seed, min_auroc=min_auroc, max_fpr95=max_fpr95, odin_eps=odin_eps, options=options)

    def write() -> list[str]:
        from ..workflows.lm import save_hidden_lines

        kept = save_hidden_lines(opened, save_hidden) if opened is not None else []
        return kept + write_ood_files(report, scores=scores_out, plot=plot, markdown=markdown)

    def payload() -> dict:
        out = report.to_json()
        out.update(scores_file=scores_out, plot=plot, markdown=markdown, odin_eps=odin_eps)
        if opened is not None:
            out["lm"] = opened.lm_json()  # type: ignore[attr-defined]
        return out

    deliver(ctx, warnings=report.warnings, write=write, payload=payload, render=lambda out: print_ood(report, out),
            summary=lambda: ood_markdown(report), json_out=json_out, quiet=quiet, gate=gate_message(report))


def _ood_sets(source: list[str], inputs: str | None, ood_files: list[str] | None, ood_inputs: list[str] | None,
              odin_eps: float | None, output_key: str | None) -> list[str]:
    """The OOD sets: logits files (``--ood``), or inputs files for a model SOURCE (``--ood-inputs``), after
    refusing options that do not fit."""
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
