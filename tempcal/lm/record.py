"""Where a language model's T goes: ``MODEL/tempcal.json`` (T, what it was fitted on and how), and on request
``generation_config.json``'s temperature (every other key kept); both written atomically, never through a link.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import TempcalError, as_temperature, temperature_number
from ..io.hf_folder import read_json
from ..io.paths import write_text_atomic

RECORD_NAME = "tempcal.json"
GENERATION_NAME = "generation_config.json"
#: The layout of ``tempcal.json``; a later tempcal reads this one.
RECORD_FORMAT = 1
#: The largest record or generation configuration read (both are a few kB).
MAX_RECORD_BYTES = 1 << 20


def record_path(folder: str | os.PathLike) -> Path:
    return Path(folder) / RECORD_NAME


def read_record(folder: str | os.PathLike) -> float | None:
    """The T in ``folder/tempcal.json`` (None when there is none); a record that is not tempcal's is an error."""
    folder = Path(folder)
    path = record_path(folder)
    if not path.exists() and not path.is_symlink():
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


def sampling_note(folder: str | os.PathLike) -> str | None:
    """A warning when ``generation_config.json`` does not sample (then generate() ignores its temperature)."""
    config = _generation_config(Path(folder))
    if config is not None and config.get("do_sample") is True:
        return None
    shown = "has no generation_config.json" if config is None else "generation_config.json has do_sample " + (
        json.dumps(config.get("do_sample")) if "do_sample" in config else "unset")
    return (f"{folder}: {shown}: generate() decodes greedily and ignores the temperature unless called with "
            "do_sample=True")


def _generation_config(folder: Path) -> dict[str, Any] | None:
    """The folder's ``generation_config.json`` (None when it has none), which must be a JSON object."""
    path = folder / GENERATION_NAME
    if not path.exists() and not path.is_symlink():
        return None
    config = read_json(folder, GENERATION_NAME, MAX_RECORD_BYTES)
    if not isinstance(config, dict):
        raise TempcalError(f"{path}: not a JSON object")
    return config


__all__ = ["GENERATION_NAME", "RECORD_NAME", "read_record", "record_path", "sampling_note",
           "set_generation_temperature", "write_record"]
