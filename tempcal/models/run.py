"""Running a loaded model over an inputs file (safetensors ``inputs`` ``[N, ...]`` read in row slices, optional
integer ``labels``) in batches, in eval semantics without TF32: its logits, checked batch by batch; a failure one line.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..core.limits import bounded_batch_size
from ..core.precision import no_tf32
from ..errors import DataError, TempcalError, check_labels, param, shown, whole_number
from ..io.safetensors_header import check_unchanged, dtype_name, read_header, read_tensor
from ..progress import Progress
from .base import DEFAULT_BATCH_SIZE, LoadedModel, OutputKey, error_line, is_out_of_memory

if TYPE_CHECKING:
    from rich.console import Console


class InputsFile:
    """A checked inputs file: the inputs tensor is read in row slices, the labels (if any) whole."""

    def __init__(self, path: str | os.PathLike, inputs_key: str = "inputs") -> None:
        self.path = Path(path)
        self.key = inputs_key
        self.header = read_header(self.path)
        if inputs_key not in self.header.tensors:
            read_tensor(self.header, inputs_key, option=param("inputs_key"))  # raises, listing the keys present
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
        return f"{self.path} '{self.key}' {list(self.shape)} {dtype_name(self.dtype)}"

    def labels(self, key: str = "labels", *, optional: bool = False) -> torch.Tensor | None:
        """Integer labels ``[N]`` (``[N, 1]`` is accepted); None when absent and ``optional``."""
        if key not in self.header.tensors and optional:
            return None
        labels = read_tensor(self.header, key, option=param("labels_key"))
        return check_labels(labels, (self.num_samples,), f"{self.path}: ", key, self.key)

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
            raise TempcalError(f"{self.path}: cannot read tensor '{self.key}': {error_line(exc)}") from None
        check_unchanged(self.path, self.header.stamp, since="tempcal read its header")


def select_output(out: Any, output_key: OutputKey, name: str = "the model") -> torch.Tensor:
    """The logits among a model's outputs: the output itself, ``out[index]`` of a tuple, ``out[key]`` of a dict."""
    flag = param("output_key")
    if isinstance(out, torch.Tensor):
        if output_key is not None:
            raise TempcalError(f"{flag} {output_key}: {name} returns a single tensor; drop {flag}")
        return out
    if isinstance(out, (tuple, list)):
        n = len(out)
        kind = f"a {type(out).__name__} of {n} outputs"
        if output_key is None:
            raise TempcalError(f"{name} returns {kind}; choose the logits with {flag} 0..{n - 1}")
        index = as_index(output_key)
        if index is None or not -n <= index < n:
            raise TempcalError(f"{flag} {output_key}: {name} returns {kind}; expected an index 0..{n - 1}")
        return _as_logits_tensor(out[index], f"{name} output {index}")
    if isinstance(out, dict):
        keys = ", ".join(shown(k) for k in list(out)[:20]) + (" ..." if len(out) > 20 else "")
        if output_key is None:
            raise TempcalError(f"{name} returns a dict with keys {keys}; choose the logits with {flag} NAME")
        for candidate in (output_key, str(output_key), as_index(output_key)):
            if candidate is not None and candidate in out:
                return _as_logits_tensor(out[candidate], f"{name} output {shown(candidate)}")
        raise TempcalError(f"{flag} {output_key}: {name} returns a dict with keys {keys}; no key "
                           f"{shown(output_key)}")
    raise TempcalError(f"{name} returns a {type(out).__name__}; expected logits as a tensor, or a tuple or dict "
                       "holding them")


def selected_position(out: Any, output_key: OutputKey, name: str) -> int:
    """Position, among ``out``'s flattened leaves, of the tensor :func:`select_output` chooses: its choice (and its
    errors) made on a distinct stand-in for each tensor."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten(out)
    stand_ins = [torch.empty(0) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    chosen = select_output(tree_unflatten(stand_ins, spec), output_key, name)
    return next(position for position, leaf in enumerate(stand_ins) if leaf is chosen)


def as_index(key: OutputKey) -> int | None:
    """An output key as a tuple index (an int, or a string of digits), else None."""
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
    width = z.shape[1] if z.dim() == 2 else 1
    if z.dim() not in (1, 2) or z.shape[0] != rows:
        raise DataError(f"{name} output has shape {shape} on batch {batch} of {rows} rows; expected logits "
                        f"[{rows}, C] (or [{rows}] for one binary logit)")
    if classes is not None and width != classes:
        raise DataError(f"{name} output has shape {shape} on batch {batch} but {classes} columns on batch 0")
    return width


def bounded_batches(batch_size: int, source: InputsFile, device: Any) -> int:
    """``batch_size`` cut to the rows of ``source``, refused when one batch of inputs would not fit on the host or
    on ``device``."""
    values = math.prod(source.shape[1:])
    batch_size = bounded_batch_size(batch_size, source.num_samples, values, "cpu")
    if torch.device(device).type == "cuda":
        bounded_batch_size(batch_size, source.num_samples, values, device)
    return batch_size


def _call(model: LoadedModel, x: torch.Tensor, source: InputsFile, batch: int, start: int, stop: int) -> Any:
    """``net(x)``, with any failure turned into one line naming the batch, its rows and the inputs' shape."""
    try:
        return model.net(x)
    except Exception as exc:
        line = error_line(exc)
        where = f"batch {batch} (rows {start}-{stop - 1} of {source.num_samples}, shape {list(x.shape)})"
        if is_out_of_memory(exc):
            raise TempcalError(f"{model.name}: out of memory on {where}; lower {param('batch_size')}") from None
        if batch == 0:
            raise TempcalError(f"{model.name} rejects the inputs {source.describe()} on {where}: {line}") from None
        raise TempcalError(f"{model.name} raised on {where} of {source.describe()}: {line}") from None


def run_model(model: LoadedModel, source: InputsFile, *, batch_size: int = DEFAULT_BATCH_SIZE,
              output_key: OutputKey = None, progress: bool | Console = True) -> torch.Tensor:
    """The model's logits over every row of ``source`` (on the CPU), run batch by batch under inference mode."""
    batch_size = whole_number(batch_size, param("batch_size"))
    lower, upper = getattr(model.net, "batch_limits", None) or (0, None)  # export.FittedBatches: a program's sizes
    batch_size = upper if lower == upper else min(batch_size, upper or batch_size)
    batch_size = bounded_batches(batch_size, source, model.device)
    parts: list[torch.Tensor] = []
    classes = None
    with Progress(f"running {Path(model.name).name}", enabled=progress, delay=0.0, total=source.num_samples,
                  unit="rows") as bar, torch.inference_mode(), no_tf32():
        for batch, (start, stop, x) in enumerate(source.batches(batch_size)):
            out = _call(model, x.to(model.device), source, batch, start, stop)
            z = select_output(out, output_key, model.name)
            classes = _check_logits(z, stop - start, model.name, batch, classes)
            parts.append(z.detach().to("cpu"))
            bar.advance(stop - start)
    return torch.cat(parts)  # outside inference mode: a normal tensor, usable by autograd later


def placeholder_labels(logits: torch.Tensor) -> torch.Tensor:
    """Each row's arg-max (a -inf logit is never taken for the true class), or 0 for one binary logit."""
    if logits.dim() == 1 or logits.shape[1] == 1:
        return torch.zeros(logits.shape[0], dtype=torch.int64)
    return logits.argmax(1)


__all__ = ["InputsFile", "as_index", "placeholder_labels", "run_model", "select_output", "selected_position"]
