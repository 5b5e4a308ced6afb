"""Optional extras imported on demand: a missing one is a one-line error naming the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from tempcal.errors import TempcalError


def require(module: str, extra: str, *, needed_for: str) -> ModuleType:
    """Import ``module``, or raise the exit-2 error ``NEEDED_FOR needs MODULE ...: pip install 'tempcal[EXTRA]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        raise TempcalError(
            f"{needed_for} needs {top}, which is not installed: pip install 'tempcal[{extra}]'"
        ) from exc


def pyarrow_parquet(needed_for: str) -> ModuleType:
    """``pyarrow.parquet`` for reading ``.parquet`` files (the ``logs`` extra)."""
    return require("pyarrow.parquet", "logs", needed_for=needed_for)


def zstandard(needed_for: str) -> ModuleType:
    """``zstandard`` for zstd-compressed members of inspect_ai ``.eval`` logs (the ``logs`` extra)."""
    return require("zstandard", "logs", needed_for=needed_for)
