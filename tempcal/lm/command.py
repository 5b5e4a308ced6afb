"""What ``--lm MODEL`` changes in a command: SOURCE is the ``--text`` file; the outputs (T in ``tempcal.json``, and on
request in ``generation_config.json``) go into MODEL's folder once the work has succeeded. No torch imported here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import TempcalError, as_temperature, temperature_number
from ..io.hf_folder import check_model_folder, read_json
from ..io.paths import same_file, write_text_atomic

RECORD_NAME = "tempcal.json"
GENERATION_NAME = "generation_config.json"
#: The layout of ``tempcal.json``; a later tempcal reads this one.
RECORD_FORMAT = 1
#: The largest record or generation configuration read (both are a few kB).
MAX_RECORD_BYTES = 1 << 20


def read_record(folder: str | os.PathLike) -> float | None:
    """The T in ``folder/tempcal.json`` (None when there is none); a record that is not tempcal's is an error."""
    folder = Path(folder)
    path = folder / RECORD_NAME
    if not os.path.lexists(path):
        return None
    record = read_json(folder, RECORD_NAME, MAX_RECORD_BYTES)
    value = record.get("temperature") if isinstance(record, dict) else None
    number = None if isinstance(value, bool) or not isinstance(value, (int, float)) else temperature_number(value)
    if number is None:
        raise TempcalError(f"{path}: not a tempcal record (expected a 'temperature' > 0 whose inverse is finite); "
                           "fix or delete it")
    return number


def write_record(path: str | os.PathLike, temperature: float, record: dict[str, Any]) -> Path:
    """Write ``tempcal.json`` (at ``path``): T first, then ``record``'s sections, then the tempcal version."""
    out = {"temperature": as_temperature(temperature), **record,
           "tempcal": {"version": __version__, "record_format": RECORD_FORMAT}}
    return write_text_atomic(path, json.dumps(out, indent=2) + "\n", what="")


def set_generation_temperature(folder: str | os.PathLike, temperature: float,
                               derived: Callable[[], dict[str, Any]]) -> Path:
    """Set ``temperature`` in ``folder/generation_config.json`` (every other key kept, in order), atomically;
    ``derived()`` gives the configuration of a folder that has none. Returns the path written."""
    folder = Path(folder)
    config = _generation_config(folder)
    config = dict(derived()) if config is None else config
    config["temperature"] = as_temperature(temperature)
    return write_text_atomic(folder / GENERATION_NAME, json.dumps(config, indent=2) + "\n", what="")


def _generation_config(folder: Path) -> dict[str, Any] | None:
    """The folder's ``generation_config.json`` (None when it has none), which must be a JSON object."""
    path = folder / GENERATION_NAME
    if not os.path.lexists(path):
        return None
    config = read_json(folder, GENERATION_NAME, MAX_RECORD_BYTES)
    if not isinstance(config, dict):
        raise TempcalError(f"{path}: not a JSON object")
    return config


def lm_source(ctx: Any, request: Any) -> list[str]:
    """The SOURCE of a command run with ``--lm``: ``[text]``, after refusing contradictory writes."""
    lm, text, outputs, source = request.reading.lm, request.texts.text, request.outputs, request.source
    assert lm is not None
    if outputs.write_generation_config and outputs.no_write:
        raise TempcalError("--write-generation-config and --no-write contradict each other")
    if outputs.write_generation_config and outputs.output is not None:
        raise TempcalError("--write-generation-config writes into MODEL's folder; --output moves the record of T "
                           "elsewhere: give one or the other")
    if outputs.save_hidden is not None and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise TempcalError("--save-hidden under torchrun: each process holds only its share of the rows; run it "
                           "in one process")
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


def sampling_notes(request: Any) -> list[str]:
    """A warning when the temperature written into ``generation_config.json`` will not be used: it does not sample
    (then generate() decodes greedily)."""
    folder = request.reading.lm
    if not request.outputs.write_generation_config:
        return []
    config = _generation_config(Path(folder))
    if config is not None and config.get("do_sample") is True:
        return []
    shown = "has no generation_config.json" if config is None else "generation_config.json has do_sample " + (
        json.dumps(config.get("do_sample")) if "do_sample" in config else "unset")
    return [f"{folder}: {shown}: generate() decodes greedily and ignores the temperature unless called with "
            "do_sample=True"]


def ood_texts(ood_files: list[str] | None, ood_text: list[str] | None) -> list[str]:
    """The OOD texts of an --lm run (--ood takes logits files, which --lm does not read)."""
    if ood_files:
        raise TempcalError("--ood takes logits files; with --lm give out-of-distribution texts with --ood-text FILE")
    if not ood_text:
        raise TempcalError("missing option '--ood-text FILE': --lm needs out-of-distribution texts")
    return list(ood_text)


__all__ = ["GENERATION_NAME", "RECORD_NAME", "lm_outputs", "lm_source", "ood_texts", "read_record",
           "record_outputs", "sampling_notes", "set_generation_temperature", "write_record"]
