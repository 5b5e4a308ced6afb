"""What ``--lm MODEL`` changes in a command: SOURCE is the ``--text`` file, the outputs are in MODEL's folder, and
nothing is written before the command's work has succeeded. Nothing here imports torch or transformers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import TempcalError
from ..io.hf_folder import check_model_folder
from ..io.paths import same_file
from .record import GENERATION_NAME, RECORD_NAME, sampling_note


def lm_source(ctx: Any, request: Any) -> list[str]:
    """The SOURCE of a command run with ``--lm``: ``[text]``, after refusing contradictory writes."""
    lm, text, outputs, source = request.reading.lm, request.texts.text, request.outputs, request.source
    assert lm is not None
    check_lm_writes(outputs)
    if source and getattr(ctx.get_parameter_source("source"), "name", "COMMANDLINE") not in ("DEFAULT_MAP", "DEFAULT"):
        raise TempcalError(f"--lm runs MODEL over --text FILE: give no SOURCE (got {' '.join(source)})")
    check_model_folder(Path(lm), "--lm")  # before the record beside it is checked
    if text is None:
        raise TempcalError("--lm MODEL needs --text FILE: the texts to run it over (.txt, one text per line, or "
                           ".jsonl)")
    return [text]


def lm_outputs(request: Any, *, record: bool = False) -> dict[str, str | None]:
    """The files an ``--lm`` command writes, to check before any work: ``--save-hidden``, the record of T when
    ``record`` (``MODEL/tempcal.json``, or ``--output``), ``generation_config.json`` when asked."""
    lm, outputs = request.reading.lm, request.outputs
    out: dict[str, str | None] = {"--save-hidden": outputs.save_hidden}
    if record:
        named = "--output" if outputs.output is not None else "the record of T"
        out[named] = outputs.output or str(Path(lm) / RECORD_NAME)
    if outputs.write_generation_config:
        out["--write-generation-config"] = str(Path(lm) / GENERATION_NAME)
    return out


#: The outputs that may go into ``--lm MODEL``'s folder, and the one file of it each may be.
_RECORDS = {"the record of T": RECORD_NAME, "--output": RECORD_NAME, "--write-generation-config": GENERATION_NAME}


def record_outputs(given: list[tuple[str, str]], folders: list[tuple[str, str]]) -> list[str]:
    """Of the outputs ``given`` (flag, path), those that are the record tempcal keeps in an ``--lm`` folder of
    ``folders`` (option, folder): ``tempcal.json``, ``generation_config.json``."""
    return [flag for flag, path in given for option, folder in folders
            if option == "--lm" and flag in _RECORDS and same_file(path, os.path.join(folder, _RECORDS[flag]))]


def check_lm_writes(outputs: Any) -> None:
    """Refuse contradictory writes (of a request's ``Outputs``) before any work."""
    write_generation_config, output = outputs.write_generation_config, outputs.output
    if write_generation_config and outputs.no_write:
        raise TempcalError("--write-generation-config and --no-write contradict each other")
    if write_generation_config and output is not None:
        raise TempcalError("--write-generation-config writes into MODEL's folder; --output moves the record of T "
                           "elsewhere: give one or the other")
    if outputs.save_hidden is not None and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise TempcalError("--save-hidden under torchrun: each process holds only its share of the rows; run it "
                           "in one process")


def sampling_notes(request: Any) -> list[str]:
    """A warning when the temperature written into ``generation_config.json`` will not be used (greedy decoding)."""
    if not request.outputs.write_generation_config:
        return []
    note = sampling_note(request.reading.lm)
    return [note] if note else []


def ood_texts(ood_files: list[str] | None, ood_text: list[str] | None) -> list[str]:
    """The OOD texts of an --lm run (--ood takes logits files, which --lm does not read)."""
    if ood_files:
        raise TempcalError("--ood takes logits files; with --lm give out-of-distribution texts with --ood-text FILE")
    if not ood_text:
        raise TempcalError("missing option '--ood-text FILE': --lm needs out-of-distribution texts")
    return list(ood_text)


def lm_settings(**settings: Any) -> dict[str, Any]:
    """The command's settings as ``tempcal.json`` records them (enums by their value)."""
    return {key: getattr(value, "value", value) for key, value in settings.items()}


__all__ = ["lm_outputs", "lm_settings", "lm_source", "ood_texts", "record_outputs", "sampling_notes"]
