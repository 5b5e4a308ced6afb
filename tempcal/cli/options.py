"""Every option shared by the commands, declared once, and the checks that turn them into API arguments (nothing
here imports torch: ``tempcal --help`` and usage errors stay fast)."""

from __future__ import annotations

from enum import Enum
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from ..errors import (
    FRACTION,
    MAX_BINS,
    MAX_RESAMPLES,
    MISCOVERAGE,
    NON_NEGATIVE,
    PERCENTILE,
    POSITIVE,
    UNIT,
    OutOfRange,
    TempcalError,
    check_taus,
    is_fitted,
    temperature_number,
)
from ..html import option as html
from ..lm import options as lm_options
from ..lm.options import BatchTokens, DeviceMap, MaxLength, TextField, WriteGenerationConfig
from ..subsets.flags import Folds, GroupBy, GroupPrior
from .config import given_in
from .config_schema import INPUT, INPUTS, NOT_CONFIGURABLE, OUTPUT, PathValue, ValueType

if TYPE_CHECKING:
    from ..requests import Outputs
    from ..sources.base import SourceOptions


class Objective(str, Enum):
    nll = "nll"
    ece = "ece"


class LmEvalNorm(str, Enum):
    none = "none"
    chars = "chars"
    bytes = "bytes"


def configured_tau(value: Any) -> str:
    """A ``tau`` from a configuration file (a number > 0 or "fitted") as the command line would spell it."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError
    if isinstance(value, str) and is_fitted(value):
        return "fitted"
    if temperature_number(value) is None:  # a 400-digit integer too, and a T whose inverse overflows
        raise OutOfRange('a number > 0 or "fitted"', value)
    return value if isinstance(value, str) else repr(value)


def choice(enum: type[Enum]) -> Any:
    """A parser for an option's choices, in any case, whose error says plainly what it takes."""
    names = [str(member.value) for member in enum]  # type: ignore[var-annotated]

    def parse(value: Any) -> Any:
        if isinstance(value, enum):
            return value
        text = str(value).strip().casefold()
        for member in enum:
            if str(member.value).casefold() == text:
                return member
        raise typer.BadParameter(f"'{value}' is not {', '.join(names[:-1])} or {names[-1]}")

    return parse


# -- what to read ---------------------------------------------------------------------------
_SOURCE_HELP = ("Logits file (.safetensors, .npz, .npy, .pt), evaluation log, confidence table or model (tempcal help "
                "formats); several files or a glob are shards{}. Default: the configuration's 'source'.")
Source = Annotated[list[str], typer.Argument(metavar="SOURCE", help=_SOURCE_HELP.format(""), show_default=False,
                                             rich_help_panel="Input"), INPUTS]
LogitsKey = Annotated[str, typer.Option("--logits-key", help="Tensor holding the logits [N, C] (or [N] binary).",
                                        rich_help_panel="Input")]
LabelsKey = Annotated[str, typer.Option("--labels-key", help="Tensor holding the integer labels [N].",
                                        rich_help_panel="Input")]
Probs = Annotated[Optional[bool], typer.Option(
    "--probs/--no-probs", rich_help_panel="Input", help="Values are probabilities: work on log(p) (--probs), or "
    "logits whatever they look like (--no-probs). Default: as the stored T was fitted; values that all look like "
    "probabilities are refused.", show_default=False)]
LmEvalNormOpt = Annotated[LmEvalNorm, typer.Option(
    "--lm-eval-norm", case_sensitive=False, parser=choice(LmEvalNorm),
    help="lm-evaluation-harness log or lighteval details SOURCE: divide each choice's log-likelihood by its text's "
    "length in characters (chars, lm-eval's acc_norm) or UTF-8 bytes (bytes), or not (none).",
    rich_help_panel="Language models")]
Confidence = Annotated[Optional[str], typer.Option(
    "--confidence", metavar="COLUMN", help="Confidence table SOURCE (.csv, .jsonl, .parquet): the column of each "
    "answer's confidence, a probability that it is right (its logit ln(c / (1 - c)) is scaled by T).",
    rich_help_panel="Input")]
Correct = Annotated[Optional[str], typer.Option(
    "--correct", metavar="COLUMN", help="Confidence table SOURCE: the column saying whether each answer was right "
    "(0/1, true/false).", rich_help_panel="Input")]
ConfidenceScale = Annotated[float, typer.Option(
    "--confidence-scale", metavar="S", help="Confidence table SOURCE: what a confidence of 1 is written as (100 "
    "reads percentages).", rich_help_panel="Input"), POSITIVE]
IgnoreIndex = Annotated[int, typer.Option("--ignore-index", rich_help_panel="Input",
                                          help="Rows whose label is this value are skipped (token-level logits).")]
Device = Annotated[str, typer.Option("--device", parser=lambda value: str(value).strip().lower(),  # CUDA:0: cuda:0
                                     rich_help_panel="Scale", help="auto (CUDA when available), cpu, cuda or cuda:N.")]
ChunkRows = Annotated[Optional[int], typer.Option("--chunk-rows", min=1, rich_help_panel="Scale",
                                                  help="Rows per reduction chunk (default: automatic).")]

# -- a model SOURCE -------------------------------------------------------------------------
Inputs = Annotated[Optional[str], typer.Option(
    "--inputs", metavar="DATA", help="Inputs file (.safetensors: 'inputs', 'labels') for a model SOURCE (.pt2, "
    ".onnx, or TorchScript .pt, .pth, .ts, .torchscript).", rich_help_panel="Models"), INPUT]
InputsKey = Annotated[str, typer.Option("--inputs-key", help="Tensor holding the model inputs [N, ...].",
                                        rich_help_panel="Models")]
BatchSize = Annotated[int, typer.Option("--batch-size", min=1, help="Rows per model batch (model SOURCE).",
                                        rich_help_panel="Models")]
OutputKey = Annotated[Optional[str], typer.Option(
    "--output-key", metavar="KEY", help="The logits among a model's outputs: a dict key or a tuple index (an "
    "ONNX model's output name).", rich_help_panel="Models")]
SaveLogits = Annotated[Optional[str], typer.Option(
    "--save-logits", metavar="PATH", help="Keep a model SOURCE's logits (and labels) as a logits file.",
    rich_help_panel="Models"), OUTPUT]

# -- fit's own options ---------------------------------------------------------------------------
EvalFile = Annotated[Optional[str], typer.Option("--eval", metavar="FILE", rich_help_panel="Input",
                                                 help="Fit on all of SOURCE and report on FILE."), INPUTS]
ValFraction = Annotated[float, typer.Option("--val-fraction", help="Fraction of SOURCE that fits T, in (0, 1], "
                                            "class-stratified; the rest is reported on.", rich_help_panel="Fit"),
                        FRACTION]
ObjectiveOpt = Annotated[Objective, typer.Option("--objective", case_sensitive=False,
                                                 parser=choice(Objective), rich_help_panel="Fit",
                                                 help="Minimise the NLL or the binned ECE.")]
OutputCopy = Annotated[Optional[str], typer.Option("--output", metavar="PATH", rich_help_panel="Output",
                                                   help="Write T into a copy at PATH; SOURCE is untouched."), OUTPUT]
NoWrite = Annotated[bool, typer.Option("--no-write/--write", help="Write T nowhere.", rich_help_panel="Output")]
MaxEce = Annotated[Optional[float], typer.Option("--max-ece", metavar="X", min=0.0, rich_help_panel="Gates",
                                                 help="Exit 3 if the calibrated ECE is above X.")]
ConformalAlpha = Annotated[Optional[list[float]], typer.Option(
    "--conformal-alpha", metavar="A", rich_help_panel="Metrics", help="Conformal sets (LAC, APS) at miscoverage A "
    "(0 < A < 1; repeatable): coverage and mean set size at T = 1 and at the fitted T (one more read)."),
    MISCOVERAGE]
ReportConformalAlpha = Annotated[Optional[list[float]], typer.Option(
    "--conformal-alpha", metavar="A", rich_help_panel="Metrics", help="Conformal sets (LAC, APS) at miscoverage A "
    "(0 < A < 1; repeatable) at every tau: coverage and mean set size, thresholds from the stored split's fitting "
    "rows, else a seeded half (one more read)."),
    MISCOVERAGE]
SaveModel = Annotated[Optional[str], typer.Option(
    "--save-model", metavar="PATH", help="Write the model SOURCE calibrated (its logits / T), in the format of "
    "PATH's suffix: .pt2 (from a .pt2 or TorchScript model), .onnx (from an ONNX model), or .pt, .pth, .ts, "
    ".torchscript (from a TorchScript model).", rich_help_panel="Models"), OUTPUT]

# -- hidden states and an output head -------------------------------------------------------
Head = Annotated[Optional[str], typer.Option(
    "--head", metavar="HEAD", help="Output layer (.safetensors with 'weight' [V, d], 'bias' optional, or a Hugging "
    "Face model folder): SOURCE then holds hidden states, and logits are computed block by block.",
    rich_help_panel="Language models"), INPUT]
HiddenKey = Annotated[str, typer.Option("--hidden-key", help="Tensor holding the hidden states [N, d] or [B, L, d] "
                                        "(with --head).", rich_help_panel="Language models")]
HeadWeightKey = Annotated[str, typer.Option("--head-weight-key", help="Tensor of a HEAD file holding the weight "
                                            "[V, d].", rich_help_panel="Language models")]
HeadBiasKey = Annotated[str, typer.Option("--head-bias-key", help="Tensor of a HEAD file holding the bias [V] "
                                          "(optional).", rich_help_panel="Language models")]
Softcap = Annotated[Optional[float], typer.Option("--softcap", metavar="C", help="Cap the logits as C * tanh(z / C) "
                                                  "(C > 0; replaces the HEAD config's final_logit_softcapping).",
                                                  rich_help_panel="Language models"),
                    POSITIVE]

# -- a causal language model run over texts (--lm) ------------------------------------------
OptionalSource = Annotated[Optional[list[str]], typer.Argument(
    metavar="SOURCE", help=_SOURCE_HELP.format("; none with --lm"), show_default=False, rich_help_panel="Input"),
    INPUTS]
# Declared by tempcal.lm.options (flags, types, help, ranges); the paths among them are marked here.
Lm = Annotated[lm_options.Lm, INPUT]
Text = Annotated[lm_options.Text, INPUT]
SaveHidden = Annotated[lm_options.SaveHidden, OUTPUT]
SpillDir = Annotated[lm_options.SpillDir, INPUT]
OodText = Annotated[lm_options.OodText, INPUTS]

# -- what to compute ------------------------------------------------------------------------
#: A temperature option's values in a configuration file and on the command line (``fit`` itself checked later).
TAU_VALUE = ValueType('a number or "fitted"', configured_tau, check=lambda text: check_taus([text]))
Tau = Annotated[Optional[list[str]], typer.Option(
    "--tau", metavar="T", help="Temperature (> 0, or 'fitted' for the T stored with SOURCE); repeatable.",
    rich_help_panel="Temperatures"), TAU_VALUE]
EvalRows = Annotated[bool, typer.Option(
    "--eval-rows/--all-rows", help="Only the rows the stored T was not fitted on.",
    rich_help_panel="Input")]
Bins = Annotated[int, typer.Option("--bins", min=1, max=MAX_BINS, help="Number of equal-width bins for ECE/MCE.",
                                   rich_help_panel="Metrics")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the split and the bootstrap (>= 0).",
                                   rich_help_panel="Fit"),
                 NON_NEGATIVE]
Estimators = Annotated[Optional[str], typer.Option(
    "--estimators", metavar="NAMES", help="More estimators, comma-separated or 'all': ece_equal_mass, ece_classwise, "
    "rms_ce, l2_ce_debiased.", rich_help_panel="Metrics")]
Bootstrap = Annotated[int, typer.Option(
    "--bootstrap", metavar="N", min=0, max=MAX_RESAMPLES, rich_help_panel="Metrics",
    help="95% percentile intervals for ECE and NLL from N seeded resamples.")]

# -- tempcal ood ------------------------------------------------------------------------------
Score = Annotated[str, typer.Option(
    "--score", metavar="NAMES", help="Scores, comma-separated: msp (max softmax), energy (tau * logsumexp(z / "
    "tau)), maxlogit (max z / tau), entropy (sum p ln p), gen (generalized entropy); both = msp,energy; all.",
    rich_help_panel="Scores")]
GenGamma = Annotated[float, typer.Option("--gen-gamma", metavar="G", help="GEN's exponent gamma (> 0).",
                                         rich_help_panel="Scores"), POSITIVE]
GenTop = Annotated[int, typer.Option("--gen-top", metavar="M", min=1, rich_help_panel="Scores",
                                     help="GEN sums over the M largest probabilities (all classes when C <= M).")]
React = Annotated[Optional[float], typer.Option(
    "--react", metavar="P", help="ReAct (with --head): clip hidden-state values at the P-th percentile "
    "(0 < P <= 100) of SOURCE's values before the head; OOD files at the same threshold.",
    rich_help_panel="Scores"), PERCENTILE]
MinAuroc = Annotated[Optional[float], typer.Option("--min-auroc", metavar="X", rich_help_panel="Gates",
                                                   help="Exit 3 if any row's AUROC is below X (0 to 1)."),
                     UNIT]
MaxFpr95 = Annotated[Optional[float], typer.Option("--max-fpr95", metavar="X", rich_help_panel="Gates",
                                                   help="Exit 3 if any row's FPR95 is above X (0 to 1)."),
                     UNIT]
OodBootstrap = Annotated[int, typer.Option(
    "--bootstrap", metavar="N", min=0, max=MAX_RESAMPLES, rich_help_panel="Metrics",
    help="95% percentile intervals for AUROC and FPR95 from N seeded resamples (ID and OOD samples resampled "
    "separately).")]

# -- what to write --------------------------------------------------------------------------
JsonOut = Annotated[Optional[str], typer.Option("--json", metavar="PATH", rich_help_panel="Output",
                                                help="The result as JSON to PATH ('-': standard output)."),
                    PathValue(allow_dash=True)]
Plot = Annotated[Optional[str], typer.Option("--plot", metavar="PATH", help="Plot the result: .png, .svg or .pdf "
                                             "(matplotlib).", rich_help_panel="Output"), OUTPUT]
Markdown = Annotated[Optional[str], typer.Option("--markdown", metavar="PATH", help="The result as a Markdown section "
                                                 "for a model card (also appended to $GITHUB_STEP_SUMMARY when "
                                                 "that names a file).",
                                                 rich_help_panel="Output"), OUTPUT]
Html = Annotated[Optional[str], typer.Option(html.FLAG, metavar="PATH", help=html.HELP, rich_help_panel="Output"),
                 OUTPUT]
Quiet = Annotated[bool, typer.Option("--quiet/--no-quiet", "-q", help="Only warnings, errors and the "
                                     "configuration file.", rich_help_panel="Output")]

# -- the project configuration --------------------------------------------------------------
ConfigFile = Annotated[Optional[str], typer.Option(
    "--config", metavar="PATH", help="Defaults from PATH (default: the nearest tempcal.toml, or pyproject.toml with "
    "[tool.tempcal], from here up).", rich_help_panel="Configuration"), NOT_CONFIGURABLE]
NoConfig = Annotated[bool, typer.Option("--no-config", help="Read no configuration file.",
                                        rich_help_panel="Configuration"), NOT_CONFIGURABLE]


def reading_options(ctx: Any, reading: SourceOptions, outputs: Outputs, *, parallel: bool = True) -> SourceOptions:
    """How a command reads its SOURCE: on the device it computes on (under torchrun the rank's, when ``parallel``), with
    the progress ``outputs`` allow, the remembered options named on the command line winning over a stored reading;
    ``--softcap`` without ``--head`` and ``--head`` with a model's ``--inputs`` refused."""
    from ..sources.base import DEFAULT_KEYS

    device = reading.device
    if parallel:
        from ..core.parallel import init_from_environment

        device = init_from_environment(device)
    if reading.head is None and reading.softcap is not None:
        raise TempcalError("--softcap applies to logits computed with --head")
    if reading.head is not None and reading.inputs is not None:
        raise TempcalError("--head computes logits from hidden states; a model SOURCE with --inputs computes them "
                           "itself: give one or the other")
    given = frozenset(name for name in DEFAULT_KEYS if given_in(ctx, name) == "command line")
    return reading.but(device=device, progress=outputs.progress, given=given)


def command_source(ctx: Any, request: Any) -> list[str]:
    """The command's SOURCE: with ``--lm`` the ``--text`` file (:func:`tempcal.lm.command.lm_source`), else SOURCE,
    the options that need ``--lm`` refused (never silently ignored) and a missing SOURCE click's usage error."""
    if (lm := lm_command(request)) is not None:
        return lm.lm_source(ctx, request)
    given = (["--text"] if request.texts.text is not None else []) + _lm_only_given(request)
    if given:
        raise TempcalError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to a language model run "
                           "with --lm MODEL")
    if not request.source:  # what a required SOURCE argument says (Typer's own click classes)
        import sys

        missing = sys.modules[typer.BadParameter.__module__].MissingParameter
        raise missing(ctx=ctx, param=next(p for p in ctx.command.params if p.name == "source"))
    return request.source


def lm_command(request: Any) -> ModuleType | None:
    """:mod:`tempcal.lm.command`, whose hooks a command asks when it runs with ``--lm``; None without it."""
    if request.reading.lm is None:
        return None
    from ..lm import command

    return command


def lm_files(request: Any, *, record: bool = False) -> dict[str, str | None]:
    """The files an ``--lm`` run writes, to check before any work; none without ``--lm``."""
    lm = lm_command(request)
    return {} if lm is None else lm.lm_outputs(request, record=record)


def lm_json(request: Any, opened: Any) -> dict[str, Any]:
    """What the JSON says of an ``--lm`` run's model and texts; nothing without ``--lm``."""
    return {} if request.reading.lm is None else {"lm": opened.lm_json()}


def _lm_only_given(request: Any) -> list[str]:
    """The options that need ``--lm`` that were given (set to other than the value each has when not given)."""
    reading, outputs = request.reading, request.outputs
    options = (("--text-field", reading.text_field, "text"), ("--max-length", reading.max_length, None),
               ("--batch-tokens", reading.batch_tokens, None), ("--device-map", reading.device_map, None),
               ("--save-hidden", outputs.save_hidden, None), ("--spill-dir", reading.spill_dir, None),
               ("--write-generation-config", outputs.write_generation_config, False),
               ("--ood-text", request.texts.ood_text, None))
    return [flag for flag, value, unset in options if value not in (unset, None, [])]


def is_model_source(source: list[str], inputs: str | None, model_only: dict[str, object]) -> bool:
    """Whether SOURCE is one model file (:func:`~tempcal.models.detect.looks_like_model`); ``model_only`` maps the
    flags that only make sense for a model to their values: any of them set without a model is a usage error."""
    from ..models.detect import MODEL_SUFFIXES, looks_like_model

    named = len(source) == 1 and source[0].lower().endswith(MODEL_SUFFIXES)  # the file is looked at for these only
    model = named and looks_like_model(source[0], inputs is not None)
    if not model and (inputs is not None or any(v is not None for v in model_only.values())):
        flags = ", ".join(["--inputs", *model_only])
        raise TempcalError(f"{flags} apply to a model SOURCE (.pt2, .onnx, or TorchScript .pt/.pth/.ts/.torchscript)")
    return model


def own_apply_format(source: list[str], confidence: str | None, correct: str | None) -> bool:
    """Whether ``apply`` writes SOURCE in its own format (a confidence table, named by its columns or by the kind
    that claims its files), so that OUT is not a tensor file."""
    if confidence is not None or correct is not None:
        return True
    from ..sources.base import SourceOptions, expand_sources
    from ..sources.registry import kind_of

    paths = expand_sources(source)
    return bool(paths) and kind_of(paths, SourceOptions()).own_apply_format


def check_lm_eval_norm(source: list[str], norm: str) -> None:
    """``--lm-eval-norm`` chars or bytes only with an lm-evaluation-harness log or lighteval details SOURCE (never
    silently ignored)."""
    if norm == LmEvalNorm.none.value:
        return
    from ..sources.lighteval import is_lighteval_details
    from ..sources.lm_eval import is_lm_eval_log

    other = next((name for name in source if not (is_lm_eval_log(name) or is_lighteval_details(name))), None)
    if other is not None:
        raise TempcalError(f"--lm-eval-norm {norm} applies to lm-evaluation-harness sample logs "
                           f"(samples_*.jsonl or .jsonl.gz) and lighteval details (details_*.parquet), not to {other}")


def parse_estimators(text: str | None) -> list[str]:
    """``--estimators a,b`` or ``all`` as a checked list of names."""
    if not text:
        return []
    from ..metrics.calibration import ESTIMATORS

    given = text.lower()  # the names are lower case
    names = list(ESTIMATORS) if given.strip() == "all" else [n.strip() for n in given.split(",") if n.strip()]
    unknown = [n for n in names if n not in ESTIMATORS]
    if unknown:
        raise TempcalError(f"--estimators {text}: unknown {', '.join(unknown)}; choose from {', '.join(ESTIMATORS)} "
                           "or 'all'")
    return names


__all__ = ["INPUTS", "NON_NEGATIVE", "OUTPUT", "TAU_VALUE", "BatchTokens", "Bins", "Bootstrap", "ChunkRows",
           "Confidence", "ConfidenceScale", "ConfigFile", "Correct", "Device", "DeviceMap", "Estimators", "EvalFile",
           "EvalRows", "Folds", "GenGamma", "GenTop", "GroupBy", "GroupPrior", "Head", "HeadBiasKey", "HeadWeightKey",
           "HiddenKey", "Html", "IgnoreIndex", "Inputs", "InputsKey", "JsonOut", "LabelsKey", "Lm", "LmEvalNorm",
           "LmEvalNormOpt", "LogitsKey", "Markdown", "MaxEce", "MaxFpr95", "MaxLength", "MinAuroc", "NoConfig",
           "NoWrite", "Objective", "ObjectiveOpt", "OodBootstrap", "OodText", "OptionalSource", "OutputCopy",
           "OutputKey", "Plot", "Probs", "Quiet", "React", "SaveHidden", "SaveLogits", "SaveModel", "Score", "Seed",
           "Softcap", "Source", "SpillDir", "Tau", "Text", "TextField", "ValFraction", "WriteGenerationConfig",
           "check_lm_eval_norm", "choice", "command_source", "is_model_source", "lm_command", "lm_files", "lm_json",
           "parse_estimators", "reading_options"]
