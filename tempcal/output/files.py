"""What a command writes besides the console: its JSON, the step summary (one ``write``, never a byte into what is
no regular file), ``--plot``, ``--markdown``, ``ood --scores``, and the outputs a package registers (``--html``)."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from ..errors import format_temperature, param

STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


def emit_json(target: str | None, payload: dict) -> None:
    """Write ``payload`` to ``target`` (a path, ``-`` for standard output, or None for nowhere)."""
    if target is None:
        return
    text = json.dumps(payload, indent=2, allow_nan=False) + "\n"
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from ..io.paths import write_text_atomic  # the writers' imports wait until a file is written: --help needs none

    write_text_atomic(target, text, what=param("json"))


def step_summary_path() -> str | None:
    """The file ``$GITHUB_STEP_SUMMARY`` names, or None when it is unset or empty."""
    return os.environ.get(STEP_SUMMARY_ENV) or None


def append_step_summary(summary: Callable[[], str], *, gate: str | None = None) -> str | None:
    """Append ``summary()`` (and the gate's failure) to the step summary file, when one is named; None, or a
    warning saying why nothing was appended (results and exit status do not depend on it)."""
    path = step_summary_path()
    if path is None:
        return None
    text = summary().rstrip("\n") + "\n"
    if gate:
        text += f"\n**Release gate failed:** {gate}.\n"
    data = (text + "\n").encode("utf-8")
    cannot = f"${STEP_SUMMARY_ENV} {path}: cannot open it to append the summary"
    from ..io.paths import problem_with

    problem = problem_with(path)
    if problem is not None:
        return f"{cannot} ({problem})"
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        return f"{cannot} ({exc.strerror or exc})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced by something else since the check
            return f"{cannot} (not a regular file)"
        done = os.write(fd, data)  # one write: with O_APPEND the section lands whole at the end of the file
        while done < len(data):  # a short write (a full disk, a signal) continues where it stopped
            done += os.write(fd, data[done:])
    except OSError as exc:
        return f"${STEP_SUMMARY_ENV} {path}: cannot append the summary ({exc.strerror or exc})"
    finally:
        os.close(fd)
    return None


#: ``(path) -> None``, raising :class:`~tempcal.errors.TempcalError`; and ``(path, command, result model, JSON,
#: argv) -> the line saying what was written``.
Check = Callable[[str], object]
Write = Callable[[str, str, Any, dict, Sequence[str]], str]
#: Flag -> (check, writer).
EXTRA_OUTPUTS: dict[str, tuple[Check, Write]] = {}


def register(flag: str, check: Check, write: Write) -> None:
    """Add an output (a package does this when it is imported)."""
    EXTRA_OUTPUTS[flag] = (check, write)


def check_extra(flag: str, path: str) -> None:
    """Run the registered check of ``flag`` on ``path`` (nothing for an output no package registered)."""
    if flag in EXTRA_OUTPUTS:
        EXTRA_OUTPUTS[flag][0](path)


def write_extras(paths: Mapping[str, str | None], command: str, result: Any, data: dict,
                 argv: Sequence[str]) -> list[str]:
    """Write every registered output given a path in ``paths``; the lines saying what was written."""
    return [EXTRA_OUTPUTS[flag][1](path, command, result, data, argv) for flag, path in paths.items()
            if path is not None and flag in EXTRA_OUTPUTS]


def write_files(command: Literal["fit", "report", "ood"], result, *, scores: str | None = None, plot: str | None = None,
                markdown: str | None = None) -> list[str]:
    """What ``command`` (fit, report or ood) writes beside its results: ``ood --scores``, the plot and a model-card
    section (written atomically); the lines saying so."""
    from ..io.paths import write_text_atomic
    from .markdown import fit_markdown, ood_markdown, report_markdown

    lines = [] if scores is None else [f"wrote per-sample scores to {save_scores(result, scores)}"]
    if plot:
        from .ood_plots import ood_plot

        draw = {"fit": _fit_plot, "report": _report_plot, "ood": ood_plot}[command]
        lines.append(f"wrote the plot to {draw(result, plot)}")
    if markdown:
        section = {"fit": fit_markdown, "report": report_markdown, "ood": ood_markdown}[command](result, markdown, plot)
        lines.append(f"wrote the Markdown section to {write_text_atomic(markdown, section, what=param('markdown'))}")
    return lines


def _fit_plot(report, path: str) -> Any:
    """``fit``: reliability diagrams before and after (with groups, each group's ECE beneath)."""
    from ..subsets.plots import fit_group_figure, fit_panels, save_figure
    from .plots import reliability_figure

    if getattr(report, "subsets", None) is not None and report.subsets.groups:
        return save_figure(fit_group_figure(report), path)
    return save_figure(reliability_figure(fit_panels(report), report.source), path)


def _report_plot(result, path: str) -> Any:
    """``report``: a reliability diagram (every temperature) or, for a sweep, metrics against tau; risk-coverage
    curves per temperature beneath either; with groups, each group's ECE beneath that."""
    from ..subsets.plots import report_drawing, report_group_figure, save_figure
    from .plots import new_figure

    if getattr(result, "group_rows", None):
        return save_figure(report_group_figure(result), path)
    size, draw = report_drawing(result)
    figure = new_figure(figsize=size)
    draw(figure)
    return save_figure(figure, path)


def tau_label(tau: float) -> str:
    """The shortest text that reads back as ``tau`` ("2", "0.5", "2.3575053928861727")."""
    return format_temperature(tau).removesuffix(".0")


def score_tensors(report) -> tuple[dict[str, Any], dict[str, str]]:
    """Every per-sample score of an ``OodReport`` as a float64 tensor, and metadata naming the files."""
    import numpy as np
    import torch

    sides = [("id", report.id_scores), *((f"ood.{i}", scores) for i, scores in enumerate(report.ood_scores))]
    tensors: dict[str, Any] = {  # named id.msp.tau=2 or ood.0.msp.tau=2 (0: the first OOD file)
        f"{side}.{name}.tau={tau_label(tau)}": torch.from_numpy(np.ascontiguousarray(scores[name][k]))
        for name in report.scores for k, tau in enumerate(report.taus) for side, scores in sides}
    metadata = {"tempcal.source": report.source, "tempcal.taus": ",".join(tau_label(t) for t in report.taus),
                "tempcal.scores": ",".join(report.scores), "tempcal.convention": "higher = more in-distribution"}
    metadata.update({f"tempcal.ood.{i}": path for i, path in enumerate(report.ood_files)})
    if report.stored_temperature is not None:
        metadata["tempcal.calibration_temperature"] = tau_label(report.stored_temperature)
    if "gen" in report.scores:
        metadata.update({f"tempcal.{key}": repr(value) for key, value in report.score_options.items()})
    if report.react is not None:
        metadata.update({"tempcal.react_percentile": repr(report.react.percentile),
                         "tempcal.react_threshold": repr(report.react.threshold)})
    return tensors, metadata


def save_scores(report, path: str | os.PathLike) -> Path:
    """``ood --scores PATH``: every per-sample score as a safetensors file, one tensor per tau and side, atomically."""
    from safetensors.torch import save_file

    from ..io.paths import atomic_path

    tensors, metadata = score_tensors(report)
    with atomic_path(path, what=param("scores")) as temporary:
        save_file(tensors, str(temporary), metadata=metadata)
    return Path(path)

__all__ = ["EXTRA_OUTPUTS", "STEP_SUMMARY_ENV", "append_step_summary", "check_extra", "emit_json", "register",
           "step_summary_path", "write_extras", "write_files"]
