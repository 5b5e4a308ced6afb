"""What a configuration file may hold, derived from the commands' own parameters and the markers Typer ignores
(:class:`PathValue`, :class:`ValueType`, :data:`NOT_CONFIGURABLE`), so that an option is declared once."""

from __future__ import annotations

import enum
import inspect
import math
import os
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal

from typer.models import ParameterInfo

from ..errors import Bounds, TempcalError, check_number, shown_value

SOURCE_KEY = "source"


class ConfigError(TempcalError):
    """Bad configuration: one line naming the file and, where it applies, the key (exit status 2)."""


# -- markers for parameter annotations ------------------------------------------------------------


@dataclass(frozen=True)
class PathValue:
    """Annotation marker: the option holds file paths, relative to a configuration file that gives them; an input
    (``must_exist``) must exist, a pattern (``glob``) match a file; ``allow_dash``: ``-`` is standard output."""

    must_exist: bool = False
    allow_dash: bool = False
    glob: bool = False


@dataclass(frozen=True)
class ValueType:
    """Annotation marker: how a TOML value becomes the option's value (``convert``: TypeError, or ValueError with
    its message) and how a command-line value is checked before any file is read (``check``)."""

    expected: str
    convert: Callable[[Any], Any]
    check: Callable[[str], Any] | None = None


@dataclass(frozen=True)
class NotConfigurable:
    """Annotation marker: the option cannot be set in a configuration file (``--config`` itself)."""


NOT_CONFIGURABLE = NotConfigurable()
INPUT = PathValue(must_exist=True)
INPUTS = PathValue(must_exist=True, glob=True)
OUTPUT = PathValue()


# -- the schema of a command ----------------------------------------------------------------------

Kind = Literal["bool", "int", "float", "str", "choice", "path", "custom"]


@dataclass(frozen=True)
class OptionSpec:
    """One configurable parameter: its key in the file, the parameter it sets and the values it takes."""

    key: str  # long name without dashes ("val-fraction"), or the argument's name ("source")
    param_name: str  # the parameter's Python name ("val_fraction"): the default_map key
    kind: Kind
    multiple: bool  # repeatable option or nargs=-1 argument: the file gives a list (a scalar is one item)
    is_argument: bool = False
    aliases: tuple[str, ...] = ()  # further long names of the same option
    negative: tuple[str, ...] = ()  # the off switch of an on/off flag ("write"), refused with a hint
    choices: tuple[str, ...] = ()
    case_sensitive: bool = True
    bounds: Bounds | None = None  # a number's range (int and float kinds)
    path: PathValue | None = None
    value_type: ValueType | None = None


@dataclass(frozen=True)
class CommandSchema:
    """A command's configurable parameters by key (aliases included) and its SOURCE argument."""

    name: str
    options: Mapping[str, OptionSpec]
    source: OptionSpec | None
    refused: Mapping[str, str] = field(default_factory=dict)  # key -> why it cannot be configured


#: The top-level ``source``: paths or glob patterns of files that must exist.
TOP_SOURCE = OptionSpec(key=SOURCE_KEY, param_name=SOURCE_KEY, kind="path", multiple=True, path=INPUTS)


def command_schema(command: Any, only: Collection[str] | None = None) -> CommandSchema:
    """The schema of a Typer command, from its parameters and its callback's annotations; of the parameters named in
    ``only`` alone when given (the values a command line gave, checked when no configuration file is read)."""
    annotations = _callback_annotations(command, only)
    options: dict[str, OptionSpec] = {}
    refused: dict[str, str] = {}
    source: OptionSpec | None = None
    for param in getattr(command, "params", []):
        name = param.name
        if not name or name not in annotations:
            continue
        annotation, metadata, info = annotations[name]
        is_argument = getattr(param, "param_type_name", "") == "argument"
        # an option's long names without dashes (--val-fraction: val-fraction), the first one primary
        longs = [opt[2:] for opt in param.opts if opt.startswith("--")] or [name.replace("_", "-")]
        keys = [name] if is_argument else longs
        if any(isinstance(m, NotConfigurable) for m in metadata) or getattr(param, "is_eager", False):
            refused.update({key: "cannot be set in a configuration file" for key in keys})
            continue
        spec = _spec_for(param, keys, annotation, metadata, info, is_argument)
        if isinstance(spec, str):
            refused.update({key: spec for key in keys})
            continue
        if is_argument and name == SOURCE_KEY:
            spec = replace(spec, kind="path", path=TOP_SOURCE.path)  # SOURCE: paths that must exist
            source = spec
        for key in (spec.key, *spec.aliases):
            options[key] = spec
    return CommandSchema(name=getattr(command, "name", "") or "", options=options, source=source, refused=refused)


def _callback_annotations(command: Any, only: Collection[str] | None) -> dict[str, tuple[Any, list[Any], Any]]:
    """Per parameter name (of ``only``, when given): (annotation without Annotated/Optional, Annotated metadata,
    Typer's ParameterInfo)."""
    signature = inspect.signature(command.callback, eval_str=True)  # follows Typer's wrapper to the function
    out: dict[str, tuple[Any, list[Any], Any]] = {}
    for name, parameter in signature.parameters.items():
        if only is not None and name not in only:
            continue
        annotation = parameter.annotation
        metadata: list[Any] = []
        if typing.get_origin(annotation) is Annotated:
            annotation, *metadata = typing.get_args(annotation)
        info = next((m for m in metadata if isinstance(m, ParameterInfo)), None)
        out[name] = (_strip_optional(annotation), metadata, info)
    return out


def _strip_optional(annotation: Any) -> Any:
    """``Optional[X]`` / ``X | None`` as ``X``."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    is_union = origin is typing.Union or getattr(origin, "__name__", "") == "UnionType"
    if is_union and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _spec_for(param: Any, keys: list[str], annotation: Any, metadata: list[Any], info: Any,
              is_argument: bool) -> OptionSpec | str:
    """The spec of one parameter, or why it cannot be configured."""
    multiple = bool(getattr(param, "multiple", False)) or getattr(param, "nargs", 1) == -1
    element = annotation  # a repeatable option's items; any other generic (a tuple) is refused at the end
    if typing.get_origin(annotation) in (list, Sequence):
        element = _strip_optional(typing.get_args(annotation)[0])
    path = next((m for m in metadata if isinstance(m, PathValue)), None)
    value_type = next((m for m in metadata if isinstance(m, ValueType)), None)
    low, high = getattr(info, "min", None), getattr(info, "max", None)  # typer.Option(min=, max=): both included
    common: dict[str, Any] = {
        "key": keys[0], "param_name": param.name, "multiple": multiple, "is_argument": is_argument,
        "aliases": tuple(keys[1:]),
        "negative": tuple(o[2:] for o in getattr(param, "secondary_opts", []) if o.startswith("--")),
        "bounds": next((m for m in metadata if isinstance(m, Bounds)), None)
        or (None if low is None and high is None else Bounds(low, high)),
        "case_sensitive": bool(getattr(info, "case_sensitive", True)),
    }
    if value_type is not None:
        return OptionSpec(kind="custom", value_type=value_type, **common)
    if path is not None or (isinstance(element, type) and issubclass(element, PurePath)):
        return OptionSpec(kind="path", path=path or PathValue(), **common)
    if isinstance(element, type) and issubclass(element, enum.Enum):
        return OptionSpec(kind="choice", choices=tuple(str(m.value) for m in element), **common)
    for python_type, kind in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str")):
        if element is python_type:
            return OptionSpec(kind=kind, **common)  # type: ignore[arg-type]
    return f"an option of type {getattr(element, '__name__', element)} cannot be set in a configuration file"


# -- values ---------------------------------------------------------------------------------------


def expected(spec: OptionSpec) -> str:
    """What a spec takes, for messages."""
    if spec.kind == "custom":
        assert spec.value_type is not None
        return spec.value_type.expected
    if spec.kind == "choice":
        return "one of " + ", ".join(f'"{c}"' for c in spec.choices)
    return {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string",
            "path": "a path (a string)"}[spec.kind]


#: The TOML types each kind takes (a bool is no number).
_TOML_TYPES: dict[str, Any] = {"bool": bool, "int": int, "float": (int, float), "str": str, "choice": str,
                               "path": str}


def convert_value(spec: OptionSpec, value: Any, folder: Path) -> Any:
    """One TOML value as the command-line value of ``spec`` (TypeError: wrong type; ValueError: its message)."""
    if spec.kind == "custom":
        assert spec.value_type is not None
        return spec.value_type.convert(value)
    if not isinstance(value, _TOML_TYPES[spec.kind]) or (isinstance(value, bool) and spec.kind != "bool"):
        raise TypeError
    if spec.kind == "float" and isinstance(value, float) and math.isnan(value):
        raise TypeError(f"expected {expected(spec)}, got nan")
    if spec.kind in ("int", "float"):
        return check_number(value, spec.bounds, whole=spec.kind == "int")
    if spec.kind == "choice":
        for choice in spec.choices:
            if choice == value or (not spec.case_sensitive and choice.casefold() == value.casefold()):
                return choice
        raise ValueError(f"expected {expected(spec)}, got \"{value}\"")
    return _to_path(spec, value, folder) if spec.kind == "path" else value


def _to_path(spec: OptionSpec, value: str, folder: Path) -> str:
    """A path string; relative ones joined to the file's folder (lexically normalised), '-' kept when allowed; shown
    relative to the current folder when it lies there or below, else absolute."""
    if not value:
        raise ValueError("expected a path, got an empty string")
    if spec.path is not None and spec.path.allow_dash and value == "-":
        return value
    path = os.path.normpath(os.path.join(folder, value))
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return path if relative == os.pardir or relative.startswith(os.pardir + os.sep) else relative


def toml_kind(value: Any) -> str:
    """A TOML value as a message shows it: ``true``, ``2``, ``"abc"``, ``a table``, ``a list``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return "nan" if isinstance(value, float) and math.isnan(value) else shown_value(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return "a date" if type(value).__name__ in ("date", "datetime") else "a time"  # TOML dates and times


__all__ = ["INPUT", "INPUTS", "NOT_CONFIGURABLE", "OUTPUT", "SOURCE_KEY", "TOP_SOURCE", "CommandSchema", "ConfigError",
           "OptionSpec", "PathValue", "ValueType", "command_schema", "convert_value", "expected", "toml_kind"]
