"""Every option shared by the commands, declared once, and the checks that turn them into API arguments.

Nothing here imports torch: ``tempcal --help`` and usage errors stay fast.
"""

from __future__ import annotations

import os
from enum import Enum
from typing import Annotated, Any, Optional

import typer

from ..errors import TempcalError


class Objective(str, Enum):
    nll = "nll"
    ece = "ece"


# -- what to read ---------------------------------------------------------------------------
Source = Annotated[list[str], typer.Argument(
    metavar="SOURCE", help="Logits file (.safetensors with 'logits' and 'labels'; .npz, .npy, .pt too), or a "
    "model with --inputs; several files or a glob pattern are read as shards.")]
LogitsKey = Annotated[str, typer.Option("--logits-key", help="Tensor holding the logits [N, C] (or [N] binary).")]
LabelsKey = Annotated[str, typer.Option("--labels-key", help="Tensor holding the integer labels [N].")]
Probs = Annotated[bool, typer.Option("--probs", help="The logits tensor holds probabilities; work on log(p).")]
IgnoreIndex = Annotated[int, typer.Option("--ignore-index",
                                          help="Rows whose label is this value are skipped (token-level logits).")]
Device = Annotated[str, typer.Option("--device", help="auto (CUDA when available), cpu or cuda.")]
ChunkRows = Annotated[Optional[int], typer.Option("--chunk-rows", min=1,
                                                  help="Rows per reduction chunk (default: automatic).")]

# -- a model SOURCE -------------------------------------------------------------------------
Inputs = Annotated[Optional[str], typer.Option(
    "--inputs", metavar="DATA", help="Inputs file (.safetensors: 'inputs', 'labels') for a TorchScript model SOURCE.")]
InputsKey = Annotated[str, typer.Option("--inputs-key", help="Tensor holding the model inputs [N, ...].")]
BatchSize = Annotated[int, typer.Option("--batch-size", min=1, help="Rows per model batch (model SOURCE).")]
OutputKey = Annotated[Optional[str], typer.Option(
    "--output-key", metavar="KEY", help="The logits among a model's outputs: a dict key or a tuple index.")]
SaveLogits = Annotated[Optional[str], typer.Option(
    "--save-logits", metavar="PATH", help="Keep a model SOURCE's logits (and labels) as a logits file.")]

# -- hidden states and an output head -------------------------------------------------------
Head = Annotated[Optional[str], typer.Option(
    "--head", metavar="HEAD", help="Output layer (.safetensors with 'weight' [V, d], 'bias' optional, or a Hugging "
    "Face model folder): SOURCE then holds hidden states, and logits are computed block by block.")]
HiddenKey = Annotated[str, typer.Option("--hidden-key", help="Tensor holding the hidden states [N, d] or [B, L, d] "
                                        "(with --head).")]
HeadWeightKey = Annotated[str, typer.Option("--head-weight-key", help="Tensor of a HEAD file holding the weight "
                                            "[V, d].")]
HeadBiasKey = Annotated[str, typer.Option("--head-bias-key", help="Tensor of a HEAD file holding the bias [V] "
                                          "(optional).")]
Softcap = Annotated[Optional[float], typer.Option("--softcap", metavar="C", help="Cap the logits as C * tanh(z / C) "
                                                  "(replaces the HEAD config's final_logit_softcapping).")]

# -- what to compute ------------------------------------------------------------------------
Tau = Annotated[Optional[list[str]], typer.Option(
    "--tau", metavar="T", help="Temperature (> 0, or 'fitted' for the T stored with SOURCE); repeatable.")]
Bins = Annotated[int, typer.Option("--bins", min=1, help="Number of equal-width bins for ECE/MCE.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the split and of the bootstrap resamples.")]
Estimators = Annotated[Optional[str], typer.Option(
    "--estimators", metavar="NAMES", help="More estimators, comma-separated or 'all': ece_equal_mass, ece_classwise, "
    "rms_ce, l2_ce_debiased.")]
Bootstrap = Annotated[int, typer.Option(
    "--bootstrap", metavar="N", min=0, help="95% percentile intervals for ECE and NLL from N seeded resamples.")]

# -- tempcal ood ------------------------------------------------------------------------------
Score = Annotated[str, typer.Option(
    "--score", metavar="NAMES", help="msp (max softmax), energy (tau * logsumexp(logits / tau)), maxlogit "
    "(max logit / tau), entropy (sum p ln p), gen (generalized entropy); both = msp,energy; all; or a "
    "comma-separated list.")]
GenGamma = Annotated[float, typer.Option("--gen-gamma", metavar="G", help="GEN's exponent gamma (> 0).")]
GenTop = Annotated[int, typer.Option("--gen-top", metavar="M", min=1,
                                     help="GEN sums over the M largest probabilities (all classes when C <= M).")]
React = Annotated[Optional[float], typer.Option(
    "--react", metavar="P", help="ReAct (with --head): clip hidden-state values at the P-th percentile "
    "(0 < P <= 100) of SOURCE's values before the head; OOD files at the same threshold.")]
MinAuroc = Annotated[Optional[float], typer.Option("--min-auroc", metavar="X",
                                                   help="Exit 3 when any reported row has AUROC below X.")]
MaxFpr95 = Annotated[Optional[float], typer.Option("--max-fpr95", metavar="X",
                                                   help="Exit 3 when any reported row has FPR95 above X.")]
OodBootstrap = Annotated[int, typer.Option(
    "--bootstrap", metavar="N", min=0, help="95% percentile intervals for AUROC and FPR95 from N seeded resamples "
    "(ID and OOD samples resampled separately).")]

# -- what to write --------------------------------------------------------------------------
JsonOut = Annotated[Optional[str], typer.Option("--json", metavar="PATH",
                                                help="Write the result as JSON to PATH ('-' for standard output).")]
Plot = Annotated[Optional[str], typer.Option("--plot", metavar="PATH", help="Draw the result (.png, .svg or .pdf; "
                                             "needs matplotlib).")]
Markdown = Annotated[Optional[str], typer.Option("--markdown", metavar="PATH",
                                                 help="Write a calibration section for a model card.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print only warnings and errors.")]


def source_options(values: dict[str, Any], **overrides: Any) -> Any:
    """The options of every kind of SOURCE, as the API takes them, from a command's parameter ``values``
    (``locals()``: the ones named like ``SourceOptions`` fields are taken) and ``overrides``."""
    from dataclasses import fields

    from ..sources.base import SourceOptions

    chosen = {f.name: values[f.name] for f in fields(SourceOptions) if f.name in values}
    chosen.update(overrides)
    if chosen.get("head") is None and chosen.get("softcap") is not None:
        raise TempcalError("--softcap applies to logits computed with --head")
    if chosen.get("head") is not None and chosen.get("inputs") is not None:
        raise TempcalError("--head computes logits from hidden states; a model SOURCE with --inputs computes them "
                           "itself: give one or the other")
    return SourceOptions(**chosen)


def is_model_source(source: list[str], inputs: str | None, model_only: dict[str, object]) -> bool:
    """A model SOURCE: one model file and ``--inputs`` (or a TorchScript archive). ``model_only`` maps the flags
    that only make sense for a model to their values: any of them set without a model is a usage error."""
    from ..models.detect import looks_like_model

    model = len(source) == 1 and looks_like_model(source[0], inputs is not None)
    if not model and (inputs is not None or any(v is not None for v in model_only.values())):
        flags = ", ".join(["--inputs", *model_only])
        raise TempcalError(f"{flags} apply to a TorchScript model SOURCE")
    return model


def parse_estimators(text: str | None) -> list[str]:
    """``--estimators a,b`` or ``all`` as a checked list of names."""
    if not text:
        return []
    from ..metrics.estimators import ESTIMATORS

    names = list(ESTIMATORS) if text.strip() == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ESTIMATORS]
    if unknown:
        raise TempcalError(f"--estimators {text}: unknown {', '.join(unknown)}; choose from {', '.join(ESTIMATORS)} "
                           "or 'all'")
    return names


def check_outputs(outputs: dict[str, str | None], inputs: list[str]) -> None:
    """Refuse, before any work, an output that is a folder, lies in no folder, or would overwrite an input or
    another output; ``--plot`` must also name a picture format that can be drawn."""
    from ..io.atomic import check_destination
    from ..output.plots import check_plot_path

    given = [(flag, path) for flag, path in outputs.items() if path is not None and path != "-"]
    for k, (flag, path) in enumerate(given):
        check_destination(path, f"{flag} {path}")
        real = os.path.realpath(path)
        for name in inputs:
            if os.path.realpath(name) == real:
                raise TempcalError(f"{flag} {path}: would overwrite the input file {name}")
        for other, name in given[:k]:
            if os.path.realpath(name) == real:
                raise TempcalError(f"{flag} {path}: is also the {other} output")
        if flag == "--plot":
            check_plot_path(path)


__all__ = [
    "Bins",
    "Bootstrap",
    "ChunkRows",
    "Device",
    "Estimators",
    "GenGamma",
    "GenTop",
    "Head",
    "HeadBiasKey",
    "HeadWeightKey",
    "HiddenKey",
    "IgnoreIndex",
    "Inputs",
    "InputsKey",
    "JsonOut",
    "LabelsKey",
    "LogitsKey",
    "Markdown",
    "MaxFpr95",
    "MinAuroc",
    "Objective",
    "OodBootstrap",
    "OutputKey",
    "Plot",
    "Probs",
    "Quiet",
    "React",
    "SaveLogits",
    "Score",
    "Seed",
    "Softcap",
    "Source",
    "Tau",
    "check_outputs",
    "is_model_source",
    "parse_estimators",
    "source_options",
]
