"""TorchScript models (legacy; deprecated by torch): checked before torch loads them (code records parsed with ``ast``
for ``__setstate__``, every compiled node an allowed operator), loaded, written calibrated, converted to ``.pt2``.
"""

from __future__ import annotations

import ast
import functools
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..core.parallel import resolve_device
from ..errors import TEMPERATURE_KEY, TempcalError, format_temperature, param, stored_temperature
from ..io.paths import write_bytes_atomic
from .base import ORIGINAL, TEMPERATURE_BUFFER, LoadedModel, OutputKey, error_line, quiet, refused_line, schema_refusal
from .detect import HOW_TO_SAVE, archive_kind
from .run import as_index, select_output


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
    extra = {TEMPERATURE_KEY: ""}
    with quiet():  # torch's "torch.jit.* is deprecated" warnings too: the CLI contract reads TorchScript
        model = load_checked(path, target, extra, str(path))
    model.eval()
    buffer: Any = getattr(model, TEMPERATURE_BUFFER, None)  # a calibrated model divides by this buffer
    calibrated = hasattr(model, ORIGINAL) and isinstance(buffer, torch.Tensor) and buffer.numel() == 1
    buffered = stored_temperature(repr(float(buffer)), f"{path}: buffer") if calibrated else None
    text = extra[TEMPERATURE_KEY]
    saved = stored_temperature(text, f"{path}: extra file") if text else None
    if saved != buffered:
        raise TempcalError(f"{path}: extra file '{TEMPERATURE_KEY}' says T = {saved!r} but the model divides by "
                           f"{buffered!r}; the file was altered, save the calibrated model again")
    original = getattr(model, ORIGINAL) if buffered is not None else model
    return LoadedModel(path, "torchscript", original, saved, target)


# -- writing a calibrated model: the original wrapped, its selected logits divided by a float64 buffer --
class Calibrated(torch.nn.Module):
    """The original model with its logits divided by T: its tensor output, entry ``key`` of its dict or output ``index``
    of its tuple (other outputs as they are); TorchScript compiles only the branch of the original's output type."""

    __constants__ = ("index", "after", "key")

    def __init__(self, original: torch.nn.Module, temperature: torch.Tensor, index: int = 0, key: str = "") -> None:
        super().__init__()
        self.original = original  # ORIGINAL: loaders find the original under this name
        self.register_buffer(TEMPERATURE_BUFFER, temperature)
        self.index = index
        self.after = index + 1  # a constant too: TorchScript slices tuples at constants only
        self.key = key

    def forward(self, x: torch.Tensor):
        out = self.original(x)  # type: ignore[operator]
        if isinstance(out, torch.Tensor):
            return out / self.tempcal_temperature  # type: ignore[operator]
        if torch.jit.isinstance(out, dict[str, torch.Tensor]):
            out = out.copy()
            out[self.key] = out[self.key] / self.tempcal_temperature
            return out
        return out[:self.index] + (out[self.index] / self.tempcal_temperature,) + out[self.after:]  # noqa: RUF005


def calibrated_wrapper(original: torch.nn.Module, temperature: float, output_key: OutputKey,
                       name: str) -> Calibrated:
    """The wrapper that fits the original's forward signature (one tensor in; a tensor, dict or tuple out)."""
    t = torch.tensor(temperature, dtype=torch.float64)
    flag = param("output_key")
    try:
        schema = original._c._get_method("forward").schema  # type: ignore[union-attr,operator]
    except (AttributeError, RuntimeError):  # no readable signature: wrap as a tensor model, the check tells
        return Calibrated(original, t)
    arguments = [a for a in schema.arguments[1:] if not a.has_default_value()]
    if len(arguments) != 1 or str(arguments[0].type) != "Tensor":
        raise TempcalError(f"{name} forward takes ({', '.join(str(a.type) for a in arguments)}); "
                           "tempcal wraps a model that takes one tensor")
    returns = schema.returns[0].type if len(schema.returns) == 1 else None
    kind = str(returns)
    if kind == "Tensor":
        if output_key is not None:
            raise TempcalError(f"{flag} {output_key}: {name} returns a single tensor; drop {flag}")
        return Calibrated(original, t)
    if isinstance(returns, torch.DictType) and str(returns.getKeyType()) == "str" \
            and str(returns.getValueType()) == "Tensor":
        if output_key is None:
            raise TempcalError(f"{name} returns a dict; name the logits entry with {flag} NAME")
        return Calibrated(original, t, key=str(output_key))
    if isinstance(returns, torch.TupleType) and all(str(e) == "Tensor" for e in returns.elements()) \
            and len(returns.elements()) in (2, 3):
        n = len(returns.elements())
        index = None if output_key is None else as_index(output_key)
        if index is None or not -n <= index < n:
            raise TempcalError(f"{name} returns a tuple of {n} tensors; choose the logits with {flag} 0..{n - 1}")
        return Calibrated(original, t, index=index % n)
    raise TempcalError(f"{name} returns {kind}; tempcal wraps a model returning a tensor, a dict of "
                       "tensors or a tuple of 2 or 3 tensors")


def save_calibrated(model: LoadedModel, temperature: float, out_path: str | os.PathLike, *,
                    output_key: OutputKey = None, check_inputs: torch.Tensor | None = None) -> Path:
    """Write, atomically, ``model`` wrapped so that its selected logits are divided by ``temperature`` (T also in the
    extra file), once the saved bytes, loaded back, reproduce them on ``check_inputs``."""
    wrapper = calibrated_wrapper(model.net, temperature, output_key, model.name)
    buffer = io.BytesIO()
    with quiet():
        try:
            scripted = torch.jit.script(wrapper)
        except Exception as exc:
            raise TempcalError(f"cannot wrap {model.name}: {error_line(exc)}") from None
        torch.jit.save(scripted, buffer, _extra_files={TEMPERATURE_KEY: format_temperature(temperature)})
        if check_inputs is not None:
            reloaded = load_checked(buffer.getvalue(), torch.device("cpu"), {}, "the calibrated model").eval()
            _check_saved(reloaded, model, temperature, check_inputs, output_key)
    return write_bytes_atomic(out_path, buffer.getvalue(), what=param("save_model"))


def _check_saved(reloaded: Any, model: LoadedModel, temperature: float, x: torch.Tensor,
                 output_key: OutputKey) -> None:
    """Compare the reloaded TorchScript model's logits with the original's divided by T on a few inputs."""
    with torch.inference_mode():
        try:
            expected = select_output(model.net(x), output_key, model.name)
            got = select_output(reloaded(x), output_key, model.name)
        except TempcalError:
            raise
        except Exception as exc:
            raise TempcalError(f"the calibrated {model.name} fails on {list(x.shape)} inputs: "
                               f"{error_line(exc)}") from None
        want = expected.to(torch.float64) / temperature
        if got.shape != expected.shape or not torch.allclose(got.to(torch.float64), want, rtol=1e-5, atol=1e-6):
            raise TempcalError(f"the calibrated {model.name} does not reproduce its logits divided by "
                               f"T = {temperature!r}; nothing written")


# -- checked before torch loads it, and before anything of it runs ------------------------------------
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
        read: Any = torch._C.import_ir_module_from_buffer if isinstance(source, bytes) else torch._C.import_ir_module
        module = read(unit, source if isinstance(source, bytes) else os.fspath(source), device, extra_files, False)
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


# -- the migration path: TorchScript to an exported program ---------------------------------------
def to_graph_module(module: torch.jit.ScriptModule, example: tuple[torch.Tensor, ...],
                    label: str) -> torch.fx.GraphModule:
    """``module`` as a flat graph module (to export with a dynamic batch) by torch's converter, its size assertions
    dropped first (the converter makes them ``torch.cond``, fixing the batch size) and its outputs' structure kept."""
    advice = "export the original nn.Module with torch.export and calibrate that"
    try:
        from torch._export.converter import TS2EPConverter
    except ImportError:
        raise TempcalError(f"this torch cannot convert TorchScript to an exported program; {advice}") from None
    module.eval()
    try:
        with quiet():
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


__all__ = ["Calibrated", "load", "save_calibrated", "to_graph_module"]
