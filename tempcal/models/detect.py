"""Which model format a file holds, from its suffix, first bytes and zip directory only (nothing unpickled, no torch
imported): ``.onnx`` by suffix; ``.pt``/``.pth`` models only when their zip says so or ``--inputs`` is given.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from ..errors import TempcalError, param

#: Suffixes of TorchScript model files (``.pt`` / ``.pth`` may also be dicts of tensors: logits files).
TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript")
EXPORT_SUFFIX, ONNX_SUFFIX = ".pt2", ".onnx"
#: Every suffix a model SOURCE may have.
MODEL_SUFFIXES = (EXPORT_SUFFIX, ONNX_SUFFIX, *TORCHSCRIPT_SUFFIXES)
#: How messages name each format; each is also the name of the ``tempcal.models`` module that loads it
#: (``load(path, device) -> LoadedModel``) and writes it calibrated (``save_calibrated``).
FORMAT_NAMES = {"export": "an exported program (.pt2)", "onnx": "an ONNX model", "torchscript": "a TorchScript model"}
#: How to save a model so that tempcal can read it (shown in errors).
HOW_TO_SAVE = "save it with torch.jit.save(torch.jit.script(model), PATH)"
#: Members that mark a torch.export archive (current format; and the legacy one, which the loader refuses).
_EXPORT_MEMBERS = ("archive_format", "serialized_exported_program.json")


def archive_kind(path: str | os.PathLike) -> str:
    """What ``path`` holds: ``torchscript`` (``constants.pkl`` and ``code/``, torch.load's own test), ``export``,
    ``torch.save zip``, ``zip``, ``pickle``, ``missing``, ``not a file`` or ``other``."""
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
        except (OSError, zipfile.BadZipFile, ValueError, NotImplementedError, EOFError):
            return "other"
        parts = [name.split("/") for name in names]
        if any(p[-1] == "constants.pkl" for p in parts) and any("code" in p[:-1] for p in parts):
            return "torchscript"
        if any(p[-1] in _EXPORT_MEMBERS and len(p) <= 2 for p in parts):
            return "export"
        return "torch.save zip" if any(p[-1] == "data.pkl" for p in parts) else "zip"
    if magic[:1] == b"\x80":
        return "pickle"
    return "other"


def model_format(path: str | os.PathLike) -> str:
    """The format of a model file: ``onnx`` by suffix; a torch archive by its zip directory, else by suffix (so that
    the format's loader says what is wrong with the file): ``.pt2`` ``export``, others ``torchscript``."""
    suffix = Path(path).suffix.lower()
    if suffix == ONNX_SUFFIX:
        return "onnx"
    kind = archive_kind(path)
    if kind in ("torchscript", "export"):
        return kind
    return "export" if suffix == EXPORT_SUFFIX else "torchscript"


def is_model_path(path: str | os.PathLike) -> bool:
    """True for a model file: a torch-suffixed TorchScript or exported-program archive (never a ``torch.save``
    dict of tensors; nothing unpickled), or an existing ``.onnx`` file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in MODEL_SUFFIXES:
        return False
    if suffix == ONNX_SUFFIX:
        return path.is_file()
    return archive_kind(path) in ("torchscript", "export")


def looks_like_model(path: str | os.PathLike, with_inputs: bool) -> bool:
    """Whether a SOURCE is a model: ``.pt2`` and ``.onnx`` always; a TorchScript suffix with inputs given, or
    holding a model archive (or no file yet, so that the model loader says what is missing)."""
    suffix = Path(path).suffix.lower()
    if suffix in (EXPORT_SUFFIX, ONNX_SUFFIX):
        return True
    if suffix not in TORCHSCRIPT_SUFFIXES:
        return False
    return with_inputs or archive_kind(path) in ("torchscript", "export", "missing")


#: Which SOURCE formats ``--save-model`` writes each format from (the README's table).
WRITES = {"export": ("export", "torchscript"), "onnx": ("onnx",), "torchscript": ("torchscript",)}
_WRITTEN_FROM = {"export": "a .pt2 or TorchScript SOURCE", "onnx": "an ONNX SOURCE",
                 "torchscript": "a TorchScript SOURCE"}
_CAN_WRITE = {"export": ".pt2", "onnx": ".onnx",
              "torchscript": f".pt2 (the migration path) or a TorchScript suffix ({', '.join(TORCHSCRIPT_SUFFIXES)})"}


def save_format(source: str | os.PathLike, out_path: str | os.PathLike) -> str:
    """The format ``--save-model out_path`` writes for a model SOURCE, by the suffix of ``out_path``; a suffix
    that cannot be written from SOURCE's format is a usage error naming what can be."""
    suffix = Path(out_path).suffix.lower()
    wanted = {EXPORT_SUFFIX: "export", ONNX_SUFFIX: "onnx", **dict.fromkeys(TORCHSCRIPT_SUFFIXES, "torchscript")
              }.get(suffix)
    have = model_format(source)
    if wanted is not None and have in WRITES[wanted]:
        return wanted
    if wanted is None:
        why = f"{f'suffix {suffix!r}' if suffix else 'no suffix'}: not a model format tempcal writes"
    else:
        why = f"{FORMAT_NAMES[wanted]} is written from {_WRITTEN_FROM[wanted]} only"
    raise TempcalError(f"{param('save_model')} {out_path}: {why}; {source} is {FORMAT_NAMES[have]}, from which "
                       f"tempcal writes {_CAN_WRITE[have]}")


__all__ = ["HOW_TO_SAVE", "MODEL_SUFFIXES", "archive_kind", "is_model_path", "looks_like_model", "model_format",
           "save_format"]
