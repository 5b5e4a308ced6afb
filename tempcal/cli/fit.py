"""``tempcal fit``: fit one temperature T, report calibration before and after, write T back."""

from __future__ import annotations

import typer

from ..errors import TempcalError
from ..validation import IGNORE_INDEX
from .config import ConfiguredCommand
from .lm import lm_json, lm_outputs, lm_settings, lm_source, sampling_notes
from .main import app, check_paths, deliver, progress_line, start
from .options import (
    BatchSize,
    BatchTokens,
    Bins,
    Bootstrap,
    ChunkRows,
    ConfigFile,
    ConformalAlpha,
    Device,
    DeviceMap,
    Estimators,
    EvalFile,
    Folds,
    GroupBy,
    GroupPrior,
    Head,
    HeadBiasKey,
    HeadWeightKey,
    HiddenKey,
    Html,
    IgnoreIndex,
    Inputs,
    InputsKey,
    JsonOut,
    LabelsKey,
    Lm,
    LmEvalNorm,
    LmEvalNormOpt,
    LogitsKey,
    Markdown,
    MaxEce,
    MaxLength,
    NoConfig,
    NoWrite,
    Objective,
    ObjectiveOpt,
    OptionalSource,
    OutputCopy,
    OutputKey,
    Plot,
    Probs,
    Quiet,
    SaveHidden,
    SaveLogits,
    SaveModel,
    Seed,
    Softcap,
    SpillDir,
    Text,
    TextField,
    ValFraction,
    WriteGenerationConfig,
    check_lm_eval_norm,
    is_model_source,
    parse_estimators,
    source_options,
)


@app.command(cls=ConfiguredCommand)
def fit(
    ctx: typer.Context,
    source: OptionalSource = None,
    eval_file: EvalFile = None,
    val_fraction: ValFraction = 0.5,
    folds: Folds = None,
    group_by: GroupBy = None,
    group_prior: GroupPrior = None,
    seed: Seed = 0,
    objective: ObjectiveOpt = Objective.nll,
    bins: Bins = 15,
    json_out: JsonOut = None,
    output: OutputCopy = None,
    no_write: NoWrite = False,
    max_ece: MaxEce = None,
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
    ignore_index: IgnoreIndex = IGNORE_INDEX,
    estimators: Estimators = None,
    bootstrap: Bootstrap = 0,
    conformal_alpha: ConformalAlpha = None,
    inputs: Inputs = None,
    inputs_key: InputsKey = "inputs",
    batch_size: BatchSize = 512,
    output_key: OutputKey = None,
    save_logits: SaveLogits = None,
    save_model: SaveModel = None,
    lm: Lm = None,
    text: Text = None,
    text_field: TextField = "text",
    max_length: MaxLength = None,
    batch_tokens: BatchTokens = None,
    device_map: DeviceMap = None,
    save_hidden: SaveHidden = None,
    spill_dir: SpillDir = None,
    write_generation_config: WriteGenerationConfig = False,
    quiet: Quiet = False,
    config: ConfigFile = None,
    no_config: NoConfig = False,
) -> None:
    """Fit one temperature T (the NLL's minimum, certified in a few reads of the data), report calibration before and
    after, write T back."""
    folds, split, eval_file = _cross_fitting(ctx, folds, val_fraction, eval_file, group_by, group_prior)
    source = lm_source(ctx, source, values=locals())
    is_model = _check_writes(source, inputs=inputs, output=output, no_write=no_write, max_ece=max_ece, probs=probs,
                             save_model=save_model, save_logits=save_logits, output_key=output_key,
                             lm_eval_norm=lm_eval_norm)
    _check_paths(ctx, source, eval_file, is_model, locals())

    from ..output.console import print_fit
    from ..output.markdown import fit_markdown
    from ..workflows.fit import fit_file

    device = start(device)
    options = source_options(locals(), device=device, progress=json_out != "-" and not quiet)
    report = fit_file(source, eval_file=eval_file, val_fraction=split, seed=seed, objective=objective.value,
                      bins=bins, device=device, chunk_rows=chunk_rows, estimators=parse_estimators(estimators),
                      bootstrap=bootstrap, conformal_alpha=conformal_alpha or (), folds=folds, group_by=group_by,
                      group_prior=group_prior, options=options, progress=progress_line("fitting T", options.progress))
    gate_failed = max_ece is not None and report.after.ece > max_ece
    written: list[str] = []
    report.warnings.extend(sampling_notes(lm, write_generation_config))
    values = locals()
    deliver(ctx, warnings=report.warnings, write=lambda: _write(report, values, written),
            payload=lambda: _payload(report, values, written),
            render=lambda out: print_fit(report, out), summary=lambda: fit_markdown(report), json_out=json_out,
            quiet=quiet, html=html,
            gate=f"calibrated ECE {report.after.ece:.4f} is above --max-ece {max_ece:g}" if gate_failed else None)


def _wrote(report, written: list[str]) -> list[str]:
    """The lines naming what write-back stored where: T, and the groups' temperatures."""
    if not written:
        return []
    lines = [f"wrote tempcal.temperature = {report.temperature!r} into {', '.join(written)}"]
    if report.group_temperatures is not None:
        lines.append(f"wrote the temperatures of {len(report.group_temperatures)} groups (tempcal.group_temperatures, "
                     f"by {report.subsets.group_key}) into {', '.join(written)}")
    return lines


def _cross_fitting(ctx: typer.Context, folds: int | None, val_fraction: float, eval_file: str | None,
                   group_by: str | None, group_prior: float | None) -> tuple[int | None, float | None, str | None]:
    """``--folds`` against ``--val-fraction`` and ``--eval``: on the command line together, or in the configuration
    file together, they are refused; across the two, the command line wins. Returns folds, the split (None: the
    default) and the evaluation file. ``--group-prior`` needs ``--group-by``."""
    if group_prior is not None and group_by is None:
        raise TempcalError("--group-prior weighs the per-group fits of --group-by KEY; give --group-by too")
    def given(name: str) -> str | None:
        source = ctx.get_parameter_source(name)
        kind = getattr(source, "name", "")
        return "command line" if kind in ("COMMANDLINE", "ENVIRONMENT") else "file" if kind == "DEFAULT_MAP" else None

    split = val_fraction if given("val_fraction") else None
    if folds is None:
        return None, split, eval_file
    for name, flag, value in (("val_fraction", "--val-fraction", split), ("eval_file", "--eval", eval_file)):
        if value is None:
            continue
        if given(name) == given("folds"):
            where = "" if given(name) == "command line" else " (both in the configuration file)"
            raise TempcalError(f"--folds K fits and reports on every row of SOURCE, out of fold; {flag} splits it "
                               f"otherwise: give one or the other{where}")
        if given("folds") == "file":
            return None, split, eval_file  # the command line's split wins over the file's folds
        split, eval_file = (None, eval_file) if name == "val_fraction" else (split, None)
    return folds, split, eval_file


def _check_writes(source: list[str], *, inputs: str | None, output: str | None, no_write: bool,
                  max_ece: float | None, probs: bool | None, save_model: str | None, save_logits: str | None,
                  output_key: str | None, lm_eval_norm: LmEvalNorm) -> bool:
    """Refuse contradictory options before any file is read; whether SOURCE is a model."""
    check_lm_eval_norm(source, lm_eval_norm)
    if no_write and output is not None:
        raise TempcalError("--output and --no-write contradict each other")
    if output is not None and (len(source) > 1 or any(ch in source[0] for ch in "*?[")):
        raise TempcalError("--output takes a single SOURCE file; shards get T written into each of them")
    if max_ece is not None and not max_ece >= 0:
        raise TempcalError(f"--max-ece must be a number >= 0, got {max_ece}")
    is_model = is_model_source(source, inputs, {"--save-model": save_model, "--save-logits": save_logits,
                                                "--output-key": output_key})
    if is_model and output is not None:
        raise TempcalError("--output writes a logits file; for a model SOURCE use --save-model PATH "
                           "(and --save-logits PATH)")
    if is_model and probs:
        raise TempcalError("--probs applies to logits files, not to a model SOURCE")
    if is_model and save_model is not None:
        from ..models.detect import save_format

        save_format(source[0], save_model)  # a format that cannot be written from SOURCE's: refused before any work
    return is_model


def _check_paths(ctx: typer.Context, source: list[str], eval_file: str | None, is_model: bool, values: dict) -> None:
    """Every path the command writes or reads, checked before any work (see :func:`check_paths`)."""
    no_write, output, lm = values["no_write"], values["output"], values["lm"]
    check_paths(ctx, {"--json": values["json_out"], "--plot": values["plot"], "--html": values["html"],
                      "--markdown": values["markdown"], "--save-model": values["save_model"],
                      "--save-logits": values["save_logits"], **_record_outputs(values)},
                {"SOURCE": source, "--eval": eval_file, "--inputs": values["inputs"], "--head": values["head"],
                 "--lm": values["lm"]},
                write_back=None if no_write or output is not None or is_model or lm else source)


def _record_outputs(values: dict) -> dict[str, str | None]:
    """Where T goes, to check before any work: ``--output`` (and its sidecar), or, with --lm, MODEL's files."""
    lm, output = values["lm"], values["output"]
    if lm is None:
        return {"--output": output, **_copy_sidecar(output)}
    return lm_outputs(lm, record=not values["no_write"], output=output,
                      generation=values["write_generation_config"], save_hidden=values["save_hidden"])


def _payload(report, values: dict, written: list[str]) -> dict:
    """The JSON: the report, the files that hold T, the gate, and with --lm the model and its texts."""
    out = report.to_json()
    max_ece = values["max_ece"]
    out.update(written=", ".join(written) or None, max_ece=max_ece,
               gate_passed=None if max_ece is None else not values["gate_failed"],
               **lm_json(report.opened, values["lm"]))
    return out


def _write(report, values: dict, written: list[str]) -> list[str]:
    """Write T back (or, with --lm, into MODEL's record) and the files asked for; the lines saying so. ``written``
    gains the files that now hold T."""
    from ..output.files import write_fit_files
    from ..workflows.fit import write_back

    if values["lm"] is not None:
        lines = _write_lm(report, values, written)
    else:
        written.extend(write_back(report, output=values["output"], save_model=values["save_model"],
                                  save_logits=values["save_logits"], store=not values["no_write"]))
        lines = _wrote(report, written)
        if values["is_model"] and values["save_logits"]:
            lines.append(f"wrote the logits to {values['save_logits']}")
    return lines + write_fit_files(report, plot=values["plot"], markdown=values["markdown"])


def _write_lm(report, values: dict, written: list[str]) -> list[str]:
    """--lm's write-back (the record, generation_config.json, --save-hidden); ``written`` gains the files holding T."""
    from ..workflows.lm import write_lm_back

    settings = lm_settings(command="fit", val_fraction=values["val_fraction"], seed=values["seed"],
                           objective=values["objective"], bins=values["bins"], eval=values["eval_file"],
                           device=report.device)
    holding, lines = write_lm_back(report, output=values["output"], store=not values["no_write"],
                                   generation=values["write_generation_config"], save_hidden=values["save_hidden"],
                                   settings=settings)
    written.extend(holding)
    return lines


def _copy_sidecar(output: str | None) -> dict[str, str]:
    """The sidecar ``--output`` gets when the copy is not a safetensors file (T cannot go in its metadata)."""
    if output is None or output.lower().endswith(".safetensors"):
        return {}
    from ..io.sidecar import sidecar_path

    return {"the sidecar of --output": str(sidecar_path(output))}
