"""ONNX models (``pip install 'tempcal[onnx]'``): the checked model's bytes run by onnxruntime, and written
calibrated (``Div(logits, T)`` appended; both models run before anything is written; external data to ``OUT.data``).
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..core.parallel import resolve_device
from ..core.precision import tf32_allowed
from ..errors import TempcalError, param
from ..io.paths import atomic_path, write_bytes_atomic
from .base import LoadedModel, OutputKey, error_line, is_out_of_memory
from .onnx_graph import OnnxInfo, add_division, all_tensors, import_onnx, inspect_onnx, strip_calibration
from .run import selected_position

if TYPE_CHECKING:
    import onnx
    import onnxruntime

#: Session option that makes onnxruntime resolve external data of a model given as bytes in this folder.
_EXTERNAL_FOLDER_OPTION = "session.model_external_initializers_file_folder_path"
#: Alignment of tensors in a written external-data file (lets runtimes memory-map them).
_ALIGN = 4096
_NUMPY_OF_ORT = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
                 "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16,
                 "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


class OnnxNet:
    """A checked ONNX model in an onnxruntime session, called like a torch model: ``net(x)`` gives its outputs."""

    def __init__(self, session: onnxruntime.InferenceSession) -> None:
        self.session = session
        self.input = session.get_inputs()[0]
        self.outputs = tuple(o.name for o in session.get_outputs())
        self._tensor = tuple(str(o.type).startswith("tensor(") for o in session.get_outputs())

    def __call__(self, x: torch.Tensor | np.ndarray) -> Any:
        """The model's outputs for batch ``x``: the only output as a tensor, else a dict by output name."""
        array = as_array(x, self.input)
        try:
            values = self.session.run(None, {self.input.name: array})
        except Exception as exc:
            if is_out_of_memory(exc):
                raise MemoryError(f"out of memory ({ort_line(exc)})") from None
            raise RuntimeError(ort_line(exc)) from None
        outputs = [torch.from_numpy(np.ascontiguousarray(v)) if tensor and isinstance(v, np.ndarray) else v
                   for v, tensor in zip(values, self._tensor, strict=True)]
        if len(outputs) == 1 and isinstance(outputs[0], torch.Tensor):
            return outputs[0]
        return dict(zip(self.outputs, outputs, strict=True))


def as_array(x: torch.Tensor | np.ndarray, spec: Any) -> np.ndarray:
    """A batch as a numpy array of the dtype and rank the model's input declares (checked, never cast)."""
    wanted = _NUMPY_OF_ORT.get(spec.type)
    if isinstance(x, torch.Tensor):
        have = str(x.dtype).removeprefix("torch.")
        if wanted is not None and have != np.dtype(wanted).name:
            raise ValueError(f"input {spec.name!r} takes {np.dtype(wanted).name}, not {have}")
        x = x.detach().cpu().numpy()
    array = np.asarray(x)
    if wanted is not None and array.dtype != wanted:
        raise ValueError(f"input {spec.name!r} takes {np.dtype(wanted).name}, not {array.dtype.name}")
    shape = spec.shape
    if shape is not None and (len(shape) != array.ndim or any(
            isinstance(d, int) and d != n for d, n in zip(shape, array.shape, strict=True))):
        declared = [d if isinstance(d, int) else "?" for d in shape]
        raise ValueError(f"input {spec.name!r} has shape {declared}, not {list(array.shape)}")
    return np.ascontiguousarray(array)


def ort_line(exc: BaseException) -> str:
    """onnxruntime's message in one line, without its ``[ONNXRuntimeError] : 1 : FAIL :`` prefix."""
    return re.sub(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*", "", error_line(exc, last=False))


# -- loading --------------------------------------------------------------------------------------
def load(path: str | os.PathLike, device: str | torch.device = "auto") -> LoadedModel:
    """A checked ONNX model in an onnxruntime session (a calibrated one without its division), and its T."""
    path = Path(path)
    providers = _providers(device)
    info, model = _original(path)
    session = session_for(model, info.folder, str(path), providers)
    return LoadedModel(path, "onnx", OnnxNet(session), info.temperature, torch.device("cpu"))


def _original(path: str | os.PathLike) -> tuple[OnnxInfo, onnx.ModelProto]:
    """The checked model at ``path`` (one input, as tempcal feeds), and the original: without tempcal's division."""
    info = inspect_onnx(path)
    if len(info.inputs) != 1:
        names = ", ".join(repr(n) for n in info.inputs[:10])
        raise TempcalError(f"{info.path} takes {len(info.inputs)} inputs ({names}); tempcal feeds one tensor "
                           f"(the inputs file's {param('inputs_key')})")
    if info.temperature is None:
        return info, info.model
    original = copy.deepcopy(info.model)
    strip_calibration(original)
    return info, original


def _providers(device: str | torch.device) -> list[Any]:
    """onnxruntime's execution providers for ``device``: CUDA (without TF32 unless ``TEMPCAL_ALLOW_TF32=1``) when
    asked for and available."""
    ort = import_onnx("onnxruntime")
    target = resolve_device(device)
    if target.type != "cuda":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        options = {"device_id": target.index or 0, "use_tf32": int(tf32_allowed())}
        return [("CUDAExecutionProvider", options), "CPUExecutionProvider"]
    if str(device) == "auto":
        return ["CPUExecutionProvider"]
    raise TempcalError(f"{param('device')} {device}: this onnxruntime runs ONNX models on the CPU only (install "
                       "onnxruntime-gpu for CUDA), use cpu")


def session_for(model: onnx.ModelProto, folder: Path, label: str,
                providers: list[Any] | None = None) -> onnxruntime.InferenceSession:
    """A session for the checked ``model`` (given as bytes; external data resolved in ``folder``)."""
    ort = import_onnx("onnxruntime")
    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: its logs (errors too) go straight to the terminal, bypassing tempcal
    options.add_session_config_entry(_EXTERNAL_FOLDER_OPTION, str(folder))
    try:
        return ort.InferenceSession(model.SerializeToString(), options,
                                    providers=providers or ["CPUExecutionProvider"])
    except Exception as exc:
        if is_out_of_memory(exc):
            raise TempcalError(f"{label}: out of memory while loading the model") from None
        raise TempcalError(f"{label}: not a runnable ONNX model ({ort_line(exc)})") from None


# -- writing a calibrated model ---------------------------------------------------------------------
def save_calibrated(model: LoadedModel, temperature: float, out_path: str | os.PathLike, *,
                    output_key: OutputKey = None, check_inputs: torch.Tensor | None = None) -> Path:
    """Write, atomically, ``model``'s file with its chosen output divided by ``temperature``, after running it
    against the original on ``check_inputs`` (else on seeded inputs of the declared type)."""
    info, original = _original(model.path)
    label = str(info.path)
    names = tuple(o.name for o in original.graph.output)
    outputs = dict.fromkeys(names, torch.empty(0))  # chosen as when the model runs as a SOURCE
    output = list(outputs)[selected_position(outputs if len(names) > 1 else torch.empty(0), output_key, label)]
    calibrated = copy.deepcopy(original)
    add_division(calibrated, output, temperature, label)
    _check_calibrated(original, calibrated, info, output, temperature, check_inputs)
    out = Path(out_path)
    with contextlib.ExitStack() as data_file:  # external data, if any, is renamed after the model
        if info.external:
            data_path = out.parent / (out.name + ".data")
            tensors = [t for _, t in all_tensors(calibrated) if t.data_location == import_onnx().TensorProto.EXTERNAL]
            with open(data_file.enter_context(atomic_path(data_path, what=param("save_model"))), "wb") as f:
                _copy_external(tensors, info.folder, data_path.name, f)
        write_bytes_atomic(out, calibrated.SerializeToString(), what=param("save_model"))
    return out


def _check_inputs_for(session: onnxruntime.InferenceSession, given: Any) -> np.ndarray:
    """``given`` as an array, or a seeded batch of 3 rows of the declared input type (dynamic dims of 32)."""
    spec = session.get_inputs()[0]
    if given is not None:
        try:
            return as_array(given, spec)
        except (ValueError, TypeError) as exc:
            raise TempcalError(f"cannot check the calibrated model on the inputs: {exc}") from None
    dtype = _NUMPY_OF_ORT.get(spec.type, np.float32)
    shape = [d if isinstance(d, int) and d > 0 else (3 if i == 0 else 32) for i, d in enumerate(spec.shape or [3])]
    if np.issubdtype(dtype, np.floating):
        return np.random.default_rng(0).standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


def _check_calibrated(original: onnx.ModelProto, calibrated: onnx.ModelProto, info: OnnxInfo, output: str,
                      temperature: float, check_inputs: Any) -> None:
    """Run both models: the chosen output must be the original's / T and every other output identical."""
    label = str(info.path)
    before = session_for(original, info.folder, label)
    after = session_for(calibrated, info.folder, f"the calibrated {label}")
    x = _check_inputs_for(before, check_inputs)
    feed = {before.get_inputs()[0].name: x}
    try:
        want = dict(zip([o.name for o in before.get_outputs()], before.run(None, feed), strict=True))
    except Exception as exc:
        raise TempcalError(f"cannot check the calibrated model: {label} fails on check inputs of shape "
                           f"{list(x.shape)} ({ort_line(exc)}); give check inputs") from None
    try:
        got = dict(zip([o.name for o in after.get_outputs()], after.run(None, feed), strict=True))
    except Exception as exc:
        raise TempcalError(f"the calibrated {label} fails to run ({ort_line(exc)}); nothing written") from None
    if list(got) != list(want):
        raise TempcalError(f"the calibrated {label} has outputs {list(got)} instead of {list(want)}")
    for name, expected in want.items():
        actual = np.asarray(got[name])
        expected = np.asarray(expected)
        if name == output:  # a floating-point output: add_division refuses any other
            expected = expected / np.asarray(temperature, dtype=expected.dtype)
            rtol = 2 * float(np.finfo(expected.dtype).eps)
            same = actual.shape == expected.shape and np.allclose(actual, expected, rtol=rtol, atol=0.0, equal_nan=True)
        else:
            same = np.array_equal(actual, expected, equal_nan=actual.dtype.kind == "f")
        if not same or actual.dtype != expected.dtype:
            what = "its logits divided by T" if name == output else f"output {name!r}"
            raise TempcalError(f"the calibrated {label} does not reproduce {what}; nothing written")


def _copy_external(tensors: list[onnx.TensorProto], folder: Path, data_name: str, f: Any) -> None:
    """Copy every external tensor into ``f`` (the file ``data_name`` beside the output) and point them at it."""
    position = 0
    for tensor in tensors:
        entries = {e.key: e.value for e in tensor.external_data}
        source = Path(os.path.realpath(folder / entries["location"]))  # checked by inspect_onnx
        offset = int(entries.get("offset", "0"))
        length = int(entries["length"]) if "length" in entries else source.stat().st_size - offset
        padding = -position % _ALIGN
        f.write(b"\0" * padding)
        position += padding
        with open(source, "rb") as src:
            src.seek(offset)
            left = length
            while left:  # 16 MiB blocks; a short file is a one-line error, not a short tensor
                block = src.read(min(left, 1 << 24))
                if not block:
                    raise TempcalError(f"external data file {source.name} ended early; damaged")
                f.write(block)
                left -= len(block)
        del tensor.external_data[:]
        for key, text in (("location", data_name), ("offset", str(position)), ("length", str(length))):
            tensor.external_data.add(key=key, value=text)
        position += length


__all__ = ["load", "save_calibrated"]
