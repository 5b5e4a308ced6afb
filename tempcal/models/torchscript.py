"""TorchScript classifiers as a SOURCE: run one over saved inputs, save its logits, ship it calibrated, score by ODIN.

Models are read with ``torch.jit.load`` only, never ``torch.load`` or Python's pickle: a file must be a
TorchScript zip archive (``constants.pkl`` and ``code/`` inside, checked without reading any of it)
before torch is asked to load it, and TorchScript's own loader builds no arbitrary Python objects.

A calibrated model (:func:`save_calibrated_model`) wraps the original as its submodule ``original`` and
divides the selected logits by the float64 buffer ``tempcal_temperature``; T is also kept in the
archive's extra file ``tempcal.temperature``. Running a calibrated model as a SOURCE runs ``original``
and returns T as the stored temperature, so ``--tau`` means what it means for a logits file holding T
in its metadata: the default (stored T) reproduces the calibrated outputs, ``--tau 1`` the original.

Inputs files are safetensors with ``inputs`` ``[N, ...]`` (any dtype the model takes) and integer
``labels`` ``[N]``; batches are sliced from the file, so the inputs are never all in memory at once.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..core.data import LogitsData, as_logits_data, resolve_device
from ..errors import DataError, TempcalError
from ..io.safetensors_header import TEMPERATURE_KEY, check_unchanged, read_header, read_tensor, shown
from ..validation import positive_number
from ..workflows.common import OpenedSource

if TYPE_CHECKING:
    from rich.console import Console

    from ..workflows.ood import OodReport

MODEL_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript")
DEFAULT_BATCH_SIZE = 512
#: Name of the extra file (in the TorchScript archive) and of the buffer that hold a calibrated model's T.
TEMPERATURE_FILE = TEMPERATURE_KEY
TEMPERATURE_BUFFER = "tempcal_temperature"
ORIGINAL = "original"
#: How to save a model so that tempcal can read it (shown in errors).
HOW_TO_SAVE = "save it with torch.jit.save(torch.jit.script(model), PATH)"
#: An output key: a dict key, or a tuple index (an int, or a string of digits as the CLI passes it).
OutputKey = str | int | None


@contextlib.contextmanager
def _jit() -> Iterator[None]:
    """Silence torch's "torch.jit.* is deprecated" warnings: the CLI contract reads TorchScript, on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
        yield


# -- recognising and loading models -----------------------------------------------------------
def _archive_kind(path: Path) -> str:
    """What ``path`` holds, read from its first bytes and zip directory only (never unpickled).

    One of ``torchscript``, ``torch.save zip``, ``zip``, ``pickle``, ``missing``, ``not a file``, ``other``.
    """
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
        except (OSError, zipfile.BadZipFile, ValueError):
            return "other"
        parts = [name.split("/") for name in names]
        if any(p[-1] == "constants.pkl" for p in parts) and any("code" in p[:-1] for p in parts):
            return "torchscript"
        return "torch.save zip" if any(p[-1] == "data.pkl" for p in parts) else "zip"
    if magic[:1] == b"\x80":
        return "pickle"
    return "other"


def is_model_path(path: str | os.PathLike) -> bool:
    """True for a ``.pt``/``.pth``/``.ts``/``.torchscript`` file that is a TorchScript archive.

    A ``.pt`` dict of tensors saved by ``torch.save`` is not a model. Nothing in the file is unpickled.
    """
    path = Path(path)
    return path.suffix.lower() in MODEL_SUFFIXES and _archive_kind(path) == "torchscript"


def load_model(path: str | os.PathLike, device: str | torch.device = "auto") -> torch.jit.ScriptModule:
    """Load a TorchScript model in eval mode on ``device`` (``torch.jit.load`` only; anything else is refused)."""
    return _load(Path(path), resolve_device(device))[0]


def _load(path: Path, device: torch.device) -> tuple[torch.jit.ScriptModule, float | None]:
    """The model and the T in its extra file ``tempcal.temperature`` (checked against the buffer it divides by)."""
    kind = _archive_kind(path)
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
        with _jit():
            model = torch.jit.load(str(path), map_location=device, _extra_files=extra)
    except Exception as exc:  # a damaged or hostile archive: one line, whatever torch makes of it
        raise TempcalError(f"{path}: not a loadable TorchScript model ({_error_line(exc, last=False)})") from None
    model.eval()
    model._tempcal_source = str(path)
    stored = model_temperature(model)
    text = extra[TEMPERATURE_FILE]
    saved = _parse_temperature(text, f"{path}: extra file '{TEMPERATURE_FILE}'") if text else None
    if saved != stored:
        raise TempcalError(f"{path}: extra file '{TEMPERATURE_FILE}' says T = {saved!r} but the model divides by "
                           f"{stored!r}; the file was altered, save the calibrated model again")
    return model, saved


def _parse_temperature(text: str | bytes, where: str) -> float:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    value = positive_number(text)
    if value is None:
        raise TempcalError(f"{where} is {shown(text)}, not a positive number")
    return value


def read_model_temperature(path: str | os.PathLike) -> float | None:
    """The T a calibrated model carries in its extra file ``tempcal.temperature`` (None for any other model)."""
    return _load(Path(path), torch.device("cpu"))[1]


def model_temperature(model: torch.jit.ScriptModule) -> float | None:
    """The T a loaded calibrated model divides by (its ``tempcal_temperature`` buffer), None for any other model."""
    if not (hasattr(model, TEMPERATURE_BUFFER) and hasattr(model, ORIGINAL)):
        return None
    buffer = getattr(model, TEMPERATURE_BUFFER)
    if not isinstance(buffer, torch.Tensor) or buffer.numel() != 1:
        return None
    return _parse_temperature(repr(float(buffer)), f"{_name(model)}: buffer '{TEMPERATURE_BUFFER}'")


def _unwrapped(model: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """The original model inside a calibrated one; any other model itself."""
    return getattr(model, ORIGINAL) if model_temperature(model) is not None else model


def _name(model: Any) -> str:
    return getattr(model, "_tempcal_source", None) or "the model"


def _error_line(exc: BaseException, *, last: bool = True) -> str:
    """One line of an error: the last (TorchScript's error, after its traceback) or the first (a loader's reason)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = (lines[-1] if last else lines[0]) if lines else type(exc).__name__
    text = text.removeprefix("builtins.")
    return text if len(text) <= 300 else text[:297] + "..."


#: safetensors dtype names as torch names, for messages.
SAFETENSORS_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "F16": "float16",
                      "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64",
                      "U64": "uint64", "F64": "float64", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn"}


# -- inputs files -----------------------------------------------------------------------------
class InputsFile:
    """A checked inputs file: the inputs tensor is read in row slices, the labels (if any) whole."""

    def __init__(self, path: str | os.PathLike, inputs_key: str = "inputs") -> None:
        self.path = Path(path)
        self.key = inputs_key
        self.header = read_header(self.path)
        if inputs_key not in self.header.tensors:
            read_tensor(self.header, inputs_key, option="--inputs-key")  # raises, listing the keys present
        info = self.header.tensors[inputs_key]
        if not info.shape:
            raise DataError(f"{self.path}: '{inputs_key}' is a scalar; expected inputs [N, ...] with one row per "
                            "sample")
        self.shape = tuple(info.shape)
        self.dtype = info.dtype
        if self.num_samples < 1:
            raise DataError(f"{self.path}: '{inputs_key}' holds no samples (shape {list(self.shape)})")

    @property
    def num_samples(self) -> int:
        return int(self.shape[0])

    def describe(self) -> str:
        dtype = SAFETENSORS_DTYPES.get(self.dtype, self.dtype)
        return f"{self.path} '{self.key}' {list(self.shape)} {dtype}"

    def labels(self, key: str = "labels", *, optional: bool = False) -> torch.Tensor | None:
        """Integer labels ``[N]`` (``[N, 1]`` is accepted); None when absent and ``optional``."""
        if key not in self.header.tensors and optional:
            return None
        labels = read_tensor(self.header, key, option="--labels-key")
        if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
            raise DataError(f"{self.path}: '{key}' has dtype {str(labels.dtype).removeprefix('torch.')}; "
                            "expected an integer dtype")
        if labels.dim() == 2 and labels.shape[1] == 1:
            labels = labels[:, 0]
        if labels.dim() != 1:
            raise DataError(f"{self.path}: '{key}' has shape {list(labels.shape)}; expected [N]")
        if labels.shape[0] != self.num_samples:
            raise DataError(f"{self.path}: '{key}' has {labels.shape[0]} rows but '{self.key}' has {self.num_samples}")
        return labels.to(torch.int64)

    def batches(self, batch_size: int) -> Iterator[tuple[int, int, torch.Tensor]]:
        """``(start, stop, inputs[start:stop])`` read slice by slice from the file."""
        from safetensors import safe_open

        try:
            with safe_open(str(self.path), framework="pt") as f:
                rows = f.get_slice(self.key)
                for start in range(0, self.num_samples, batch_size):
                    stop = min(start + batch_size, self.num_samples)
                    yield start, stop, rows[start:stop]
        except Exception as exc:  # whatever the reader makes of a damaged file: one line
            raise TempcalError(f"{self.path}: cannot read tensor '{self.key}': {_error_line(exc)}") from None
        check_unchanged(self.path, self.header.stamp, since="tempcal read its header")


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise TempcalError(f"--batch-size must be a whole number >= 1, got {batch_size}")


# -- running a model --------------------------------------------------------------------------
def select_output(out: Any, output_key: OutputKey, name: str = "the model") -> torch.Tensor:
    """The logits among a model's outputs: the output itself, ``out[index]`` of a tuple, ``out[key]`` of a dict."""
    if isinstance(out, torch.Tensor):
        if output_key is not None:
            raise TempcalError(f"--output-key {output_key}: {name} returns a single tensor; drop --output-key")
        return out
    if isinstance(out, (tuple, list)):
        n = len(out)
        kind = f"a {type(out).__name__} of {n} outputs"
        if output_key is None:
            raise TempcalError(f"{name} returns {kind}; choose the logits with --output-key 0..{n - 1}")
        index = _as_index(output_key)
        if index is None or not -n <= index < n:
            raise TempcalError(f"--output-key {output_key}: {name} returns {kind}; expected an index 0..{n - 1}")
        return _as_logits_tensor(out[index], f"{name} output {index}")
    if isinstance(out, dict):
        keys = ", ".join(shown(k) for k in list(out)[:20]) + (" ..." if len(out) > 20 else "")
        if output_key is None:
            raise TempcalError(f"{name} returns a dict with keys {keys}; choose the logits with --output-key NAME")
        for candidate in (output_key, str(output_key), _as_index(output_key)):
            if candidate is not None and candidate in out:
                return _as_logits_tensor(out[candidate], f"{name} output {shown(candidate)}")
        raise TempcalError(f"--output-key {output_key}: {name} returns a dict with keys {keys}; no key "
                           f"{shown(output_key)}")
    raise TempcalError(f"{name} returns a {type(out).__name__}; expected logits as a tensor, or a tuple or dict "
                       "holding them")


def _as_index(key: OutputKey) -> int | None:
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    text = str(key).strip()
    return int(text) if text.lstrip("-").isdigit() else None


def _as_logits_tensor(value: Any, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TempcalError(f"{what} is a {type(value).__name__}, not a tensor of logits")
    return value


def _check_logits(z: torch.Tensor, rows: int, name: str, batch: int, classes: int | None) -> int:
    """Refuse outputs that are not ``[rows, C]`` float logits (``[rows]`` / ``[rows, 1]``: one binary logit)."""
    shape = list(z.shape)
    if not z.dtype.is_floating_point:
        raise DataError(f"{name} output has dtype {str(z.dtype).removeprefix('torch.')} on batch {batch}; "
                        "expected floating-point logits")
    width = 1 if z.dim() == 1 or (z.dim() == 2 and z.shape[1] == 1) else (z.shape[1] if z.dim() == 2 else -1)
    if z.dim() not in (1, 2) or z.shape[0] != rows or width == -1:
        raise DataError(f"{name} output has shape {shape} on batch {batch} of {rows} rows; expected logits "
                        f"[{rows}, C] (or [{rows}] for one binary logit)")
    if classes is not None and width != classes:
        raise DataError(f"{name} output has shape {shape} on batch {batch} but {classes} columns on batch 0")
    return width


@contextlib.contextmanager
def _progress_bar(progress: bool | Console, description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A transient rich bar on standard error (only when it is a terminal, or on the console given)."""
    if progress is False or progress is None:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = progress if isinstance(progress, Console) else Console(stderr=True)
    if not console.is_terminal:
        yield lambda n: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


def _call(net: torch.jit.ScriptModule, x: torch.Tensor, name: str, source: InputsFile, batch: int,
          start: int, stop: int) -> Any:
    """``net(x)``, with any failure turned into one line naming the batch, its rows and the inputs' shape."""
    try:
        return net(x)
    except Exception as exc:
        line = _error_line(exc)
        where = f"batch {batch} (rows {start}-{stop - 1} of {source.num_samples}, shape {list(x.shape)})"
        if "out of memory" in line.lower():
            raise TempcalError(f"{name}: out of memory on {where}; lower --batch-size") from None
        if batch == 0:
            raise TempcalError(f"{name} rejects the inputs {source.describe()} on {where}: {line}") from None
        raise TempcalError(f"{name} raised on {where} of {source.describe()}: {line}") from None


def run_model(model: torch.jit.ScriptModule | str | os.PathLike, inputs_path: str | os.PathLike, *,
              inputs_key: str = "inputs", labels_key: str = "labels", labels_optional: bool = False,
              batch_size: int = DEFAULT_BATCH_SIZE, device: str | torch.device = "auto",
              output_key: OutputKey = None, progress: bool | Console = True
              ) -> tuple[LogitsData, float | None]:
    """Run ``model`` over an inputs file in batches under ``torch.inference_mode``: ``(logits data, stored T)``.

    ``model`` is a loaded TorchScript module or its path. The stored T is that of a calibrated model
    (whose original's logits are returned, see the module notes), else None. Without labels (allowed
    when ``labels_optional``) each row's label is a placeholder: its arg-max (0 for one binary logit).
    """
    _check_batch_size(batch_size)
    target = resolve_device(device)
    if isinstance(model, (str, os.PathLike)):
        model = load_model(model, target)
    name = _name(model)
    source = InputsFile(inputs_path, inputs_key)
    labels = source.labels(labels_key, optional=labels_optional)
    stored = model_temperature(model)
    net = _unwrapped(model).to(target).eval()
    parts: list[torch.Tensor] = []
    classes = None
    with _progress_bar(progress, f"running {Path(name).name}", source.num_samples) as advance, \
            torch.inference_mode():
        for batch, (start, stop, x) in enumerate(source.batches(batch_size)):
            out = _call(net, x.to(target), name, source, batch, start, stop)
            z = select_output(out, output_key, name)
            classes = _check_logits(z, stop - start, name, batch, classes)
            parts.append(z.detach().to("cpu"))
            advance(stop - start)
    logits = torch.cat(parts)  # outside inference mode: a normal tensor, usable by autograd later
    if labels is None:
        labels = _placeholder_labels(logits)
    try:
        data = as_logits_data(logits, labels, logits_name=f"{name} output", labels_name=labels_key)
    except TempcalError as exc:
        raise type(exc)(f"{inputs_path}: {exc}") from None
    return data, stored


def _placeholder_labels(logits: torch.Tensor) -> torch.Tensor:
    """Each row's arg-max (a -inf logit is never taken for the true class), or 0 for one binary logit."""
    if logits.dim() == 1 or logits.shape[1] == 1:
        return torch.zeros(logits.shape[0], dtype=torch.int64)
    return logits.argmax(1)


@dataclass
class ModelSource(OpenedSource):
    """A model SOURCE run over an inputs file: the logits in memory, named ``MODEL on INPUTS`` (or ``label``).

    ``paths`` is empty: a model has no logits file to write T back into (``--save-model`` does that).
    """

    model_path: Path | None = None
    inputs_path: Path | None = None
    label: str | None = None

    @property
    def name(self) -> str:
        return self.label or f"{self.model_path} on {self.inputs_path}"


def open_model_source(model_path: str | os.PathLike, inputs_path: str | os.PathLike | None, *,
                      inputs_key: str = "inputs", labels_key: str = "labels", labels_optional: bool = False,
                      batch_size: int = DEFAULT_BATCH_SIZE, device: str | torch.device = "auto",
                      output_key: OutputKey = None, progress: bool | Console = True,
                      model: torch.jit.ScriptModule | None = None, label: str | None = None) -> ModelSource:
    """A model SOURCE run over its inputs, as the :class:`~tempcal.workflows.common.OpenedSource` the workflows take.

    ``model`` reuses an already loaded module (e.g. for ``--eval`` or ``--ood-inputs`` files); ``label``
    names it in reports (default ``MODEL on INPUTS``; an OOD side reads best as its inputs path).
    A missing ``--inputs`` is an error.
    """
    if inputs_path is None:
        raise TempcalError(f"{model_path}: a TorchScript model SOURCE needs its inputs: --inputs DATA.safetensors "
                           "(tensors 'inputs' and 'labels')")
    loaded = model if model is not None else load_model(model_path, device)
    data, stored = run_model(loaded, inputs_path, inputs_key=inputs_key, labels_key=labels_key,
                             labels_optional=labels_optional, batch_size=batch_size, device=device,
                             output_key=output_key, progress=progress)
    return ModelSource(paths=[], data=data, stored_temperature=stored, model_path=Path(model_path),
                       inputs_path=Path(inputs_path), label=label)


# -- writing ----------------------------------------------------------------------------------
def _write_atomic(path: str | os.PathLike, blob: bytes, what: str) -> Path:
    """Write ``blob`` over ``path`` atomically (links written through)."""
    from ..io.atomic import write_atomic

    return write_atomic(path, lambda f: f.write(blob), what=what)


def save_logits(data: LogitsData, path: str | os.PathLike, *, labels: bool = True,
                temperature: float | None = None, metadata: dict[str, str] | None = None) -> Path:
    """Write computed logits (and labels) as a safetensors logits file, atomically.

    ``labels=False`` leaves out placeholder labels (an OOD set without them); ``temperature`` is stored
    under ``tempcal.temperature`` like a write-back, so the file reads back as the SOURCE it came from.
    """
    from safetensors.torch import save

    tensors = {"logits": data.logits.detach().to("cpu").contiguous()}
    if labels:
        tensors["labels"] = data.labels.to("cpu", torch.int64).contiguous()
    meta = dict(metadata or {})
    if temperature is not None:
        value = float(temperature)
        if not (math.isfinite(value) and value > 0):
            raise TempcalError(f"--save-logits {path}: temperature {value} is not a positive number")
        meta[TEMPERATURE_KEY] = repr(value)
    blob = save(tensors, metadata=dict(sorted(meta.items())) or None)
    return _write_atomic(path, blob, "--save-logits")


class _Scaled(torch.nn.Module):
    """The original model with its logits divided by T."""

    def __init__(self, original: torch.nn.Module, temperature: torch.Tensor) -> None:
        super().__init__()
        self.original = original
        self.register_buffer(TEMPERATURE_BUFFER, temperature)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.original(x) / self.tempcal_temperature


class _ScaledDict(torch.nn.Module):
    """The original model with the logits entry ``key`` of its output dict divided by T (other entries as they are)."""

    __constants__ = ("key",)

    def __init__(self, original: torch.nn.Module, temperature: torch.Tensor, key: str) -> None:
        super().__init__()
        self.original = original
        self.register_buffer(TEMPERATURE_BUFFER, temperature)
        self.key = key

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.original(x).copy()
        out[self.key] = out[self.key] / self.tempcal_temperature
        return out


class _ScaledPair(torch.nn.Module):
    """The original model with output ``index`` of its 2-tensor tuple divided by T."""

    __constants__ = ("index",)

    def __init__(self, original: torch.nn.Module, temperature: torch.Tensor, index: int) -> None:
        super().__init__()
        self.original = original
        self.register_buffer(TEMPERATURE_BUFFER, temperature)
        self.index = index

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self.original(x)
        if self.index == 0:
            return a / self.tempcal_temperature, b
        return a, b / self.tempcal_temperature


class _ScaledTriple(torch.nn.Module):
    """The original model with output ``index`` of its 3-tensor tuple divided by T."""

    __constants__ = ("index",)

    def __init__(self, original: torch.nn.Module, temperature: torch.Tensor, index: int) -> None:
        super().__init__()
        self.original = original
        self.register_buffer(TEMPERATURE_BUFFER, temperature)
        self.index = index

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a, b, c = self.original(x)
        if self.index == 0:
            return a / self.tempcal_temperature, b, c
        if self.index == 1:
            return a, b / self.tempcal_temperature, c
        return a, b, c / self.tempcal_temperature


def _wrapper(original: torch.jit.ScriptModule, temperature: torch.Tensor, output_key: OutputKey,
             name: str) -> torch.nn.Module:
    """The wrapper that fits the original's forward signature (one tensor in; a tensor, dict or tuple out)."""
    try:
        schema = original._c._get_method("forward").schema
    except (AttributeError, RuntimeError):  # no readable signature: wrap as a tensor model, the check tells
        return _Scaled(original, temperature)
    arguments = [a for a in schema.arguments[1:] if not a.has_default_value()]
    if len(arguments) != 1 or str(arguments[0].type) != "Tensor":
        raise TempcalError(f"--save-model: {name} forward takes ({', '.join(str(a.type) for a in arguments)}); "
                           "tempcal wraps a model that takes one tensor")
    returns = schema.returns[0].type if len(schema.returns) == 1 else None
    kind = str(returns)
    if kind == "Tensor":
        if output_key is not None:
            raise TempcalError(f"--output-key {output_key}: {name} returns a single tensor; drop --output-key")
        return _Scaled(original, temperature)
    if isinstance(returns, torch.DictType) and str(returns.getKeyType()) == "str" \
            and str(returns.getValueType()) == "Tensor":
        if output_key is None:
            raise TempcalError(f"--save-model: {name} returns a dict; name the logits entry with --output-key NAME")
        return _ScaledDict(original, temperature, str(output_key))
    if isinstance(returns, torch.TupleType) and all(str(t) == "Tensor" for t in returns.elements()) \
            and len(returns.elements()) in (2, 3):
        n = len(returns.elements())
        index = None if output_key is None else _as_index(output_key)
        if index is None or not -n <= index < n:
            raise TempcalError(f"--save-model: {name} returns a tuple of {n} tensors; choose the logits with "
                               f"--output-key 0..{n - 1}")
        return (_ScaledPair if n == 2 else _ScaledTriple)(original, temperature, index % n)
    raise TempcalError(f"--save-model: {name} returns {kind}; tempcal wraps a model returning a tensor, a dict of "
                       "tensors or a tuple of 2 or 3 tensors")


def save_calibrated_model(model_path: str | os.PathLike, temperature: float, out_path: str | os.PathLike, *,
                          output_key: OutputKey = None, check_inputs: torch.Tensor | str | os.PathLike | None = None,
                          inputs_key: str = "inputs") -> Path:
    """Write, atomically, a TorchScript model whose logits are the original's divided by ``temperature``.

    T is a float64 buffer ``tempcal_temperature`` and the extra file ``tempcal.temperature`` (its repr).
    A calibrated model given as ``model_path`` is re-wrapped from its original, never wrapped twice.
    A model returning a dict or tuple keeps that structure; ``output_key`` names the entry divided.
    ``check_inputs`` (a tensor, or an inputs file whose first rows are used) is run through the saved
    bytes before they are written: outputs must be the original's divided by T, else nothing is written.
    The model is saved for CPU.
    """
    import io

    value = float(temperature)
    if not (math.isfinite(value) and value > 0):
        raise TempcalError(f"--save-model {out_path}: temperature {temperature} is not a positive number")
    model = load_model(model_path, "cpu")
    name = _name(model)
    original = _unwrapped(model)
    wrapper = _wrapper(original, torch.tensor(value, dtype=torch.float64), output_key, name)
    try:
        with _jit():
            scripted = torch.jit.script(wrapper)
    except Exception as exc:
        raise TempcalError(f"--save-model: cannot wrap {name}: {_error_line(exc)}") from None
    buffer = io.BytesIO()
    with _jit():
        torch.jit.save(scripted, buffer, _extra_files={TEMPERATURE_FILE: repr(value)})
    blob = buffer.getvalue()
    if check_inputs is not None:
        _check_saved(blob, original, value, check_inputs, inputs_key, output_key, name)
    return _write_atomic(out_path, blob, "--save-model")


#: Rows of ``check_inputs`` that :func:`save_calibrated_model` runs through the model it is about to write.
CHECK_ROWS = 16


def _check_saved(blob: bytes, original: torch.jit.ScriptModule, temperature: float,
                 inputs: torch.Tensor | str | os.PathLike, inputs_key: str, output_key: OutputKey, name: str) -> None:
    """Reload the saved bytes and compare their logits with the original's divided by T on a few inputs."""
    import io

    if not isinstance(inputs, torch.Tensor):
        inputs = next(InputsFile(inputs, inputs_key).batches(CHECK_ROWS))[2]
    x = inputs[:CHECK_ROWS]
    with _jit():
        reloaded = torch.jit.load(io.BytesIO(blob), map_location="cpu").eval()
    with torch.inference_mode():
        try:
            expected = select_output(original(x), output_key, name)
            got = select_output(reloaded(x), output_key, name)
        except TempcalError:
            raise
        except Exception as exc:
            raise TempcalError(f"--save-model: the calibrated {name} fails on {list(x.shape)} inputs: "
                               f"{_error_line(exc)}") from None
        want = expected.to(torch.float64) / temperature
        if got.shape != expected.shape or not torch.allclose(got.to(torch.float64), want, rtol=1e-5, atol=1e-6):
            raise TempcalError(f"--save-model: the calibrated {name} does not reproduce its logits divided by "
                               f"T = {temperature!r}; nothing written")


def strip_debug_info(blob: bytes) -> bytes:
    """A saved TorchScript archive without its ``.debug_pkl`` records (they hold source file paths).

    The model runs the same; error tracebacks show the serialized code only. Used for files that must be
    reproducible byte for byte wherever they are rebuilt, like the shipped example model.
    """
    import io

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


# -- ODIN -------------------------------------------------------------------------------------
def _two_class(z: torch.Tensor) -> torch.Tensor:
    """One binary logit ``[N]`` / ``[N, 1]`` as the two-class row ``[0, z]`` (same softmax as the sigmoid)."""
    if z.dim() == 2 and z.shape[1] == 1:
        z = z[:, 0]
    return torch.stack([torch.zeros_like(z), z], dim=1) if z.dim() == 1 else z


def _odin_batch(net: torch.jit.ScriptModule, x: torch.Tensor, tau: float, eps: float, output_key: OutputKey,
                name: str) -> torch.Tensor:
    """ODIN scores of one batch: max softmax at ``tau`` after one signed-gradient step of size ``eps``."""
    with torch.inference_mode(False), torch.enable_grad():
        x = x.detach().clone().requires_grad_(True)
        z = _two_class(select_output(net(x), output_key, name))
        log_msp = torch.log_softmax(z.to(torch.float64) / tau, dim=1).max(dim=1).values
        (grad,) = torch.autograd.grad(log_msp.sum(), x)
    # Liang et al. (2018): x' = x - eps * sign(-grad_x log S_max(x; tau)), i.e. a step up the max log-softmax.
    perturbed = x.detach() - eps * torch.sign(-grad)
    with torch.inference_mode():
        z = _two_class(select_output(net(perturbed), output_key, name))
        return torch.softmax(z.to(torch.float64) / tau, dim=1).max(dim=1).values.cpu()


def _odin_checks(tau: float, eps: float) -> None:
    if not (math.isfinite(tau) and tau > 0):
        raise TempcalError(f"--tau {tau}: ODIN needs a temperature > 0")
    if not (math.isfinite(eps) and eps >= 0):
        raise TempcalError(f"--odin-eps {eps}: expected a number >= 0")


Batches = Callable[[], Iterator[tuple[int, int, torch.Tensor]]]


def _input_batches(inputs: torch.Tensor | str | os.PathLike, inputs_key: str, batch_size: int
                   ) -> tuple[int, str, Batches]:
    """(rows, description, a function giving fresh batches) for a tensor or an inputs file."""
    if isinstance(inputs, torch.Tensor):
        if inputs.dim() < 1 or inputs.shape[0] < 1:
            raise DataError(f"ODIN inputs of shape {list(inputs.shape)} hold no samples")
        rows = int(inputs.shape[0])

        def batches() -> Iterator[tuple[int, int, torch.Tensor]]:
            for start in range(0, rows, batch_size):
                yield start, min(start + batch_size, rows), inputs[start : start + batch_size]

        return rows, f"inputs {list(inputs.shape)} {str(inputs.dtype).removeprefix('torch.')}", batches
    source = InputsFile(inputs, inputs_key)
    return source.num_samples, source.describe(), lambda: source.batches(batch_size)


def odin_scores(model: torch.jit.ScriptModule | str | os.PathLike, inputs: torch.Tensor | str | os.PathLike, *,
                tau: float, eps: float, batch_size: int = DEFAULT_BATCH_SIZE, device: str | torch.device = "auto",
                inputs_key: str = "inputs", output_key: OutputKey = None, progress: bool | Console = False
                ) -> torch.Tensor:
    """Per-sample ODIN scores (float64 ``[N]``, higher = more in-distribution; Liang et al. 2018).

    Each input is moved by ``eps`` against the sign of the gradient of ``-log max softmax(f(x) / tau)``
    (so the max softmax rises, more for in-distribution inputs), and scored by ``max softmax(f(x') / tau)``.
    Needs autograd through the model and floating-point inputs. ``eps = 0`` is the plain MSP at ``tau``.
    A calibrated model is run through its original, like :func:`run_model` (tau applies to the raw logits).
    """
    _check_batch_size(batch_size)
    _odin_checks(float(tau), float(eps))
    target = resolve_device(device)
    if isinstance(model, (str, os.PathLike)):
        model = load_model(model, target)
    name = _name(model)
    net = _unwrapped(model).to(target).eval()
    rows, what, batches = _input_batches(inputs, inputs_key, batch_size)
    parts = []
    with _progress_bar(progress, f"ODIN {Path(name).name} tau={tau:g}", rows) as advance:
        for batch, (start, stop, x) in enumerate(batches()):
            if not x.dtype.is_floating_point:
                raise DataError(f"ODIN perturbs the inputs, so they must be floating point; {what} is not")
            try:
                parts.append(_odin_batch(net, x.to(target), float(tau), float(eps), output_key, name))
            except TempcalError:
                raise
            except Exception as exc:
                raise TempcalError(f"{name}: ODIN failed on batch {batch} (rows {start}-{stop - 1} of {rows}, "
                                   f"shape {list(x.shape)}) of {what}: {_error_line(exc)}") from None
            advance(stop - start)
    scores = torch.cat(parts)
    if not bool(torch.isfinite(scores).all()):
        first = int((~torch.isfinite(scores)).nonzero()[0, 0])
        raise DataError(f"{name}: ODIN score is not finite for {what} row {first} (NaN or inf in the outputs)")
    return scores


def odin_ood(model_path: str | os.PathLike, id_inputs: str | os.PathLike, ood_inputs: Sequence[str | os.PathLike],
             *, eps: float, taus: Sequence[str | float] | None = None, inputs_key: str = "inputs",
             batch_size: int = DEFAULT_BATCH_SIZE, device: str | torch.device = "auto",
             output_key: OutputKey = None, progress: bool | Console = True) -> OodReport:
    """``tempcal ood MODEL --inputs ID --ood-inputs OOD --odin-eps E``: ODIN scores at each tau, as an OodReport.

    Rows have score ``msp`` (the max softmax of the perturbed inputs); ``taus`` as for ``ood`` (numbers or
    ``fitted`` = a calibrated model's T; default sweep). ``passes`` counts model passes (each a forward,
    backward and forward over one file at one tau).
    """
    from ..workflows.ood import OodMetrics, OodReport, best_sentence, detection_metrics, resolve_taus

    if not ood_inputs:
        raise TempcalError("no OOD inputs: give at least one with --ood-inputs FILE")
    _odin_checks(1.0, float(eps))
    target = resolve_device(device)
    model = load_model(model_path, target)
    stored = model_temperature(model)
    tau_list = resolve_taus(taus, stored, model_path)
    source, paths = f"{model_path} on {id_inputs}", [str(p) for p in ood_inputs]
    for k, path in enumerate(paths):
        if path in paths[:k]:
            raise TempcalError(f"--ood-inputs {path}: given twice")
    sides = [InputsFile(p, inputs_key) for p in (id_inputs, *paths)]  # every file checked before any model run
    options: dict[str, Any] = {"eps": eps, "batch_size": batch_size, "device": target, "inputs_key": inputs_key,
                               "output_key": output_key, "progress": progress}
    scores = [[odin_scores(model, side.path, tau=tau, **options).numpy() for tau in tau_list] for side in sides]
    id_scores, ood_scores = scores[0], scores[1:]
    results: list[tuple[str, OodMetrics]] = []
    best = []
    for path, other in zip(paths, ood_scores, strict=True):
        rows = [detection_metrics(id_scores[k], other[k], tau=tau, score="msp") for k, tau in enumerate(tau_list)]
        results.extend((path, m) for m in rows)
        best.append(best_sentence(source, path, "msp", rows, stored))
    with torch.inference_mode():
        probe = select_output(_unwrapped(model)(next(sides[0].batches(1))[2].to(target)), output_key, source)
    binary = probe.dim() == 1 or probe.shape[1] == 1
    width = 2 if binary else int(probe.shape[1])
    return OodReport(
        source=source, ood_files=paths, num_classes=width, binary=binary, n_id=sides[0].num_samples,
        n_ood=[s.num_samples for s in sides[1:]], stored_temperature=stored, taus=tau_list,
        taus_from="--tau" if taus else "default sweep", scores=["msp"], results=results, best=best,
        device=str(target), passes=len(tau_list) * len(sides), warnings=[], id_scores={"msp": id_scores},
        ood_scores=[{"msp": s} for s in ood_scores])


__all__ = [
    "DEFAULT_BATCH_SIZE",
    "MODEL_SUFFIXES",
    "TEMPERATURE_BUFFER",
    "TEMPERATURE_FILE",
    "InputsFile",
    "ModelSource",
    "is_model_path",
    "load_model",
    "model_temperature",
    "odin_ood",
    "odin_scores",
    "open_model_source",
    "read_model_temperature",
    "run_model",
    "save_calibrated_model",
    "save_logits",
    "select_output",
    "strip_debug_info",
]
