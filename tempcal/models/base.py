"""What every model format gives the rest of tempcal: a loaded model that maps an inputs batch to outputs.

A calibrated model saved by tempcal wraps the original and divides the selected logits by T;
loading one gives back the original (``net``) and T (``temperature``), so ``--tau`` means what
it means for a logits file holding T in its metadata: the default (the stored T) reproduces the
calibrated outputs, ``--tau 1`` the original's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: An output key: a dict key, or a tuple index (an int, or a string of digits as the CLI passes it).
OutputKey = str | int | None
#: Name of the buffer that holds a calibrated model's T, and of the submodule holding the original.
TEMPERATURE_BUFFER = "tempcal_temperature"
ORIGINAL = "original"
DEFAULT_BATCH_SIZE = 512


@dataclass
class LoadedModel:
    """A model ready to run: ``net(x)`` gives the original's outputs; ``temperature`` is a calibrated model's T."""

    path: Path
    format: str  # "torchscript", ...
    net: Any  # a torch module in eval mode (autograd works through it, for ODIN)
    temperature: float | None
    device: Any

    @property
    def name(self) -> str:
        return str(self.path)


def error_line(exc: BaseException, *, last: bool = True) -> str:
    """One line of an error: the last (TorchScript's error, after its traceback) or the first (a loader's reason)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = (lines[-1] if last else lines[0]) if lines else type(exc).__name__
    text = text.removeprefix("builtins.")
    return text if len(text) <= 300 else text[:297] + "..."


__all__ = ["DEFAULT_BATCH_SIZE", "ORIGINAL", "TEMPERATURE_BUFFER", "LoadedModel", "OutputKey", "error_line"]
