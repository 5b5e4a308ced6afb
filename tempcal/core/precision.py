"""Full float32 on CUDA while tempcal runs a model or an output head: TF32 off for matmuls, convolutions and RNNs.

TF32 (the default for cuDNN convolutions, and for matmuls once a program asks for it) rounds float32
products to 10-bit mantissas: a model's logits, and so T, then differ from a CPU run by about 1e-3
relative. :func:`no_tf32` turns it off for its duration and puts every setting back afterwards; with
``TEMPCAL_ALLOW_TF32=1`` in the environment it leaves torch's settings as they are (faster on
Ampere and later GPUs, at that precision).

torch 2.9 added per-backend settings (``torch.backends.cuda.matmul.fp32_precision`` and
``torch.backends.cudnn.{conv,rnn}.fp32_precision``) beside the older ``allow_tf32`` flags and
``torch.set_float32_matmul_precision``; it refuses to read the older flags, or to run a matmul, once the
two disagree. So both are set, consistently, and both are restored, whichever a program used.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import TempcalError

#: The environment variable that lets model runs on CUDA use TF32 as torch's settings allow.
ALLOW_TF32_ENV = "TEMPCAL_ALLOW_TF32"


def tf32_allowed() -> bool:
    """Whether ``TEMPCAL_ALLOW_TF32`` asks to keep torch's TF32 settings (``1``) or not (``0``, unset: the default)."""
    text = os.environ.get(ALLOW_TF32_ENV, "").strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise TempcalError(f"{ALLOW_TF32_ENV}={text!r}: expected 1 (TF32 as torch's settings allow) or 0 (full float32, "
                       "the default)")


@contextlib.contextmanager
def no_tf32() -> Iterator[None]:
    """Full float32 matmuls, convolutions and RNNs on CUDA for the duration (unless ``TEMPCAL_ALLOW_TF32=1``)."""
    if tf32_allowed():
        yield
        return
    saved = _state()
    _full_float32()
    try:
        yield
    finally:
        _restore(saved)


def _new_settings() -> list[tuple[Any, str]]:
    """The per-backend ``fp32_precision`` settings this torch has (none before torch 2.9)."""
    owners = [torch.backends.cuda.matmul, getattr(torch.backends.cudnn, "conv", None),
              getattr(torch.backends.cudnn, "rnn", None), getattr(getattr(torch.backends, "mkldnn", None), "matmul",
                                                                  None)]
    return [(owner, "fp32_precision") for owner in owners if owner is not None and hasattr(owner, "fp32_precision")]


def _read(get: Any) -> Any:
    try:
        return get()
    except RuntimeError:  # torch refuses to read an old-style flag that disagrees with the new settings
        return None


def _state() -> dict[str, Any]:
    return {"matmul": _read(torch.get_float32_matmul_precision),
            "cudnn": _read(lambda: torch.backends.cudnn.allow_tf32),
            "new": [(owner, name, getattr(owner, name)) for owner, name in _new_settings()]}


def _full_float32() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for owner, name in _new_settings():
        if owner is not getattr(getattr(torch.backends, "mkldnn", None), "matmul", None):
            setattr(owner, name, "ieee")


def _restore(saved: dict[str, Any]) -> None:
    if saved["matmul"] is not None:
        torch.set_float32_matmul_precision(saved["matmul"])
    if saved["cudnn"] is not None:
        torch.backends.cudnn.allow_tf32 = saved["cudnn"]
    for owner, name, value in saved["new"]:
        setattr(owner, name, value)


__all__ = ["ALLOW_TF32_ENV", "no_tf32", "tf32_allowed"]
