"""``tempcal ood``: out-of-distribution detection by scores such as max-softmax probability and energy."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer

from ..errors import TempcalError
from .config import ConfiguredCommand
from .main import app, deliver, start
from .options import (
    INPUTS,
    OUTPUT,
    BatchSize,
    ChunkRows,
    ConfigFile,
    Device,
    Head,
    HeadBiasKey,
    HeadWeightKey,
    HiddenKey,
    Inputs,
    InputsKey,
    JsonOut,
    LabelsKey,
    LmEvalNorm,
    LmEvalNormOpt,
    LogitsKey,
    Markdown,
    NoConfig,
    OutputKey,
    Plot,
    Probs,
    Quiet,
    Softcap,
    Source,
    Tau,
    check_lm_eval_norm,
    check_outputs,
    is_model_source,
    source_options,
)


class ScoreChoice(str, Enum):
    msp = "msp"
    energy = "energy"
    both = "both"


@app.command(cls=ConfiguredCommand)
def ood(
    ctx: typer.Context,
    source: Source,
    ood_files: Annotated[Optional[list[str]], typer.Option(
        "--ood", metavar="FILE", help="Out-of-distribution logits file ('labels' optional); repeat for several."),
        INPUTS] = None,
    tau: Tau = None,
    score: Annotated[ScoreChoice, typer.Option("--score", help="max softmax probability, energy "
                                               "(tau * logsumexp(logits / tau)) or both.")] = ScoreChoice.msp,
    json_out: JsonOut = None,
    scores_out: Annotated[Optional[str], typer.Option(
        "--scores", metavar="PATH", help="Write the per-sample scores (one tensor per tau and side) as safetensors."),
        OUTPUT] = None,
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
    inputs: Inputs = None,
    ood_inputs: Annotated[Optional[list[str]], typer.Option(
        "--ood-inputs", metavar="DATA", help="OOD inputs for a model SOURCE ('inputs'; labels optional); repeatable."),
        INPUTS] = None,
    odin_eps: Annotated[Optional[float], typer.Option(
        "--odin-eps", metavar="E", help="ODIN: perturb each input by E against the gradient of the tau-scaled "
        "max log-softmax before scoring (model SOURCE, MSP).")] = None,
    inputs_key: InputsKey = "inputs",
    batch_size: BatchSize = 512,
    output_key: OutputKey = None,
    quiet: Quiet = False,
    config: ConfigFile = None,
    no_config: NoConfig = False,
) -> None:
    """Detect out-of-distribution inputs by MSP or energy at each tau: AUROC, AUPR-In/Out, FPR95 (ID positive).

    Without --tau: 0.5 1 2 5 10 20 50 100 1000 and the T stored with SOURCE.
    """
    others = _ood_sides(source, inputs=inputs, ood_files=ood_files, ood_inputs=ood_inputs, odin_eps=odin_eps,
                        output_key=output_key)
    check_lm_eval_norm(source, lm_eval_norm)
    check_outputs({"--json": json_out, "--scores": scores_out, "--plot": plot, "--markdown": markdown},
                  [*source, *others])

    from ..output.console import print_ood
    from ..output.files import write_ood_files
    from ..output.markdown import ood_markdown
    from ..workflows.ood import ood_file

    device = start(device)
    options = source_options(locals(), device=device, progress=json_out != "-" and not quiet)
    scores = ["msp", "energy"] if score is ScoreChoice.both else [score.value]
    report = ood_file(source[0] if len(source) == 1 else source, others, taus=tau, scores=scores, device=device,
                      chunk_rows=chunk_rows, odin_eps=odin_eps, options=options)

    def write() -> list[str]:
        return write_ood_files(report, scores=scores_out, plot=plot, markdown=markdown)

    def payload() -> dict:
        out = report.to_json()
        out.update(scores_file=scores_out, plot=plot, markdown=markdown, odin_eps=odin_eps)
        return out

    deliver(ctx, warnings=report.warnings, write=write, payload=payload, render=lambda out: print_ood(report, out),
            summary=lambda: ood_markdown(report), json_out=json_out, quiet=quiet)


def _ood_sides(source: list[str], *, inputs: str | None, ood_files: list[str] | None, ood_inputs: list[str] | None,
               odin_eps: float | None, output_key: str | None) -> list[str]:
    """The OOD files (logits files, or a model SOURCE's inputs files), after refusing options that do not fit."""
    is_model = is_model_source(source, inputs, {"--output-key": output_key, "--ood-inputs": ood_inputs or None})
    if is_model:
        if ood_files:
            raise TempcalError("--ood takes logits files; with a model SOURCE give --ood-inputs DATA")
        if not ood_inputs:
            raise TempcalError("missing option '--ood-inputs DATA': a model SOURCE needs out-of-distribution inputs")
    elif odin_eps is not None:
        raise TempcalError("--odin-eps needs a TorchScript model SOURCE with --inputs and --ood-inputs")
    elif not ood_files:
        raise TempcalError("missing option '--ood FILE': give at least one out-of-distribution logits file")
    return list(ood_files or ood_inputs or [])
