"""Which operators a model file may run: torch's own pure computations, told from each operator's schema.

Used by :mod:`tempcal.models.torchscript_check` and :mod:`tempcal.models.pt2_program`; the rules are in
docs/models.md ("Operators, for both"). They read torch's schemas, so operators a later torch adds are judged
by what they declare.
"""

from __future__ import annotations

import functools
from typing import Any

#: Operator libraries a TorchScript graph may call (exported programs: ``aten`` only).
TORCHSCRIPT_NAMESPACES = ("aten", "prim")
#: Variadic operators that are computations: ``Tensor.tolist()``.
_VARIADIC_ALLOWED = frozenset({"prim::tolist"})


@functools.cache
def _void_allowed() -> frozenset[str]:
    """Operators returning nothing that are allowed: checks that raise, a warning, ``torch.no_grad()``."""
    import torch

    try:
        from torch.fx.node import _side_effectful_functions as effectful
    except ImportError:  # a torch without the list: the checks named below only
        effectful = set()
    checks = {op._schema.name for op in effectful
              if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten"}
    return frozenset(checks | {"prim::RaiseException", "aten::warn", "aten::set_grad_enabled",
                               "aten::_linalg_check_errors", "aten::_assert_async", "aten::_assert_scalar"})


def schema_refusal(schema: Any, namespaces: tuple[str, ...] = TORCHSCRIPT_NAMESPACES) -> str | None:
    """Why the operator of ``schema`` (a ``torch._C.FunctionSchema``) is refused, or None when it is allowed."""
    name = schema.name
    namespace = name.split("::", 1)[0]
    if namespace not in namespaces:
        return f"a '{namespace}' operator, not one of torch's built-in operators ({', '.join(namespaces)})"
    if any(argument.name == "filename" for argument in schema.arguments):
        return "it reads or writes a file"
    text = str(schema)
    if namespace == "prim" and text.split(" -> ", 1)[0].endswith("(...)") and name not in _VARIADIC_ALLOWED:
        return "an interpreter operator (printing, Python or remote calls, compiler internals), not a computation"
    returns_nothing = not schema.returns and not text.endswith("-> ...")
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    if returns_nothing and not writes and name not in _void_allowed():
        return "it returns nothing, so it runs only for a side effect"
    return None


def refused_line(label: str, operator: str, why: str, where: str) -> str:
    """The one-line refusal naming the operator, why, and where in the model it is called."""
    return (f"{label}: the model calls {operator} ({why}) in {where}; tempcal runs models made of torch's "
            "pure tensor operators only; refused")


__all__ = ["TORCHSCRIPT_NAMESPACES", "refused_line", "schema_refusal"]
