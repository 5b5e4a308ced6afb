"""``.pt`` / ``.pth`` files holding a dict of tensors as SOURCE (T in a sidecar).

Read by ``torch.load(weights_only=True)`` only: a file holding other Python objects is refused,
never unpickled. TorchScript archives with these suffixes are models (:mod:`tempcal.sources.model`).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TempcalError, param
from ..models.detect import archive_kind
from .base import OpenedSource, SourceOptions
from .memory import PICKLE_MAGIC, ZIP_MAGIC, InMemoryKind, checked_path, first_line, in_memory_source, magic, missing
from .torch_pickle import check_storages

if TYPE_CHECKING:
    import numpy as np
    import torch

_Read = tuple[tuple[str, ...], "torch.Tensor", "torch.Tensor | None", str]


class TorchDictKind(InMemoryKind):
    name = "pt"
    title = "torch.save dict of tensors"
    suffixes = (".pt", ".pth")
    remembered = ("probs", "logits_key", "labels_key")  # kept in the sidecar beside T

    def open(self, paths: list[Path], options: SourceOptions, *, labels_optional: bool = False) -> OpenedSource:
        path = checked_path(paths[0])
        _, logits, labels, labels_name = _read_pt(path, options.logits_key, options.labels_key, not labels_optional)
        return in_memory_source(self, path, logits, labels, options, logits_name=options.logits_key,
                                labels_name=labels_name)

    def describe_tensors(self, paths: list[Path], options: SourceOptions) -> list[dict[str, Any]]:
        """Every entry of the dict: tensors with their shapes, anything else by its type."""
        import torch

        from .described import tensor_entry

        path, entries = paths[0], []
        for name, value in load_pt_dict(path).items():
            if isinstance(value, torch.Tensor):
                entries.append(tensor_entry(path, str(name), value.shape, str(value.dtype).removeprefix("torch."),
                                            options))
            else:
                entries.append({**tensor_entry(path, str(name), None, type(value).__name__, options), "role": None})
        return entries

    def group_values(self, opened: OpenedSource, key: str, option: str) -> np.ndarray:
        """The tensor ``key``, checked against the labels' shape."""
        from .grouping import checked, labels_shape

        path = opened.paths[0]
        values = read_pt_tensor(path, key, option)
        shape = labels_shape(lambda name, said: read_pt_tensor(path, name, said), opened.options.labels_key)
        return checked(path, key, values, shape, option)


def _read_pt(path: Path, logits_key: str, labels_key: str, labels_required: bool) -> _Read:
    loaded = load_pt_dict(path)
    keys = tuple(str(k) for k in loaded)
    if logits_key not in loaded:
        raise missing(path, "tensor", logits_key, keys, param("logits_key"))
    if labels_key not in loaded and labels_required:
        raise missing(path, "tensor", labels_key, keys, param("labels_key"))
    logits = _pt_member(loaded[logits_key], path, logits_key)
    labels = _pt_member(loaded[labels_key], path, labels_key) if labels_key in loaded else None
    return keys, logits, labels, labels_key


def read_pt_tensor(path: Path, key: str, option: str) -> torch.Tensor:
    """One tensor of a ``.pt`` dict; a missing one names the keys present and ``option``."""
    loaded = load_pt_dict(path)
    if key not in loaded:
        raise missing(path, "tensor", key, tuple(str(k) for k in loaded), option)
    return _pt_member(loaded[key], path, key)


def load_pt_dict(path: Path) -> Mapping:
    """A ``torch.save`` dict, read with ``weights_only=True`` after its declared storage sizes are checked
    (tensors memory-mapped where the format allows)."""
    import pickle

    import torch

    checked_path(path)

    head = magic(path)
    zipped = head.startswith(ZIP_MAGIC)
    if not zipped and not head.startswith(PICKLE_MAGIC):
        raise TempcalError(f"{path}: not a torch.save file (neither a zip archive nor a pickle at its start)")
    if zipped and archive_kind(path) == "torchscript":
        raise TempcalError(f"{path}: is a TorchScript model, not a dict of tensors; pass a model with "
                           f"{param('inputs')} DATA.safetensors, or save its logits with "
                           "torch.save({'logits': ..., 'labels': ...}, PATH)")
    check_storages(path, zipped)  # the sizes the pickle declares, bounded before torch allocates or maps them
    try:
        # weights_only=True: tensors, numbers, strings and containers only; never arbitrary objects.
        with warnings.catch_warnings():  # damaged files make torch warn before failing; the error says it all
            warnings.simplefilter("ignore")
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=zipped)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        found = re.search(r"GLOBAL (\S+)", text)
        if found is None:
            detail = text.split("WeightsUnpickler error:", 1)[-1].strip().splitlines()
            reason = detail[0] if "WeightsUnpickler error:" in text and detail else first_line(exc)
            raise TempcalError(f"{path}: not a readable torch.save file of tensors ({reason}); tempcal reads .pt "
                               "files with torch.load(weights_only=True) only") from None
        hint = " (numpy arrays: save torch tensors or an .npz instead)" if "numpy" in found.group(1) else ""
        raise TempcalError(f"{path}: refused: it needs the Python object {found.group(1)}{hint}; tempcal reads .pt "
                           "files with torch.load(weights_only=True) only and never unpickles arbitrary objects"
                           ) from None
    except Exception as exc:  # the weights-only unpickler fails on damaged files with assorted exceptions
        raise TempcalError(f"{path}: not a readable torch.save file ({type(exc).__name__}: "
                           f"{first_line(exc)})") from None
    if not isinstance(loaded, Mapping):
        raise TempcalError(f"{path}: holds a {type(loaded).__name__}, not a dict of tensors "
                           "(save it with torch.save({'logits': ..., 'labels': ...}, PATH))")
    return loaded


def _pt_member(value: object, path: Path, key: str) -> torch.Tensor:
    import torch

    if not isinstance(value, torch.Tensor):
        raise TempcalError(f"{path}: '{key}' is a {type(value).__name__}, not a tensor")
    if value.layout != torch.strided:
        value = value.to_dense()
    return value
