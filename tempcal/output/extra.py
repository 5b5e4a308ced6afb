"""Outputs a capability package adds beside a command's JSON (``--html``): each registers its flag, the check run
before any work (the path, its optional dependencies) and the writer run after the JSON is out.

The commands name no such output: :func:`check_extra` is called for every output path they were given and
:func:`write_extras` once, with the command's result model and its JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ExtraOutput:
    """One output of a capability package: its flag, its check (raises :class:`~tempcal.errors.TempcalError`) and
    its writer ``(path, command, result, data, argv) -> the line saying what was written``."""

    flag: str
    check: Callable[[str], object]
    write: Callable[[str, str, Any, dict, Sequence[str]], str]


#: The registered outputs by flag.
EXTRA_OUTPUTS: dict[str, ExtraOutput] = {}


def register(output: ExtraOutput) -> ExtraOutput:
    """Add ``output`` to the registry (a package does this when it is imported); returns it."""
    EXTRA_OUTPUTS[output.flag] = output
    return output


def check_extra(flag: str, path: str) -> None:
    """Run the registered check of ``flag`` on ``path`` (nothing for an output no package registered)."""
    if flag in EXTRA_OUTPUTS:
        EXTRA_OUTPUTS[flag].check(path)


def write_extras(paths: Mapping[str, str | None], command: str, result: Any, data: dict,
                 argv: Sequence[str]) -> list[str]:
    """Write every registered output given a path in ``paths``; the lines saying what was written."""
    return [EXTRA_OUTPUTS[flag].write(path, command, result, data, argv) for flag, path in paths.items()
            if path is not None and flag in EXTRA_OUTPUTS]


__all__ = ["EXTRA_OUTPUTS", "ExtraOutput", "check_extra", "register", "write_extras"]
