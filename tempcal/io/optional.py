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
        raise TempcalError(f"{needed_for} needs {module.split('.')[0]}, which is not installed: "
                           f"pip install 'tempcal[{extra}]'") from exc

