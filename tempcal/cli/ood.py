"""``tempcal ood``: out-of-distribution detection by max-softmax probability and energy."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .main import (
    BatchSize,
    ChunkRows,
    Device,
    Inputs,
    InputsKey,
    JsonOut,
    LabelsKey,
    LogitsKey,
    OutputKey,
    Probs,
    Quiet,
    app,
    console,
    emit_json,
    is_model_source,
    usage,
    warn,
)


class ScoreChoice(str, Enum):
    msp = "msp"
    energy = "energy"
    both = "both"


@app.command()
def ood(
    source: Annotated[str, typer.Argument(metavar="SOURCE", help="In-distribution logits file (.safetensors) with "
                                          "'logits' and 'labels'.")],
    ood_files: Annotated[Optional[list[str]], typer.Option(
        "--ood", metavar="FILE", help="Out-of-distribution logits file ('labels' optional); repeat for several.")
    ] = None,
    tau: Annotated[Optional[list[str]], typer.Option(
        "--tau", metavar="T", help="Temperature (> 0, or 'fitted' for the T stored in SOURCE); repeatable. "
        "Default: 0.5 1 2 5 10 20 50 100 1000 and the stored T.")] = None,
    score: Annotated[ScoreChoice, typer.Option("--score", help="max softmax probability, energy "
                                               "(tau * logsumexp(logits / tau)) or both.")] = ScoreChoice.msp,
    json_out: JsonOut = None,
    scores_out: Annotated[Optional[str], typer.Option(
        "--scores", metavar="PATH", help="Write the per-sample scores (one tensor per tau and side) as safetensors.")
    ] = None,
    plot: Annotated[Optional[str], typer.Option(
        "--plot", metavar="PATH", help="Draw ID vs OOD score histograms and AUROC / FPR95 against tau "
        "(.png, .svg or .pdf; needs matplotlib).")] = None,
    logits_key: LogitsKey = "logits",
    labels_key: LabelsKey = "labels",
    probs: Probs = False,
    device: Device = "auto",
    chunk_rows: ChunkRows = None,
    inputs: Inputs = None,
    ood_inputs: Annotated[Optional[list[str]], typer.Option(
        "--ood-inputs", metavar="DATA", help="OOD inputs for a model SOURCE ('inputs'; labels optional); repeatable.")
    ] = None,
    odin_eps: Annotated[Optional[float], typer.Option(
        "--odin-eps", metavar="E", help="ODIN: perturb each input by E against the gradient of the tau-scaled "
        "max log-softmax before scoring (model SOURCE, MSP).")] = None,
    inputs_key: InputsKey = "inputs",
    batch_size: BatchSize = 512,
    output_key: OutputKey = None,
    quiet: Quiet = False,
) -> None:
    """Detect out-of-distribution inputs by MSP or energy at each tau: AUROC, AUPR-In/Out, FPR95 (ID positive)."""
    is_model = is_model_source([source], inputs, [output_key, *(ood_inputs or [])])
    if is_model:
        if ood_files:
            usage("--ood takes logits files; with a model SOURCE give --ood-inputs DATA")
        if not ood_inputs:
            usage("missing option '--ood-inputs DATA': a model SOURCE needs out-of-distribution inputs")
        if odin_eps is not None and score is not ScoreChoice.msp:
            usage("--odin-eps scores by max softmax: drop --score energy/both")
    elif odin_eps is not None:
        usage("--odin-eps needs a TorchScript model SOURCE with --inputs and --ood-inputs")
    elif not ood_files:
        usage("missing option '--ood FILE': give at least one out-of-distribution logits file")
    ood_files = list(ood_files or ood_inputs or [])
    inputs_files = [source, *ood_files]
    outputs = [(option, path) for option, path in (("--json", json_out), ("--scores", scores_out), ("--plot", plot))
               if path is not None and path != "-"]
    for k, (option, path) in enumerate(outputs):
        _check_output(option, path, inputs_files, outputs[:k])
    if plot is not None:
        import importlib.util

        if Path(plot).suffix.lower() not in (".png", ".svg", ".pdf"):
            usage(f"--plot {plot}: the name must end in .png, .svg or .pdf")
        if importlib.util.find_spec("matplotlib") is None:
            usage("--plot needs matplotlib, which is not installed: pip install 'tempcal[plot]'")

    from ..core.distributed import init_from_environment, rank
    from ..workflows.ood import ood_file, plot_report, save_scores

    device = init_from_environment(device)
    scores = ["msp", "energy"] if score is ScoreChoice.both else [score.value]
    progress = json_out != "-" and not quiet
    if is_model and odin_eps is not None:
        from ..models.torchscript import odin_ood

        assert inputs is not None
        report = odin_ood(source, inputs, ood_files, eps=odin_eps, taus=tau, inputs_key=inputs_key,
                          batch_size=batch_size, device=device, output_key=output_key, progress=progress)
    elif is_model:
        from ..models.torchscript import load_model, open_model_source

        model = load_model(source, device)
        options: dict[str, Any] = {"inputs_key": inputs_key, "labels_key": labels_key, "batch_size": batch_size,
                                   "device": device, "output_key": output_key, "progress": progress, "model": model,
                                   "labels_optional": True}
        id_source = open_model_source(source, inputs, **options)
        oods = [open_model_source(source, path, label=path, **options) for path in ood_files]
        report = ood_file(id_source, oods, taus=tau, scores=scores, device=device, chunk_rows=chunk_rows)
    else:
        report = ood_file(source, ood_files, taus=tau, scores=scores, device=device, logits_key=logits_key,
                          labels_key=labels_key, probs=probs, chunk_rows=chunk_rows)
    if rank() != 0:  # under torch.distributed only rank 0 prints and writes
        return
    warn(report.warnings)
    written = []
    if scores_out is not None:
        written.append(f"wrote per-sample scores to {save_scores(report, scores_out)}")
    if plot is not None:
        written.append(f"wrote the plot to {plot_report(report, plot)}")
    payload = report.to_json()
    payload.update(scores_file=scores_out, plot=plot, odin_eps=odin_eps)
    emit_json(json_out, payload)
    if json_out != "-" and not quiet:
        from ..output.ood_console import print_ood

        out = console()
        print_ood(report, out)
        for line in written:
            out.print(line, soft_wrap=True)


def _check_output(option: str, path: str, inputs: list[str], earlier: list[tuple[str, str]]) -> None:
    """Refuse, before any work, an output that would overwrite an input or another output, or cannot be made."""
    target = Path(path)
    if target.is_dir():
        usage(f"{option} {path}: is a folder")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        usage(f"{option} {path}: folder {folder} does not exist")
    real = os.path.realpath(target)
    for name in inputs:
        if os.path.realpath(name) == real:
            usage(f"{option} {path}: would overwrite the input file {name}")
    for other, name in earlier:
        if os.path.realpath(name) == real:
            usage(f"{option} {path}: is also the {other} output")
