"""Which model format a file holds, read from its first bytes and zip directory only (nothing is unpickled)."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

#: Suffixes of TorchScript model files (``.pt`` / ``.pth`` may also be dicts of tensors: logits files).
MODEL_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript")
#: How to save a model so that tempcal can read it (shown in errors).
HOW_TO_SAVE = "save it with torch.jit.save(torch.jit.script(model), PATH)"


def archive_kind(path: str | os.PathLike) -> str:
    """What ``path`` holds: ``torchscript``, ``torch.save zip``, ``zip``, ``pickle``, ``missing``, ``not a file``
    or ``other``. A TorchScript archive holds ``constants.pkl`` and ``code/`` (the test torch.load itself uses)."""
    path = Path(path)
    try:
        if not path.exists():
            return "missing"
        if not path.is_file():
            return "not a file"
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError:
        return "missing"
    if magic[:2] == b"PK":
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (OSError, zipfile.BadZipFile, ValueError):
            return "other"
        parts = [name.split("/") for name in names]
        if any(p[-1] == "constants.pkl" for p in parts) and any("code" in p[:-1] for p in parts):
            return "torchscript"
        return "torch.save zip" if any(p[-1] == "data.pkl" for p in parts) else "zip"
    if magic[:1] == b"\x80":
        return "pickle"
    return "other"


def is_model_path(path: str | os.PathLike) -> bool:
    """True for a ``.pt``/``.pth``/``.ts``/``.torchscript`` file that is a TorchScript archive.

    A ``.pt`` dict of tensors saved by ``torch.save`` is not a model. Nothing in the file is unpickled.
    """
    return Path(path).suffix.lower() in MODEL_SUFFIXES and archive_kind(path) == "torchscript"


def looks_like_model(path: str | os.PathLike, with_inputs: bool) -> bool:
    """Whether a SOURCE is a model: a model suffix, and inputs given or a TorchScript archive (or no file yet,
    so that the model loader says what is missing)."""
    if Path(path).suffix.lower() not in MODEL_SUFFIXES:
        return False
    return with_inputs or archive_kind(path) in ("torchscript", "missing")


__all__ = ["HOW_TO_SAVE", "MODEL_SUFFIXES", "archive_kind", "is_model_path", "looks_like_model"]
