"""Outputs a capability package adds beside a command's JSON (``--html``), registered by flag: a check run before
any work (the path, the package's optional dependencies) and a writer run after the JSON is out. The commands name
no such output: ``cli/main`` calls :func:`check_extra` for every output path and :func:`write_extras` once."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

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


__all__ = ["EXTRA_OUTPUTS", "check_extra", "register", "write_extras"]
