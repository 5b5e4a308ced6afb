"""What a model folder's files may ask of transformers, refused before it loads anything (docs/language-models.md):
remote code, hub kernels, pickled shards, oversized counts and weights the checkpoint lacks; loading runs offline.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import TempcalError, shown
from ..io.hf_folder import INDEX_NAME, checkpoint_file
from ..io.safetensors_header import read_header
from ..models.base import error_line

#: Keys of ``config.json`` or ``tokenizer_config.json`` that ask for code from the folder or the hub.
REMOTE_CODE_KEYS = ("auto_map", "trust_remote_code", "custom_pipelines")
#: The implementations transformers runs from its own code and torch's: anything else is a hub kernel (or a
#: flash-attention build that transformers fetches from the hub when it is not installed).
LOCAL_IMPLEMENTATIONS = {"attn_implementation": ("eager", "sdpa", "flex_attention"),
                         "experts_implementation": ("eager", "batched_mm", "grouped_mm")}
#: Largest counts of repeated modules a configuration may ask for: the largest released models have a few hundred
#: layers and experts; building 100,000 layers even on the meta device takes minutes.
MAX_COUNTS = {"num_hidden_layers": 1024, "n_layer": 1024, "num_layers": 1024, "n_layers": 1024,
              "num_local_experts": 4096, "num_experts": 4096, "n_routed_experts": 4096}
#: Nesting of sub-configurations searched (``text_config``, ``vision_config`` and theirs).
MAX_CONFIG_DEPTH = 4
#: Environment switches that keep huggingface_hub, transformers, datasets and ``kernels`` (through
#: huggingface_hub) from the network, and telemetry off.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1"}


def check_config_json(config: dict, where: Path) -> None:
    """Refuse remote code, hub kernels and oversized counts anywhere in ``config`` (sub-configurations included)."""
    for keys, value in _entries(config):
        key = keys[-1]
        named = f"{where}: '{'.'.join(keys)}'"
        if key in REMOTE_CODE_KEYS and value not in (None, False, {}, []):
            raise TempcalError(f"{named} asks for code from the model's folder or the hub; tempcal runs only the "
                               "architectures transformers itself holds, and never downloads or runs a folder's code")
        implementation = key.lstrip("_").removesuffix("_internal")
        if implementation in LOCAL_IMPLEMENTATIONS and value is not None:
            _check_implementation(named, implementation, value)
        if key in MAX_COUNTS and not isinstance(value, bool) and isinstance(value, int) and value > MAX_COUNTS[key]:
            raise TempcalError(f"{named} is {value}, more than the {MAX_COUNTS[key]} tempcal builds")


def _check_implementation(named: str, implementation: str, value: Any) -> None:
    local = LOCAL_IMPLEMENTATIONS[implementation]
    for part in value.values() if isinstance(value, dict) else [value]:
        if part is not None and part not in local:
            kind = "a hub kernel" if isinstance(part, str) and "/" in part else "not one transformers runs locally"
            raise TempcalError(f"{named} is {shown(part)}, {kind}; tempcal never downloads code (local ones: "
                               f"{', '.join(local)}): remove the key or set it to one of them")


def _entries(config: dict, keys: tuple[str, ...] = (), depth: int = 0) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every ``(key path, value)`` of ``config`` and of the objects nested in it, :data:`MAX_CONFIG_DEPTH` deep."""
    for key, value in config.items():
        yield (*keys, str(key)), value
        if isinstance(value, dict) and depth < MAX_CONFIG_DEPTH:
            yield from _entries(value, (*keys, str(key)), depth + 1)


def checkpoint_tensors(folder: Path, shards: dict[str, str] | None, single: str) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint and its shape, from the safetensors headers; a shard that is not a
    safetensors file (``.bin``, ``.pt``, ``.ckpt``: pickles) is refused before anything else reads it."""
    files = sorted(set(shards.values())) if shards else [single]
    tensors: dict[str, tuple[int, ...]] = {}
    for name in files:
        if not name.endswith(".safetensors"):
            raise TempcalError(f"{folder / INDEX_NAME}: names the shard {shown(name)}, not a .safetensors file; "
                               "tempcal loads safetensors weights only and never unpickles a checkpoint")
        header = read_header(checkpoint_file(folder, name))
        tensors.update({key: info.shape for key, info in header.tensors.items()})
    for key, name in (shards or {}).items():
        if key not in tensors:
            raise TempcalError(f"{folder / INDEX_NAME}: names {shown(key)} in {name}, which does not hold it")
    return tensors


def check_weights(transformers: Any, config: Any, tensors: dict[str, tuple[int, ...]], folder: Path) -> None:
    """Every weight the model ``config`` builds is in ``tensors`` (as transformers renames checkpoint keys), with
    its shape; else the first missing or mismatched one is named. The model is built on the meta device."""
    import torch

    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
    except Exception as exc:
        raise TempcalError(f"{folder}: transformers {transformers.__version__} cannot build the model its "
                           f"config.json describes: {error_line(exc, last=False)}") from None
    expected = dict(model.state_dict())
    found = _renamed(model, tensors, expected)
    buffers = {name for name, _ in model.named_buffers()}
    tied = _tied(model)
    ignored = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_missing", None) or []]
    for key, tensor in expected.items():
        if key in buffers or any(p.search(key) for p in ignored):
            continue
        if key in found:
            shape = found[key]
            if shape is not None and tuple(shape) != tuple(tensor.shape):
                raise TempcalError(f"{folder}: the checkpoint's {shown(key)} has shape {list(shape)} but config.json "
                                   f"asks for {list(tensor.shape)}")
        elif tied.get(key) not in found:
            raise TempcalError(f"{folder}: the checkpoint has no {shown(key)}, which config.json asks for "
                               f"({type(model).__name__}); tempcal does not fill missing weights at random")


def _renamed(model: Any, tensors: dict[str, tuple[int, ...]], expected: dict) -> dict[str, tuple[int, ...] | None]:
    """The model's names of the checkpoint's tensors (transformers' own renaming where it has one), with the shape
    when the tensor is loaded as it is (None: converted, such as experts fused into one tensor)."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    rename = _transformers_renaming(model, expected)
    found: dict[str, tuple[int, ...] | None] = {}
    for key, shape in tensors.items():
        name, converted = rename(key)
        if name not in expected and key in expected:
            name, converted = key, False
        if name not in expected and prefix:
            name = key.removeprefix(prefix + ".") if key.startswith(prefix + ".") else f"{prefix}.{key}"
        found[name] = None if converted else shape
    return found


def _transformers_renaming(model: Any, expected: dict) -> Any:
    """``key -> (name, converted)`` as transformers renames checkpoint keys when it loads (transformers 5); the
    identity where it has no such machinery."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        mapping = get_model_conversion_mapping(model)
        renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in mapping if isinstance(m, WeightConverter)]
    except Exception:  # an older transformers: keys load as they are
        return lambda key: (key, False)
    prefix = getattr(model, "base_model_prefix", None)

    def rename(key: str) -> tuple[str, bool]:
        name, pattern = rename_source_key(key, renamings, converters, prefix, expected)
        return name, pattern is not None

    return rename


def _tied(model: Any) -> dict[str, str]:
    """Each parameter that shares its tensor with another (tied embeddings), and a name of that other."""
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in first:
            tied[name] = first[id(parameter)]
            tied.setdefault(first[id(parameter)], name)
        else:
            first[id(parameter)] = name
    declared = getattr(model, "all_tied_weights_keys", None)  # transformers 5: {target: source}
    if isinstance(declared, dict):
        tied.update({str(k): str(v) for k, v in declared.items() if isinstance(v, str)})
    return tied


def remote_code_message(text: str) -> str:
    """A loader's message with its advice to run a folder's code (``trust_remote_code=True``) taken out."""
    if "trust_remote_code" not in text:
        return text
    return "it needs code that is not part of transformers (tempcal never runs a folder's or the hub's code)"


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """Every offline switch set while transformers loads: the environment (read by the libraries at import), and
    huggingface_hub's own flag when it was imported before; both restored afterwards."""
    saved = {key: os.environ.get(key) for key in OFFLINE_ENV}
    os.environ.update(OFFLINE_ENV)
    constants: Any = sys.modules.get("huggingface_hub.constants")
    was = getattr(constants, "HF_HUB_OFFLINE", None)
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        constants = sys.modules.get("huggingface_hub.constants")
        if constants is not None:
            flag = saved.get("HF_HUB_OFFLINE") or saved.get("TRANSFORMERS_OFFLINE") or ""
            constants.HF_HUB_OFFLINE = was if was is not None else flag.upper() in {"1", "ON", "YES", "TRUE"}


__all__ = ["check_config_json", "check_weights", "checkpoint_tensors", "offline", "remote_code_message"]
