"""Full float32 on CUDA while tempcal runs a model or an output head: TF32 off for matmuls, convolutions and RNNs.

TF32 rounds float32 products to 10-bit mantissas, moving T by about 1e-3 relative from a CPU run. :func:`no_tf32`
turns it off for its duration (unless ``TEMPCAL_ALLOW_TF32=1``) and restores every setting. torch 2.9's
per-backend ``fp32_precision`` settings and the older ``allow_tf32`` flags must agree, so both are set and restored.
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
    matmul = _read(torch.get_float32_matmul_precision)
    cudnn = _read(lambda: torch.backends.cudnn.allow_tf32)
    new = [(owner, owner.fp32_precision) for owner in _new_settings()]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for owner, _ in new:
        if owner is not getattr(getattr(torch.backends, "mkldnn", None), "matmul", None):
            owner.fp32_precision = "ieee"
    try:
        yield
    finally:
        if matmul is not None:
            torch.set_float32_matmul_precision(matmul)
        if cudnn is not None:
            torch.backends.cudnn.allow_tf32 = cudnn
        for owner, value in new:
            owner.fp32_precision = value


def _new_settings() -> list[Any]:
    """The backends with a ``fp32_precision`` setting in this torch (none before torch 2.9)."""
    owners = [torch.backends.cuda.matmul, getattr(torch.backends.cudnn, "conv", None),
              getattr(torch.backends.cudnn, "rnn", None), getattr(getattr(torch.backends, "mkldnn", None), "matmul",
                                                                  None)]
    return [owner for owner in owners if owner is not None and hasattr(owner, "fp32_precision")]


def _read(get: Any) -> Any:
    try:
        return get()
    except RuntimeError:  # torch refuses to read an old-style flag that disagrees with the new settings
        return None


__all__ = ["ALLOW_TF32_ENV", "no_tf32", "tf32_allowed"]
