"""Writing what a model SOURCE gives: its logits as a logits file, and the model calibrated in the format the output's
suffix names (TorchScript here, as a wrapper), written only once the saved bytes reproduce the logits divided by T.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import TempcalError, param
from ..io.paths import write_bytes_atomic
from ..validation import TEMPERATURE_KEY, as_temperature, format_temperature
from . import torchscript
from .base import TEMPERATURE_BUFFER, LoadedModel, OutputKey, error_line, load_model, runtime
from .detect import save_format
from .run import InputsFile, as_index, select_output

if TYPE_CHECKING:
    from ..core.data import LogitsData

#: Rows of the inputs that :func:`save_calibrated_model` runs through the model it is about to write.
CHECK_ROWS = 16


def save_logits(data: LogitsData, path: str | os.PathLike, *, labels: bool = True,
                temperature: float | None = None, metadata: dict[str, str] | None = None) -> Path:
    """Write computed logits (and labels, unless ``labels=False``) as a safetensors logits file, atomically;
    ``temperature`` is stored as a write-back stores it, so the file reads back as the SOURCE it came from."""
    from safetensors.torch import save

    tensors = {"logits": data.logits.detach().to("cpu").contiguous()}
    if labels:
        tensors["labels"] = data.labels.to("cpu", torch.int64).contiguous()
    meta = dict(metadata or {})
    if temperature is not None:
        meta[TEMPERATURE_KEY] = format_temperature(as_temperature(temperature))
    blob = save(tensors, metadata=dict(sorted(meta.items())) or None)
    return write_bytes_atomic(path, blob, what=param("save_logits"))


class Calibrated(torch.nn.Module):
    """The original model with its logits divided by T; subclasses override ``forward`` for other output shapes."""

    __constants__ = ("index", "key")

    def __init__(self, original: torch.nn.Module, temperature: torch.Tensor, index: int = 0, key: str = "") -> None:
        super().__init__()
        self.original = original  # ORIGINAL: loaders find the original under this name
        self.register_buffer(TEMPERATURE_BUFFER, temperature)
        self.index = index
        self.key = key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.original(x) / self.tempcal_temperature  # type: ignore[operator]


class CalibratedDict(Calibrated):
    """Entry ``key`` of the original's output dict divided by T (other entries as they are)."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        out = self.original(x).copy()  # type: ignore[operator]
        out[self.key] = out[self.key] / self.tempcal_temperature
        return out


class CalibratedPair(Calibrated):
    """Output ``index`` of the original's 2-tensor tuple divided by T."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        a, b = self.original(x)  # type: ignore[operator]
        if self.index == 0:
            return a / self.tempcal_temperature, b
        return a, b / self.tempcal_temperature


class CalibratedTriple(Calibrated):
    """Output ``index`` of the original's 3-tensor tuple divided by T."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # type: ignore[override]
        a, b, c = self.original(x)  # type: ignore[operator]
        if self.index == 0:
            return a / self.tempcal_temperature, b, c
        if self.index == 1:
            return a, b / self.tempcal_temperature, c
        return a, b, c / self.tempcal_temperature


def calibrated_wrapper(original: torch.nn.Module, temperature: float, output_key: OutputKey,
                       name: str) -> Calibrated:
    """The wrapper that fits the original's forward signature (one tensor in; a tensor, dict or tuple out)."""
    t = torch.tensor(temperature, dtype=torch.float64)
    flag = param("output_key")
    schema = torchscript.forward_schema(original)
    if schema is None:  # no readable signature: wrap as a tensor model, the check tells
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
        return CalibratedDict(original, t, key=str(output_key))
    if isinstance(returns, torch.TupleType) and all(str(e) == "Tensor" for e in returns.elements()) \
            and len(returns.elements()) in (2, 3):
        n = len(returns.elements())
        index = None if output_key is None else as_index(output_key)
        if index is None or not -n <= index < n:
            raise TempcalError(f"{name} returns a tuple of {n} tensors; choose the logits with {flag} 0..{n - 1}")
        return (CalibratedPair if n == 2 else CalibratedTriple)(original, t, index=index % n)
    raise TempcalError(f"{name} returns {kind}; tempcal wraps a model returning a tensor, a dict of "
                       "tensors or a tuple of 2 or 3 tensors")


def save_calibrated_model(model_path: str | os.PathLike, temperature: float, out_path: str | os.PathLike, *,
                          output_key: OutputKey = None, check_inputs: torch.Tensor | str | os.PathLike | None = None,
                          inputs_key: str = "inputs") -> Path:
    """Write, atomically, a model whose logits are the original's divided by ``temperature``, for the CPU.

    The format follows ``out_path``'s suffix (:func:`tempcal.models.detect.save_format`). ``check_inputs`` (a
    tensor, or an inputs file whose first rows are used; a ``.pt2`` needs them) run through the saved model: its
    outputs must be the original's divided by T, else nothing is written.
    """
    prefix = f"{param('save_model')} {out_path}: "
    try:
        value = as_temperature(temperature)
        wanted = save_format(model_path, out_path)
        model = load_model(model_path, "cpu")
        rows = None if check_inputs is None else _first_rows(check_inputs, inputs_key)
        if wanted != "torchscript":
            return runtime(wanted).save_calibrated(model, value, out_path, output_key=output_key, check_inputs=rows)
        wrapper = calibrated_wrapper(model.net, value, output_key, model.name)
        blob = torchscript.script_and_save(wrapper, value, model.name)
        if rows is not None:
            _check_saved(torchscript.load_bytes(blob), model, value, rows, output_key)
        return write_bytes_atomic(out_path, blob, what=param("save_model"))
    except TempcalError as exc:  # one prefix: errors of the write itself already name the option and path
        raise (exc if exc.raw.startswith(prefix) else exc.prefixed(prefix)) from None


def _first_rows(inputs: torch.Tensor | str | os.PathLike, inputs_key: str) -> torch.Tensor:
    """The first :data:`CHECK_ROWS` rows of a tensor or an inputs file."""
    if not isinstance(inputs, torch.Tensor):
        inputs = next(InputsFile(inputs, inputs_key).batches(CHECK_ROWS))[2]
    return inputs[:CHECK_ROWS]


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


__all__ = ["Calibrated", "save_calibrated_model", "save_logits"]
