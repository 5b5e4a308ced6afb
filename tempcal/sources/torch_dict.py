"""``.pt`` / ``.pth`` files holding a dict of tensors as SOURCE (T in a sidecar), read with
``torch.load(weights_only=True)`` only: other Python objects are refused, never unpickled."""

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
    import torch


class TorchDictKind(InMemoryKind):
    name = "pt"
    title = "torch.save dict of tensors"
    suffixes = (".pt", ".pth")
    remembered = ("probs", "logits_key", "labels_key")  # kept in the sidecar beside T

    def open(self, paths: list[Path], options: SourceOptions, *, labels_optional: bool = False) -> OpenedSource:
        path = checked_path(paths[0])
        loaded = load_pt_dict(path)
        logits = _pt_tensor(loaded, path, options.logits_key, param("logits_key"))
        has_labels = options.labels_key in loaded or not labels_optional
        labels = _pt_tensor(loaded, path, options.labels_key, param("labels_key")) if has_labels else None
        return in_memory_source(self, path, logits, labels, options, logits_name=options.logits_key,
                                labels_name=options.labels_key)

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

    def read_array(self, path: Path, key: str, option: str) -> torch.Tensor:
        return _pt_tensor(load_pt_dict(path), path, key, option)


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


def _pt_tensor(loaded: Mapping, path: Path, key: str, option: str) -> torch.Tensor:
    """The tensor ``key`` of a loaded dict (dense); a missing key names the keys present and ``option``."""
    import torch

    if key not in loaded:
        raise missing(path, "tensor", key, tuple(str(k) for k in loaded), option)
    value = loaded[key]
    if not isinstance(value, torch.Tensor):
        raise TempcalError(f"{path}: '{key}' is a {type(value).__name__}, not a tensor")
    return value if value.layout == torch.strided else value.to_dense()
