"""TorchScript models (legacy; torch has deprecated TorchScript): loaded with ``torch.jit.load`` only.

A file must be a TorchScript zip archive (``constants.pkl`` and ``code/`` inside, checked without
reading any of it, see :mod:`tempcal.models.detect`) before torch is asked to load it, and
TorchScript's own loader builds no arbitrary Python objects. A calibrated model's T is its
float64 buffer ``tempcal_temperature`` and the archive's extra file ``tempcal.temperature``.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from ..core.data import resolve_device
from ..errors import TempcalError
from ..validation import TEMPERATURE_KEY, format_temperature, stored_temperature
from .base import ORIGINAL, TEMPERATURE_BUFFER, LoadedModel, error_line
from .detect import HOW_TO_SAVE, archive_kind

#: Name of the extra file (in the TorchScript archive) that holds a calibrated model's T.
TEMPERATURE_FILE = TEMPERATURE_KEY


@contextlib.contextmanager
def quiet_jit() -> Iterator[None]:
    """Silence torch's "torch.jit.* is deprecated" warnings: the CLI contract reads TorchScript, on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
        yield


def load(path: str | os.PathLike, device: str | torch.device = "auto") -> LoadedModel:
    """A TorchScript model in eval mode on ``device``, its original and the T it carries (if calibrated)."""
    path = Path(path)
    target = resolve_device(device)
    kind = archive_kind(path)
    if kind != "torchscript":
        why = {
            "missing": "no such file",
            "not a file": "not a regular file",
            "pickle": f"not a TorchScript model (a pickle file, which tempcal never unpickles; {HOW_TO_SAVE})",
            "torch.save zip": f"not a TorchScript model (a torch.save archive: tensors or a pickled module, which "
                              f"tempcal never unpickles; {HOW_TO_SAVE})",
        }.get(kind, f"not a TorchScript model (no TorchScript archive inside; {HOW_TO_SAVE})")
        raise TempcalError(f"{path}: {why}")
    extra = {TEMPERATURE_FILE: ""}
    try:
        with quiet_jit():
            model = torch.jit.load(str(path), map_location=target, _extra_files=extra)
    except Exception as exc:  # a damaged or hostile archive: one line, whatever torch makes of it
        raise TempcalError(f"{path}: not a loadable TorchScript model ({error_line(exc, last=False)})") from None
    model.eval()
    buffered = buffer_temperature(model, str(path))
    text = extra[TEMPERATURE_FILE]
    saved = stored_temperature(text, f"{path}: extra file") if text else None
    if saved != buffered:
        raise TempcalError(f"{path}: extra file '{TEMPERATURE_FILE}' says T = {saved!r} but the model divides by "
                           f"{buffered!r}; the file was altered, save the calibrated model again")
    original = getattr(model, ORIGINAL) if buffered is not None else model
    return LoadedModel(path, "torchscript", original, saved, target)


def buffer_temperature(model: torch.nn.Module, name: str) -> float | None:
    """The T a calibrated model divides by (its ``tempcal_temperature`` buffer), None for any other model."""
    if not (hasattr(model, TEMPERATURE_BUFFER) and hasattr(model, ORIGINAL)):
        return None
    buffer = getattr(model, TEMPERATURE_BUFFER)
    if not isinstance(buffer, torch.Tensor) or buffer.numel() != 1:
        return None
    return stored_temperature(repr(float(buffer)), f"{name}: buffer")


def script_and_save(wrapper: torch.nn.Module, temperature: float, name: str) -> bytes:
    """The TorchScript archive of a calibrated wrapper, T in its extra file."""
    try:
        with quiet_jit():
            scripted = torch.jit.script(wrapper)
    except Exception as exc:
        raise TempcalError(f"cannot wrap {name}: {error_line(exc)}") from None
    buffer = io.BytesIO()
    with quiet_jit():
        torch.jit.save(scripted, buffer, _extra_files={TEMPERATURE_FILE: format_temperature(temperature)})
    return buffer.getvalue()


def load_bytes(blob: bytes) -> torch.nn.Module:
    """A TorchScript archive held in memory (one tempcal just wrote), on the CPU in eval mode."""
    with quiet_jit():
        return torch.jit.load(io.BytesIO(blob), map_location="cpu").eval()


def forward_schema(model: torch.nn.Module):
    """The TorchScript signature of ``forward`` (None when it cannot be read)."""
    try:
        return model._c._get_method("forward").schema  # type: ignore[union-attr,operator]
    except (AttributeError, RuntimeError):
        return None


def strip_debug_info(blob: bytes) -> bytes:
    """A saved TorchScript archive without its ``.debug_pkl`` records (they hold source file paths).

    The model runs the same; error tracebacks show the serialized code only. Used for files that must be
    reproducible byte for byte wherever they are rebuilt, like the shipped example model.
    """
    reader = torch._C.PyTorchFileReader(io.BytesIO(blob))
    out = io.BytesIO()
    writer = torch._C.PyTorchFileWriter(out)
    for record in reader.get_all_records():
        if record.endswith(".debug_pkl") or record == ".data/serialization_id":
            continue  # the writer adds its own serialization id
        data = reader.get_record(record)
        writer.write_record(record, data, len(data))
    writer.write_end_of_file()
    return out.getvalue()


__all__ = ["TEMPERATURE_FILE", "buffer_temperature", "forward_schema", "load", "load_bytes", "quiet_jit",
           "script_and_save", "strip_debug_info"]
