"""What every model format gives the rest of tempcal, :class:`LoadedModel` (the original's ``net`` and a calibrated
model's T, so the default ``--tau`` reproduces the calibrated outputs), and what the formats share.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import warnings
from collections.abc import Iterator
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
    format: str  # "torchscript", "export" (.pt2) or "onnx": see tempcal.models.detect.FORMAT_NAMES
    #: ``net(x)`` maps an inputs batch (a tensor on ``device``) to the original's outputs: a tensor, a tuple or a
    #: dict of tensors. For torch formats a module in eval semantics (autograd works through it, for ODIN); for
    #: ONNX a callable that runs onnxruntime (no autograd).
    net: Any
    temperature: float | None
    device: Any

    @property
    def name(self) -> str:
        return str(self.path)


def runtime(model_format: str) -> Any:
    """The module that loads (and saves) ``model_format``: ``tempcal.models.<model_format>``."""
    return importlib.import_module(f"{__package__}.{model_format}")


def load_model(path: str | os.PathLike, device: Any = "auto") -> LoadedModel:
    """A model of any format (told by its suffix and first bytes), ready to run on ``device``."""
    from .detect import model_format

    return runtime(model_format(path)).load(path, device)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence warnings and log records below ERROR while a runtime works: users see tempcal's one-line errors."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for the ways torch and onnxruntime report running out of (device) memory."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return any(sign in text for sign in ("out of memory", "bad_alloc", "failed to allocate", "can't allocate memory"))


def error_line(exc: BaseException, *, last: bool = True) -> str:
    """One line of an error: the last (TorchScript's error, after its traceback) or the first (a loader's reason)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = (lines[-1] if last else lines[0]) if lines else type(exc).__name__
    text = text.removeprefix("builtins.")
    return text if len(text) <= 300 else text[:297] + "..."


def reraise_control(exc: BaseException) -> None:
    """Re-raise Ctrl-C and exits caught by ``except BaseException``, which a loader's failure needs to catch: the
    Rust libraries (tokenizers, safetensors) raise ``PanicException``, a BaseException, when they panic."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        raise exc


# -- which operators a model file may run: torch's own pure computations (docs/models.md, "Operators, for both")
#: Operator libraries a TorchScript graph may call (exported programs: ``aten`` only).
TORCHSCRIPT_NAMESPACES = ("aten", "prim")
#: Variadic operators that are computations: ``Tensor.tolist()``.
_VARIADIC_ALLOWED = frozenset({"prim::tolist"})


@functools.cache
def _void_allowed() -> frozenset[str]:
    """Operators returning nothing that are allowed: checks that raise, a warning, ``torch.no_grad()``."""
    import torch
    from torch.fx.node import _side_effectful_functions as effectful  # in every torch tempcal supports (>= 2.3)

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


__all__ = ["DEFAULT_BATCH_SIZE", "ORIGINAL", "TEMPERATURE_BUFFER", "LoadedModel", "OutputKey", "error_line",
           "is_out_of_memory", "load_model", "quiet", "refused_line", "reraise_control", "runtime", "schema_refusal"]
