"""TorchScript files checked before torch loads them and before anything of theirs runs.

``torch.jit.load`` calls a file's ``__setstate__``: the code records are parsed with ``ast`` first and a file
defining it (or ``__getstate__``) is refused. Then every function compiled from the file is walked: each node
must pass :func:`tempcal.models.op_check.schema_refusal` or be structural (:data:`_STRUCTURAL`), and each call
must reach a function of the file (docs/models.md, "What is checked before a model runs").
"""

from __future__ import annotations

import ast
import functools
import io
import os
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import TempcalError
from .base import error_line
from .op_check import refused_line, schema_refusal

#: Interpreter nodes without a schema that only build values or steer control flow.
_STRUCTURAL = frozenset({
    "prim::Constant", "prim::GetAttr", "prim::SetAttr", "prim::If", "prim::Loop", "prim::ListConstruct",
    "prim::ListUnpack", "prim::TupleConstruct", "prim::TupleUnpack", "prim::DictConstruct", "prim::isinstance",
    "prim::CreateObject", "prim::unchecked_cast", "prim::Uninitialized",
})
#: Methods torch's (un)pickler calls by itself while loading or saving a TorchScript file.
_IMPLICIT_METHODS = ("__setstate__", "__getstate__")
#: Largest source record read for the check.
_CODE_LIMIT = 1 << 26
_CUSTOM_CLASSES = "__torch__.torch.classes."


def load_checked(source: str | os.PathLike | bytes, device: torch.device, extra_files: dict[str, Any],
                 label: str) -> torch.jit.ScriptModule:
    """The TorchScript model in ``source`` (a path or archive bytes), its code checked; raises a one-line
    :class:`TempcalError` naming what is refused. ``extra_files`` is filled as ``torch.jit.load`` does."""
    from torch.jit._recursive import wrap_cpp_module

    check_sources(source, label)
    unit = torch._C.CompilationUnit()
    try:
        if isinstance(source, bytes):
            module = torch._C.import_ir_module_from_buffer(  # type: ignore[call-arg]
                unit, source, device, extra_files, False)  # type: ignore[arg-type]
        else:
            module = torch._C.import_ir_module(  # type: ignore[call-arg]
                unit, os.fspath(source), device, extra_files, False)
    except Exception as exc:  # a damaged or hostile archive: one line, whatever torch makes of it
        raise TempcalError(f"{label}: not a loadable TorchScript model ({error_line(exc, last=False)})") from None
    check_unit(unit, label)
    return wrap_cpp_module(module)


def check_sources(source: str | os.PathLike | bytes, label: str) -> None:
    """Refuse a file whose code defines a method torch's unpickler or pickler would call (read, never run)."""
    try:
        reader = torch._C.PyTorchFileReader(io.BytesIO(source) if isinstance(source, bytes) else os.fspath(source))
        records = [r for r in reader.get_all_records() if r.endswith(".py")]
    except Exception as exc:
        raise TempcalError(f"{label}: not a loadable TorchScript model ({error_line(exc, last=False)})") from None
    for record in records:
        size = reader.get_record_size(record)
        if size > _CODE_LIMIT:
            raise TempcalError(f"{label}: code record '{record}' declares {size} bytes, more than the {_CODE_LIMIT} "
                               "tempcal reads; refused")
        try:
            tree = ast.parse(bytes(reader.get_record(record)).decode("utf-8"), filename=record)
        except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError) as exc:
            raise TempcalError(f"{label}: code record '{record}' cannot be checked ({error_line(exc, last=False)}); "
                               "refused") from None
        for node in ast.walk(tree):
            name = getattr(node, "name", None) or getattr(node, "id", None) or getattr(node, "attr", None)
            if name in _IMPLICIT_METHODS:
                raise TempcalError(f"{label}: its code defines or names {name} (in '{record}'), which torch runs "
                                   "by itself while loading or saving the model; refused")


def check_unit(unit: Any, label: str) -> None:
    """Walk every function compiled from the file; refuse the first node that is not a pure computation."""
    functions = {f.qualified_name: f for f in unit.get_functions()}
    for name, function in functions.items():
        for node in _nodes(function.graph):
            refusal = _node_refusal(node, functions)
            if refusal is not None:
                raise TempcalError(refused_line(label, refusal[0], refusal[1], name))


def _nodes(block: Any) -> Iterator[Any]:
    """Every node of a graph or block, nested blocks (of ``if`` and loops) included."""
    for node in block.nodes():
        yield node
        for inner in node.blocks():
            yield from _nodes(inner)


def _node_refusal(node: Any, functions: dict[str, Any]) -> tuple[str, str] | None:
    """(operator, why) when ``node`` is refused, else None."""
    kind = node.kind()
    text = node.schema()
    if text != "(no schema)":
        why = _text_refusal(text)
        return None if why is None else (kind, why)
    if kind in _STRUCTURAL:
        owner = node.outputsAt(0).type() if kind == "prim::CreateObject" else None
        if owner is not None and owner.qualified_name().startswith(_CUSTOM_CLASSES):
            return kind, f"it makes a C++ custom class object ({owner.qualified_name()})"
        return None
    callee = _callee(node)
    if callee is None:
        return kind, "not a tensor computation tempcal allows"
    if callee not in functions:
        return kind, f"it calls {callee}, code that is not compiled from the file (a C++ custom class or an interface)"
    return None


@functools.lru_cache(maxsize=4096)
def _text_refusal(text: str) -> str | None:
    """:func:`schema_refusal` of a schema given as text (nodes of one operator share it: parsed once)."""
    return schema_refusal(torch._C.parse_schema(text))


def _callee(node: Any) -> str | None:
    """The qualified name of the function a call node runs (None for a node that is not a call)."""
    kind = node.kind()
    if kind == "prim::CallFunction":
        return str(node.inputsAt(0).type().annotation_str)
    method = {"prim::CallMethod": node.s("name") if node.hasAttribute("name") else None,
              "prim::Enter": "__enter__", "prim::Exit": "__exit__"}.get(kind)
    if method is None:
        return None
    owner = node.inputsAt(0).type()
    qualified = getattr(owner, "qualified_name", None)
    return f"{qualified()}.{method}" if qualified is not None else f"{owner}.{method}"


__all__ = ["check_sources", "check_unit", "load_checked"]
