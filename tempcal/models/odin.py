"""ODIN scores (Liang et al., ICLR 2018): ``max softmax(f(x') / tau)`` after a step of ``eps`` up the gradient of
the max log-softmax; it needs autograd (a ``.pt2`` or TorchScript model); a calibrated model runs its original.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..core.precision import no_tf32
from ..errors import DataError, TempcalError, as_temperature, param, whole_number
from ..progress import Progress
from ..scores.engine import as_classes
from .base import DEFAULT_BATCH_SIZE, LoadedModel, OutputKey, error_line, load_model
from .run import InputsFile, bounded_batches, select_output

if TYPE_CHECKING:
    from rich.console import Console


#: What cuDNN says when asked for an RNN's backward pass outside training mode (ODIN runs models in eval mode).
CUDNN_RNN_EVAL_BACKWARD = "cudnn RNN backward can only be called in training mode"


@contextlib.contextmanager
def _cudnn_off(off: bool) -> Iterator[None]:
    """cuDNN disabled for the duration when ``off`` (only ``enabled``: ``cudnn.flags`` would reset TF32 too)."""
    before = torch.backends.cudnn.enabled
    torch.backends.cudnn.enabled = before and not off
    try:
        yield
    finally:
        torch.backends.cudnn.enabled = before


class _Odin:
    """ODIN on one model: ``scores(x)`` is max softmax at ``tau`` after one signed step of ``eps`` up the gradient of
    the max log-softmax, model in eval mode (after cuDNN refuses an RNN's backward in eval mode, cuDNN off)."""

    def __init__(self, net: torch.nn.Module, tau: float, eps: float, output_key: OutputKey, name: str):
        self.net, self.tau, self.eps, self.output_key, self.name = net, tau, eps, output_key, name
        self.without_cudnn = False

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        try:
            grad = self._gradient(x)
        except RuntimeError as exc:
            if self.without_cudnn or CUDNN_RNN_EVAL_BACKWARD not in str(exc):
                raise
            self.without_cudnn = True  # torch's own kernels: the same outputs
            grad = self._gradient(x)
        # x' = x - eps * sign(-grad_x log S_max(x; tau)), i.e. a step up the max log-softmax.
        perturbed = x.detach() - self.eps * torch.sign(-grad)
        with torch.inference_mode():
            return self._max_softmax(perturbed, torch.softmax).cpu()

    def _gradient(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(False), torch.enable_grad(), _cudnn_off(self.without_cudnn):
            x = x.detach().clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(self._max_softmax(x, torch.log_softmax).sum(), x)
        return grad

    def _max_softmax(self, x: torch.Tensor, softmax: Callable[..., torch.Tensor]) -> torch.Tensor:
        z = as_classes(select_output(self.net(x), self.output_key, self.name))
        return softmax(z.to(torch.float64) / self.tau, dim=1).max(dim=1).values


def check_eps(eps: float) -> float:
    """The ODIN step: a finite number >= 0."""
    value = float(eps)
    if not (math.isfinite(value) and value >= 0):
        raise TempcalError(f"{param('odin_eps')} {eps}: expected a number >= 0")
    return value


def _input_batches(inputs: torch.Tensor | str | os.PathLike, inputs_key: str, batch_size: int, device: torch.device
                   ) -> tuple[int, str, Iterator[tuple[int, int, torch.Tensor]]]:
    """(rows, description, the batches) for a tensor or an inputs file."""
    if isinstance(inputs, torch.Tensor):
        if inputs.dim() < 1 or inputs.shape[0] < 1:
            raise DataError(f"ODIN inputs of shape {list(inputs.shape)} hold no samples")
        rows = int(inputs.shape[0])
        return rows, f"inputs {list(inputs.shape)} {str(inputs.dtype).removeprefix('torch.')}", (
            (start, min(start + batch_size, rows), inputs[start:start + batch_size])
            for start in range(0, rows, batch_size))
    source = InputsFile(inputs, inputs_key)
    return source.num_samples, source.describe(), source.batches(bounded_batches(batch_size, source, device))


def odin_scores(model: LoadedModel | str | os.PathLike, inputs: torch.Tensor | str | os.PathLike, *,
                tau: float, eps: float, batch_size: int = DEFAULT_BATCH_SIZE, device: str | torch.device = "auto",
                inputs_key: str = "inputs", output_key: OutputKey = None, progress: bool | Console = False
                ) -> torch.Tensor:
    """Per-sample ODIN scores (float64 ``[N]``, higher = more in-distribution) of ``inputs`` at ``tau``."""
    whole_number(batch_size, param("batch_size"))
    tau = as_temperature(tau, f"{param('tau')} (ODIN)")
    eps = check_eps(eps)
    if not isinstance(model, LoadedModel):
        model = load_model(model, device)
    net, name = model.net, model.name
    if model.format == "onnx":
        raise TempcalError(f"{param('odin_eps')}: ODIN steps along the gradient of the model's outputs, which "
                           f"onnxruntime does not give; {name} is an ONNX model: score it without "
                           f"{param('odin_eps')}, or use its .pt2 or TorchScript export")
    rows, what, batches = _input_batches(inputs, inputs_key, batch_size, model.device)
    parts = []
    odin = _Odin(net, tau, eps, output_key, name)
    with Progress(f"ODIN {Path(name).name} tau={tau:g}", enabled=progress, delay=0.0, total=rows,
                  unit="rows") as bar, no_tf32():
        for batch, (start, stop, x) in enumerate(batches):
            if not x.dtype.is_floating_point:
                raise DataError(f"ODIN perturbs the inputs, so they must be floating point; {what} is not")
            try:
                parts.append(odin.scores(x.to(model.device)))
            except TempcalError:
                raise
            except Exception as exc:
                raise TempcalError(f"{name}: ODIN failed on batch {batch} (rows {start}-{stop - 1} of {rows}, "
                                   f"shape {list(x.shape)}) of {what}: {error_line(exc)}") from None
            bar.advance(stop - start)
    scores = torch.cat(parts)
    if not bool(torch.isfinite(scores).all()):
        first = int((~torch.isfinite(scores)).nonzero()[0, 0])
        raise DataError(f"{name}: ODIN score is not finite for {what} row {first} (NaN or inf in the outputs)")
    return scores


__all__ = ["check_eps", "odin_scores"]
