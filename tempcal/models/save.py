"""Writing what a model SOURCE gives: its logits as a logits file, and the model calibrated in the format the output's
suffix names (by that format's module), written only once the saved bytes reproduce the logits divided by T.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import TEMPERATURE_KEY, TempcalError, as_temperature, format_temperature, param
from ..io.paths import write_bytes_atomic
from .base import OutputKey, load_model, runtime
from .detect import save_format
from .run import InputsFile

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


def save_calibrated_model(model_path: str | os.PathLike, temperature: float, out_path: str | os.PathLike, *,
                          output_key: OutputKey = None, check_inputs: torch.Tensor | str | os.PathLike | None = None,
                          inputs_key: str = "inputs") -> Path:
    """Write, atomically, a model (in the format ``out_path``'s suffix names) whose logits are the original's divided
    by ``temperature``, for the CPU, once the saved model reproduces them on ``check_inputs`` (a tensor, or an inputs
    file's first rows; a ``.pt2`` needs them)."""
    prefix = f"{param('save_model')} {out_path}: "
    try:
        value = as_temperature(temperature)
        wanted = save_format(model_path, out_path)
        model = load_model(model_path, "cpu")
        if check_inputs is not None and not isinstance(check_inputs, torch.Tensor):
            check_inputs = next(InputsFile(check_inputs, inputs_key).batches(CHECK_ROWS))[2]
        rows = None if check_inputs is None else check_inputs[:CHECK_ROWS]
        return runtime(wanted).save_calibrated(model, value, out_path, output_key=output_key, check_inputs=rows)
    except TempcalError as exc:  # one prefix: errors of the write itself already name the option and path
        raise (exc if exc.raw.startswith(prefix) else exc.prefixed(prefix)) from None


__all__ = ["save_calibrated_model", "save_logits"]
