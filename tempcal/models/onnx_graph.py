"""An ONNX model read without running it: checked (docs/models.md, "What is checked before a model runs") and
edited: tempcal's ``Div`` by T (node ``tempcal_divide_by_temperature``; T also in ``metadata_props``, the two agreeing).
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import TEMPERATURE_KEY, TempcalError, format_temperature, stored_temperature
from ..io.sidecar import check_regular_file
from .base import TEMPERATURE_BUFFER, error_line

if TYPE_CHECKING:
    import onnx

INSTALL_HINT = "pip install 'tempcal[onnx]'"
#: Operator domains of the standard ONNX operator sets, the only ones a model may use.
DEFAULT_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})
#: Name (prefix) of the node tempcal appends; it marks a calibrated model's division.
DIV_NODE = "tempcal_divide_by_temperature"
UNCALIBRATED_SUFFIX = "_uncalibrated"


@dataclass(frozen=True)
class OnnxInfo:
    """A parsed, checked model (external data not loaded) and what tempcal needs to know about it."""

    path: Path
    folder: Path  # real path of the model's folder, where external data must lie
    model: onnx.ModelProto
    inputs: tuple[str, ...]
    temperature: float | None
    external: tuple[tuple[str, str], ...]  # (tensor name, location) of every tensor with external data


def import_onnx(package: str = "onnx") -> Any:
    """``package`` (``onnx`` or ``onnxruntime``), or a one-line error naming the extra to install."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise TempcalError(f"ONNX models need the optional extra: {INSTALL_HINT} (the '{package}' package is not "
                           "installed)") from None


# -- inspecting -----------------------------------------------------------------------------------
def inspect_onnx(path: str | os.PathLike) -> OnnxInfo:
    """Parse ``path`` without external data and check it (external files with ``stat`` only, never opened)."""
    onnx = import_onnx()
    path = Path(path)
    check_regular_file(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends: one line
        raise TempcalError(f"{path}: not a loadable ONNX model ({error_line(exc, last=False)})") from None
    try:
        _decode_strings(model)
    except UnicodeError as exc:
        raise TempcalError(f"{path}: damaged ONNX model (a name is not valid UTF-8: "
                           f"{error_line(exc, last=False)})") from None
    graph = model.graph
    if not graph.output or not graph.node:
        raise TempcalError(f"{path}: not a usable ONNX model (no graph nodes or outputs; damaged or truncated?)")
    _check_domains(model, path)
    folder = Path(os.path.realpath(path.parent))
    external = []
    for name, tensor in all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            external.append((name, _check_external(tensor, name, folder, path)))
        else:
            _check_inline_size(tensor, name, path)
    initializers = {t.name for t in graph.initializer}
    inputs = tuple(i.name for i in graph.input if i.name not in initializers)
    temperature = None
    for prop in model.metadata_props:
        if prop.key == TEMPERATURE_KEY:
            temperature = stored_temperature(prop.value, f"{path}: metadata")
    _check_stored_division(model, temperature, path)
    return OnnxInfo(path, folder, model, inputs, temperature, tuple(external))


def _decode_strings(message: Any) -> None:
    """Check every string field of a parsed message is valid UTF-8: damaged names fail here, not in later edits."""
    for descriptor, value in message.ListFields():
        repeated = getattr(descriptor, "is_repeated", None)  # protobuf >= 5.28; `label` before
        if repeated is None:
            repeated = descriptor.label == descriptor.LABEL_REPEATED
        if descriptor.type == descriptor.TYPE_MESSAGE:
            for item in value if repeated else (value,):
                _decode_strings(item)
        elif descriptor.type == descriptor.TYPE_STRING:
            for text in value if repeated else (value,):
                # damaged bytes come back as bytes, or as a str with lone surrogates (which do not encode)
                if not isinstance(text, str):
                    raise UnicodeError(f"{bytes(text)[:40]!r}")
                text.encode("utf-8")


def _check_stored_division(model: onnx.ModelProto, temperature: float | None, path: Path) -> None:
    """Refuse a model whose metadata T and tempcal division disagree (one without the other, or other values)."""
    onnx = import_onnx()
    initializers = {t.name: t for t in model.graph.initializer}
    divisors = [onnx.numpy_helper.to_array(initializers[node.input[1]]) for node in model.graph.node
                if node.op_type == "Div" and node.name.startswith(DIV_NODE) and node.input[1] in initializers]
    if temperature is None and not divisors:
        return
    if temperature is None or not divisors or not all(
            d.shape == () and d == np.asarray(temperature, dtype=d.dtype) for d in divisors):
        shown = ", ".join(repr(float(d)) if d.size == 1 else "?" for d in divisors) or "nothing"
        raise TempcalError(f"{path}: metadata '{TEMPERATURE_KEY}' says T = {temperature!r} but the model divides by "
                           f"{shown}; the file was altered, save the calibrated model again")


def all_tensors(model: onnx.ModelProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    """Every tensor stored in the model: initializers, sparse initializers, node attributes, subgraphs, functions."""
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from _node_tensors(node)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    for tensor in graph.initializer:
        yield tensor.name, tensor
    for sparse in graph.sparse_initializer:
        yield sparse.values.name, sparse.values
        yield sparse.values.name + " (indices)", sparse.indices
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    for attribute in node.attribute:
        where = f"{node.name or node.op_type}.{attribute.name}"
        if attribute.HasField("t"):
            yield attribute.t.name or where, attribute.t
        for tensor in attribute.tensors:
            yield tensor.name or where, tensor
        if attribute.HasField("sparse_tensor"):
            yield where, attribute.sparse_tensor.values
            yield where + " (indices)", attribute.sparse_tensor.indices
        for sparse in attribute.sparse_tensors:
            yield where, sparse.values
            yield where + " (indices)", sparse.indices
        if attribute.HasField("g"):
            yield from _graph_tensors(attribute.g)
        for graph in attribute.graphs:
            yield from _graph_tensors(graph)


def _check_domains(model: onnx.ModelProto, path: Path) -> None:
    """Refuse a node of a custom operator domain (runtimes run those from libraries), in any graph or function;
    a call of one of the model's own functions is allowed (its nodes are checked in turn)."""
    local = {(f.domain, f.name) for f in model.functions}
    graphs: list[tuple[str, Any]] = [("the graph", model.graph.node)]
    graphs += [(f"function '{f.domain}::{f.name}'", f.node) for f in model.functions]
    while graphs:
        where, nodes = graphs.pop()
        for node in nodes:
            if node.domain not in DEFAULT_DOMAINS and (node.domain, node.op_type) not in local:
                raise TempcalError(f"{path}: node '{node.name or node.op_type}' in {where} runs {node.op_type} of "
                                   f"the custom operator domain {node.domain!r}, which runtimes load from "
                                   "libraries; tempcal runs the standard ONNX operator sets ('', 'ai.onnx', "
                                   "'ai.onnx.ml') only; refused")
            for attribute in node.attribute:
                for graph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    graphs.append((f"a subgraph of node '{node.name or node.op_type}'", graph.node))


def _declared_size(tensor: onnx.TensorProto) -> tuple[int, int] | None:
    """(elements, bytes) a tensor's dims and data type imply (None for strings and unknown types)."""
    onnx = import_onnx()
    if tensor.data_type == onnx.TensorProto.STRING:
        return None
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    elements = int(np.prod([max(int(d), 0) for d in tensor.dims], dtype=object))
    packed = tensor.data_type in _packed_types()
    return elements, -(-elements // 2) if packed else elements * itemsize


def _packed_types() -> frozenset[int]:
    """ONNX data types stored two values a byte (4-bit integers and floats)."""
    proto = import_onnx().TensorProto
    return frozenset(getattr(proto, name) for name in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(proto, name))


def _check_inline_size(tensor: onnx.TensorProto, name: str, path: Path) -> None:
    """Refuse a stored tensor whose dims imply more values than it holds (runtimes allocate by the dims)."""
    declared = _declared_size(tensor)
    if declared is None or declared[0] == 0:
        return
    elements, size = declared
    if tensor.raw_data:
        short = len(tensor.raw_data) < size
        held = f"{len(tensor.raw_data)} bytes"
    else:
        values = len(getattr(tensor, import_onnx().helper.tensor_dtype_to_field(tensor.data_type)))
        short = values * (2 if tensor.data_type in _packed_types() else 1) < elements
        held = f"{values} values"
    if short:
        raise TempcalError(f"{path}: tensor '{name}' declares dims {list(tensor.dims)} ({elements} values, {size} "
                           f"bytes) but holds {held}; damaged or altered")


def _check_external(tensor: onnx.TensorProto, name: str, folder: Path, path: Path) -> str:
    """The tensor's external-data location, refused unless it names a regular file inside ``folder``."""
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location", "")
    where = f"{path}: tensor '{name}' has external data at {location!r}"
    if not location:
        raise TempcalError(f"{where}: no location; refused")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", location):
        raise TempcalError(f"{where}: an absolute path; external data must lie in the model's folder; refused")
    if ".." in re.split(r"[\\/]", location):
        raise TempcalError(f"{where}: it leaves the model's folder; refused")
    resolved = Path(os.path.realpath(folder / location))
    if resolved != folder and folder not in resolved.parents:
        raise TempcalError(f"{where}: it resolves outside the model's folder (a link?); refused")
    if not resolved.is_file():
        raise TempcalError(f"{where}: no such file in the model's folder")
    offset, length = _as_count(entries.get("offset", "0"), where), entries.get("length")
    size = resolved.stat().st_size
    if offset > size or (length is not None and offset + _as_count(length, where) > size):
        raise TempcalError(f"{where}: offset/length beyond the end of the file ({size} bytes); damaged")
    declared = _declared_size(tensor)
    available = size - offset if length is None else _as_count(length, where)
    if declared is not None and declared[1] > available:
        raise TempcalError(f"{where}: its dims {list(tensor.dims)} imply {declared[1]} bytes but the file holds "
                           f"{available} there; damaged or altered")
    return location


def _as_count(text: str, where: str) -> int:
    if not text.isdigit():
        raise TempcalError(f"{where}: offset or length {text[:20]!r} is not a whole number; damaged")
    return int(text)


# -- editing: tempcal's division by T ------------------------------------------------------------
def _graph_names(graph: onnx.GraphProto) -> set[str]:
    """Every value, initializer and node name in ``graph`` and its subgraphs (to make new names unique)."""
    names = {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    names |= {t.name for t in graph.initializer}
    for node in graph.node:
        names |= {*node.input, *node.output, node.name}
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                names |= _graph_names(sub)
    return names


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}_{n}"
    taken.add(candidate)
    return candidate


def _rename_value(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Rename value ``old`` wherever nodes produce or read it, in ``graph`` and the subgraphs that see it."""
    for node in graph.node:
        node.input[:] = [new if v == old else v for v in node.input]
        node.output[:] = [new if v == old else v for v in node.output]
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                _rename_value(sub, old, new)
    for info in graph.value_info:
        if info.name == old:
            info.name = new


def _float_type(graph: onnx.GraphProto, output: str, label: str) -> int:
    """The ONNX element type of a floating-point graph output (else a one-line error)."""
    onnx = import_onnx()
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    info = next(o for o in graph.output if o.name == output)
    elem = info.type.tensor_type.elem_type
    if elem not in floats:
        name = onnx.TensorProto.DataType.Name(elem) if elem else "unknown"
        raise TempcalError(f"output {output!r} of {label} has element type {name}; expected floating-point "
                           "logits")
    return int(elem)


def add_division(model: onnx.ModelProto, output: str, temperature: float, label: str = "the model") -> None:
    """Make graph output ``output`` the old value divided by T (a scalar initializer of its dtype), in place."""
    onnx = import_onnx()
    graph = model.graph
    if not any(output in node.output for node in graph.node):
        raise TempcalError(f"output {output!r} of {label} is not computed by a node (an input or "
                           "initializer passed through); nothing to divide")
    elem = _float_type(graph, output, label)
    taken = _graph_names(graph)
    uncalibrated = _unique(output + UNCALIBRATED_SUFFIX, taken)
    _rename_value(graph, output, uncalibrated)
    constant = _unique(TEMPERATURE_BUFFER, taken)
    graph.initializer.append(onnx.helper.make_tensor(constant, elem, [], [temperature]))
    graph.node.append(onnx.helper.make_node("Div", [uncalibrated, constant], [output], name=_unique(DIV_NODE, taken)))
    _set_metadata(model, format_temperature(temperature))


def strip_calibration(model: onnx.ModelProto) -> None:
    """Remove tempcal's divisions (their T initializers and metadata) in place."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    ours = [n for n in graph.node if n.op_type == "Div" and n.name.startswith(DIV_NODE) and n.output[0] in outputs]
    for node in ours:
        fed, constant, output = node.input[0], node.input[1], node.output[0]
        graph.node.remove(node)
        if not any(constant in n.input for n in graph.node):
            for tensor in [t for t in graph.initializer if t.name == constant]:
                graph.initializer.remove(tensor)
        _rename_value(graph, fed, output)
    _set_metadata(model, None)


def _set_metadata(model: onnx.ModelProto, value: str | None) -> None:
    """Set (or, with None, remove) ``metadata_props[tempcal.temperature]``, keeping every other entry."""
    for entry in [p for p in model.metadata_props if p.key == TEMPERATURE_KEY]:
        model.metadata_props.remove(entry)
    if value is not None:
        model.metadata_props.add(key=TEMPERATURE_KEY, value=value)


__all__ = ["DIV_NODE", "OnnxInfo", "add_division", "all_tensors", "import_onnx", "inspect_onnx", "strip_calibration"]
