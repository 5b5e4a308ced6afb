"""A ``.pt2`` program checked before torch reads it: every node an allowed operator (nested graphs included), every
symbolic size parsed with ``ast``, never evaluated, and no ``guards_code`` (torch would call, eval and exec them).
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Iterator
from typing import Any

from ..errors import TempcalError
from .base import refused_line, schema_refusal

#: torch's higher-order operators that only run nested subgraphs (of the same program, checked the same way).
_HIGHER_ORDER = frozenset({"cond", "while_loop", "map_impl", "scan", "associative_scan", "invoke_subgraph",
                           "wrap_with_set_grad_enabled", "wrap_with_autocast"})
_OPERATOR = re.compile(r"torch\.ops\.([A-Za-z_]\w*)\.([A-Za-z_]\w*)\.([A-Za-z_]\w*)")
#: sympy names the serializer's expressions use (``srepr`` notation); torch's own size functions are added.
_SYMPY_NAMES = frozenset({
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Mod", "Max", "Min", "Abs", "floor", "ceiling",
    "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "Equality", "Unequality", "StrictLessThan", "StrictGreaterThan",
    "LessThan", "GreaterThan", "And", "Or", "Not", "Xor", "Piecewise", "ExprCondPair", "ITE", "true", "false",
    "oo", "int_oo", "Infinity", "NegativeInfinity", "Half", "One", "Zero", "NegativeOne", "sqrt",
})
_SYMBOL = re.compile(r"[a-z]+\d+")  # torch's symbol names: s0, u3, zuf1
_EXPRESSION_NODES = (ast.Expression, ast.Call, ast.Name, ast.Constant, ast.keyword, ast.BinOp, ast.UnaryOp,
                     ast.BoolOp, ast.Compare, ast.Tuple, ast.Load, ast.operator, ast.unaryop, ast.boolop, ast.cmpop)
_EXPRESSION_LIMIT = 100_000


def check_program_json(program: Any, label: str, member: str) -> None:
    """Refuse a program JSON calling anything but allowed operators, or with a size expression that is not one."""
    for node in _json_nodes(program):
        target = node.get("target")
        why = target_refusal(target) if isinstance(target, str) else "a malformed node target"
        if why is not None:
            raise TempcalError(refused_line(label, operator_name(str(target)), why, f"member '{member}'"))
    for text in (v if isinstance(v, str) else repr(v) for k, v in _walk(program) if k == "expr_str"):
        why = expression_refusal(text)  # every expr_str (a non-string as its repr, named in the refusal)
        if why is not None:
            shown = text if len(text) <= 80 else text[:77] + "..."
            raise TempcalError(f"{label}: member '{member}': symbolic size {shown!r} is not a size expression "
                               f"({why}); torch would evaluate it as Python code; refused")


def without_guards(blob: bytes) -> bytes:
    """A program JSON with an empty ``guards_code`` (torch ``exec``s those strings; tempcal never needs them)."""
    parsed = json.loads(blob)
    if not parsed.get("guards_code"):
        return blob
    parsed["guards_code"] = []
    return json.dumps(parsed).encode("utf-8")


def operator_name(target: str) -> str:
    """``torch.ops.aten.save.default`` as ``aten::save`` (other overloads kept: ``aten::add.Tensor``)."""
    match = _OPERATOR.fullmatch(target)
    if not match:
        return target
    namespace, op, overload = match.groups()
    return f"{namespace}::{op}" + ("" if overload == "default" else f".{overload}")


@functools.lru_cache(maxsize=4096)
def target_refusal(target: str) -> str | None:
    """Why a serialized node target is refused (None when allowed)."""
    if target in _size_arithmetic():
        return None
    if target.startswith("torch.ops.higher_order."):
        name = target.removeprefix("torch.ops.higher_order.")
        return None if name in _HIGHER_ORDER else "a higher-order operator that runs more than nested subgraphs"
    match = _OPERATOR.fullmatch(target)
    if not match:
        return "not an operator: a Python function or attribute, which torch would call as it stands"
    namespace, op, overload = match.groups()
    if namespace != "aten":
        return f"a '{namespace}' operator, not one of torch's built-in aten operators"
    import torch

    try:
        schema = getattr(getattr(torch.ops.aten, op), overload)._schema
    except (AttributeError, RuntimeError):
        return "no such aten operator in this torch"
    return schema_refusal(schema, ("aten",))


@functools.cache
def _size_arithmetic() -> frozenset[str]:
    """The serialized names of torch's symbolic-size operators (the serializer's ``_SYM_OPS``)."""
    from torch._export.serde import serialize

    ops = getattr(serialize, "_SYM_OPS", None) or set().union(
        *(getattr(serialize, name, set()) for name in ("_SYM_INT_OPS", "_SYM_BOOL_OPS", "_SYM_FLOAT_OPS")))
    return frozenset(f"{op.__module__}.{op.__name__}" for op in ops)


def expression_refusal(text: str) -> str | None:
    """Why ``text`` is not a sympy size expression of the serializer's notation (None when it is one)."""
    if len(text) > _EXPRESSION_LIMIT:
        return f"longer than {_EXPRESSION_LIMIT} characters"
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "not an expression"
    names = _SYMPY_NAMES | _torch_size_functions()
    named = {id(call.args[0]) for call in ast.walk(tree)
             if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in ("Symbol", "Float")
             and call.args}
    for node in ast.walk(tree):
        if not isinstance(node, _EXPRESSION_NODES):
            return f"{type(node).__name__.lower()} syntax"
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in names):
            return "a call of something other than a sympy or torch size function"
        if isinstance(node, ast.Name) and node.id not in names and not _SYMBOL.fullmatch(node.id):
            return f"the name {node.id!r}"
        if isinstance(node, ast.keyword) and not isinstance(node.value, ast.Constant):
            return "a keyword argument that is not a constant"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in named:
            return "a string outside Symbol(...) and Float(...)"
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str, type(None))):
            return f"a {type(node.value).__name__} constant"
    return None


@functools.cache
def _torch_size_functions() -> frozenset[str]:
    import torch.utils._sympy.functions as functions

    return frozenset(getattr(functions, "__all__", ()))


def _walk(value: Any) -> Iterator[tuple[Any, Any]]:
    """(key, value) of every entry of nested JSON dicts (lists walked through), without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        entries = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        for key, inner in entries:
            yield key, inner
            if isinstance(inner, (dict, list)):
                stack.append(inner)


def _json_nodes(program: Any) -> Iterator[dict[str, Any]]:
    """Every serialized graph node (any dict with a target, and every entry of a ``nodes`` list), nested graphs
    included: a node without a string target is refused as malformed."""
    for key, value in _walk([program]):
        if isinstance(value, dict) and "target" in value:
            yield value
        elif key == "nodes" and isinstance(value, list):  # entries with a target are reached by the walk itself
            for item in value:
                if not (isinstance(item, dict) and "target" in item):
                    yield {"target": None}


def graph_refusal(program: Any) -> tuple[str, str, str] | None:
    """(operator, why, node) for the first node of a deserialized program (any nested graph) that is refused."""
    import operator

    import torch

    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if isinstance(graph, torch.fx.Graph) else ():
            if node.op in ("placeholder", "output", "get_attr"):
                continue
            target = node.target
            if node.op != "call_function":
                return f"{node.op} {target}", "not an operator call", node.name
            if target is operator.getitem:
                continue
            if isinstance(target, torch._ops.OpOverload | torch._ops.HigherOrderOperator):
                name = target.__module__.replace("torch._ops", "torch.ops") + "." + target.__name__
            else:
                name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__name__', target)}"
            why = target_refusal(name)
            if why is not None:
                return operator_name(name), why, node.name
    return None


__all__ = ["check_program_json", "graph_refusal", "without_guards"]
