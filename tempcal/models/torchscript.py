"""TorchScript models (legacy; torch has deprecated TorchScript): loaded by torch's TorchScript importer only.

The file is checked first (:mod:`tempcal.models.torchscript_check`). A calibrated model's T is its float64
buffer ``tempcal_temperature`` and the extra file ``tempcal.temperature`` (read as text, never unpickled).
:func:`to_graph_module` is the migration path to a ``.pt2`` exported program.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..core.data import resolve_device
from ..errors import TempcalError
from ..validation import TEMPERATURE_KEY, format_temperature, stored_temperature
from .base import ORIGINAL, TEMPERATURE_BUFFER, LoadedModel, error_line, quiet
from .detect import HOW_TO_SAVE, archive_kind
from .torchscript_check import load_checked

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
    with quiet_jit():
        model = load_checked(path, target, extra, str(path))
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


def load_bytes(blob: bytes, label: str = "the calibrated model") -> torch.nn.Module:
    """A TorchScript archive held in memory (one tempcal just wrote), checked as a file is, on the CPU in eval mode."""
    with quiet_jit():
        return load_checked(blob, torch.device("cpu"), {}, label).eval()


def forward_schema(model: torch.nn.Module):
    """The TorchScript signature of ``forward`` (None when it cannot be read)."""
    try:
        return model._c._get_method("forward").schema  # type: ignore[union-attr,operator]
    except (AttributeError, RuntimeError):
        return None


def strip_debug_info(blob: bytes) -> bytes:
    """A saved TorchScript archive without its ``.debug_pkl`` records (source file paths): reproducible bytes
    for the shipped example model; the model runs the same."""
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


# -- the migration path: TorchScript to an exported program ---------------------------------------
def to_graph_module(module: torch.jit.ScriptModule, example: tuple[torch.Tensor, ...],
                    label: str) -> torch.fx.GraphModule:
    """``module`` as a flat graph module (to export with a dynamic batch), by torch's TorchScript converter.

    Size assertions are dropped first (the converter turns them into ``torch.cond``, fixing the batch size), and
    outputs keep the model's structure. What the converter cannot convert is a one-line error.
    """
    advice = "export the original nn.Module with torch.export and calibrate that"
    try:
        from torch._export.converter import TS2EPConverter
    except ImportError:
        raise TempcalError(f"this torch cannot convert TorchScript to an exported program; {advice}") from None
    module.eval()
    try:
        with quiet(), quiet_jit():
            converter = TS2EPConverter(module, example)
            _drop_assertions(converter.ts_graph.block())
            torch._C._jit_pass_dce(converter.ts_graph)
            graph = converter.convert().module()
            with torch.no_grad():
                wanted = torch.utils._pytree.tree_structure(module(*example))
                got = torch.utils._pytree.tree_structure(graph(*example))
    except Exception as exc:
        line = re.sub(r"\s*at \"?/\S+\"?:\d+", "", error_line(exc, last=False))  # no internal source locations
        raise TempcalError(f"cannot convert {label} from TorchScript to an exported program ({line}); "
                           f"{advice}") from None
    if wanted != got and wanted.num_leaves == got.num_leaves:
        _set_output_structure(graph, wanted)
    return graph


def _drop_assertions(block: Any) -> None:
    """Remove ``prim::If`` nodes that only raise (TorchScript ``assert`` and size checks), recursively."""
    for node in list(block.nodes()):
        for inner in node.blocks():
            _drop_assertions(inner)
        if node.kind() == "prim::If" and node.outputsSize() == 0:
            first, second = (list(b.nodes()) for b in node.blocks())
            raises = [bool(nodes) and nodes[-1].kind() == "prim::RaiseException" for nodes in (first, second)]
            if (raises[0] and not second) or (raises[1] and not first):
                node.destroy()


def _set_output_structure(graph: torch.fx.GraphModule, spec: Any) -> None:
    """Make ``graph`` return its flat outputs in the pytree structure ``spec`` (e.g. a tuple, not a list)."""
    codegen = graph.graph._codegen
    info = getattr(codegen, "pytree_info", None)
    if info is not None:
        codegen.pytree_info = info._replace(out_spec=spec)  # type: ignore[attr-defined]
        graph.recompile()


__all__ = ["TEMPERATURE_FILE", "buffer_temperature", "forward_schema", "load", "load_bytes", "quiet_jit",
           "script_and_save", "strip_debug_info", "to_graph_module"]
