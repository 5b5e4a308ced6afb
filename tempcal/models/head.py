"""A language model's output layer (a safetensors file or a Hugging Face model folder: docs/language-models.md) and
the logits it gives for a block of hidden states, in float32 (float64 for float64 states) without TF32, tile by tile.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.parallel import BLOCKS_PER_THREAD, block_bounds, map_blocks
from ..core.precision import no_tf32
from ..errors import DataError, TempcalError, param, positive_number, shown
from ..io.hf_folder import CONFIG_NAME, MAX_CONFIG_BYTES, SINGLE_NAME, checkpoint_file, read_json, weight_map
from ..io.safetensors_header import FLOAT_DTYPES, dtype_name, read_header, read_tensor

#: Vocabulary rows widened to the compute dtype at a time (a bounded block however large V is).
TILE_ELEMENTS = 1 << 22
#: Suffixes of input embeddings that tied checkpoints reuse as their output layer.
TIED_EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight")


@dataclass
class OutputHead:
    """``z = softcap(scale * (h W^T + b))``: the weight ``[V, d]`` in its stored dtype, and what follows it."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    scale: float = 1.0
    softcap: float | None = None
    name: str = "HEAD"

    @property
    def vocab(self) -> int:
        return int(self.weight.shape[0])

    @property
    def width(self) -> int:
        return int(self.weight.shape[1])

    def to(self, device: torch.device) -> OutputHead:
        """The head on ``device`` (the weight keeps its dtype)."""
        bias = None if self.bias is None else self.bias.to(device)
        return OutputHead(self.weight.to(device), bias, self.scale, self.softcap, self.name)

    def logits(self, h: torch.Tensor, out: torch.Tensor, threads: int = 1) -> torch.Tensor:
        """The logits of hidden states ``h`` [rows, d] into ``out`` [rows, V] (the compute dtype), tile by tile, the
        tiles shared among ``threads`` threads each running torch single-threaded (:mod:`tempcal.core.parallel`)."""
        h = h.to(out.dtype)
        tile = max(1, TILE_ELEMENTS // max(self.width, 1))
        if threads > 1:
            tile = min(tile, max(1, -(-self.vocab // (BLOCKS_PER_THREAD * threads))))
        tiles = block_bounds(self.vocab, tile)
        with no_tf32():  # entered once: the setting is process-wide
            map_blocks(lambda i, _: self._tile(h, out, *tiles[i]), len(tiles), threads)
        return out

    def _tile(self, h: torch.Tensor, out: torch.Tensor, start: int, stop: int) -> None:
        """Columns ``start:stop`` of the logits: the weight's rows widened, then what follows the matmul."""
        dtype = out.dtype
        z = out[:, start:stop]
        torch.matmul(h, self.weight[start:stop].to(dtype).T, out=z)
        if self.bias is not None:
            z.add_(self.bias[start:stop].to(dtype))
        if self.scale != 1.0:
            z.mul_(self.scale)
        if self.softcap is not None:
            z.div_(self.softcap).tanh_().mul_(self.softcap)


def load_head(path: str | os.PathLike, *, weight_key: str = "weight", bias_key: str = "bias",
              softcap: float | None = None) -> OutputHead:
    """The output layer in ``path`` (a safetensors file or a Hugging Face model folder), checked; ``softcap``
    (``--softcap``) replaces the configuration's ``final_logit_softcapping``."""
    path = Path(path)
    head = _from_folder(path) if path.is_dir() else _from_file(path, weight_key, bias_key)
    if softcap is not None:
        value = positive_number(softcap)
        if value is None:
            raise TempcalError(f"{param('softcap')} {softcap}: expected a number > 0")
        head.softcap = value
    return checked_head(head, "lm_head.bias" if path.is_dir() else bias_key)


def _from_file(path: Path, weight_key: str, bias_key: str) -> OutputHead:
    header = read_header(path)
    weight = _weight(header, weight_key, param("head_weight_key"))
    bias = read_tensor(header, bias_key, option=param("head_bias_key")) if bias_key in header.tensors else None
    return OutputHead(weight, bias, name=str(path))


def _from_folder(folder: Path) -> OutputHead:
    """A Hugging Face checkpoint: the output weight (or the tied embedding), its bias, and the config's scales."""
    config_path = folder / CONFIG_NAME
    if not os.path.lexists(config_path):
        raise TempcalError(f"{folder}: no config.json; a HEAD folder is a Hugging Face model folder "
                           "(config.json and model.safetensors)")
    config = read_json(folder, CONFIG_NAME, MAX_CONFIG_BYTES)
    if not isinstance(config, dict):
        raise TempcalError(f"{config_path}: not a JSON object")
    files = _weight_files(folder)
    key = _output_key(files, config, folder)
    weight = _weight(read_header(checkpoint_file(folder, files[key])), key, param("head_weight_key"))
    bias_key = key[: -len("weight")] + "bias" if key.endswith("lm_head.weight") else None
    bias = (read_tensor(read_header(checkpoint_file(folder, files[bias_key])), bias_key, option="bias")
            if bias_key in files else None)
    scale, softcap = config_scales(config, config_path)
    return OutputHead(weight, bias, scale, softcap, name=f"{folder} ({key})")


def config_scales(config: dict, config_path: Path) -> tuple[float, float | None]:
    """What a checkpoint's ``config.json`` does to the logits after ``h W^T + b``: the scale (``logit_scale``
    times, divided by ``logits_scaling``) and the soft cap ``final_logit_softcapping`` (None: no cap)."""
    text_config = config.get("text_config")  # multimodal checkpoints keep the language model's settings here
    settings = {**(text_config if isinstance(text_config, dict) else {}),
                **{k: v for k, v in config.items() if k != "text_config"}}
    scale = _config_number(settings, "logit_scale", config_path) or 1.0
    scale /= _config_number(settings, "logits_scaling", config_path) or 1.0
    return scale, _config_number(settings, "final_logit_softcapping", config_path)


def checked_head(head: OutputHead, bias_name: str = "bias") -> OutputHead:
    """``head`` after the checks every head passes: its shapes, then finite weight, bias and scale (a NaN or inf
    would make every logit it touches meaningless: refused, naming the row)."""
    if head.weight.dim() != 2 or head.weight.shape[0] < 2:
        raise DataError(f"{head.name}: the weight has shape {list(head.weight.shape)}; expected [V, d] with V >= 2")
    if head.bias is not None and (not head.bias.dtype.is_floating_point or list(head.bias.shape) != [head.vocab]):
        raise DataError(f"{head.name}: '{bias_name}' has shape {list(head.bias.shape)} "
                        f"({str(head.bias.dtype).removeprefix('torch.')}); expected float [{head.vocab}]")
    tile = max(1, TILE_ELEMENTS // max(head.width, 1))
    for start in range(0, head.vocab, tile):
        block = head.weight[start : start + tile]
        bad = ~torch.isfinite(block).all(1)
        if bool(bad.any()):
            row = start + int(bad.nonzero()[0, 0])
            raise DataError(f"{head.name}: the weight holds NaN or inf (vocabulary row {row})")
    if head.bias is not None and not bool(torch.isfinite(head.bias).all()):
        row = int((~torch.isfinite(head.bias)).nonzero()[0, 0])
        raise DataError(f"{head.name}: the bias holds NaN or inf (entry {row})")
    if not math.isfinite(head.scale):
        raise DataError(f"{head.name}: the logit scale is not finite")
    return head


def _weight_files(folder: Path) -> dict[str, str]:
    """Every tensor name of the checkpoint and the name of the file in ``folder`` holding it."""
    sharded = weight_map(folder)
    if sharded is not None:
        return sharded
    if os.path.lexists(folder / SINGLE_NAME):
        return dict.fromkeys(read_header(checkpoint_file(folder, SINGLE_NAME)).tensors, SINGLE_NAME)
    raise TempcalError(f"{folder}: no model.safetensors or model.safetensors.index.json (tempcal reads "
                       "safetensors checkpoints; save with save_pretrained(..., safe_serialization=True))")


def _output_key(files: dict[str, str], config: dict, folder: Path) -> str:
    """The output layer's weight: ``lm_head.weight``, GPT-NeoX's ``embed_out.weight``, or the tied embedding."""
    for suffix in ("lm_head.weight", "embed_out.weight"):
        found = [k for k in files if k == suffix or k.endswith("." + suffix)]
        if len(found) == 1:
            return found[0]
    tied = [k for k in files if any(k == s or k.endswith("." + s) for s in TIED_EMBEDDINGS)]
    if len(tied) == 1 and config.get("tie_word_embeddings", True) is not False:
        return tied[0]
    present = ", ".join(shown(k) for k in list(files)[:12]) + (" ..." if len(files) > 12 else "")
    raise TempcalError(f"{folder}: no output layer (lm_head.weight, or a tied input embedding "
                       f"{'/'.join(TIED_EMBEDDINGS)}) among the checkpoint's tensors: {present}")


def _weight(header, key: str, option: str) -> torch.Tensor:
    if key in header.tensors and header.tensors[key].dtype not in FLOAT_DTYPES:
        raise DataError(f"{header.path}: '{key}' has dtype {dtype_name(header.tensors[key].dtype)}; expected a "
                        "float dtype")
    return read_tensor(header, key, option=option)


def _config_number(config: dict, key: str, where: Path) -> float | None:
    value = config.get(key)
    if value is None:
        return None
    number = positive_number(value) if not isinstance(value, bool) else None
    if number is None:
        raise TempcalError(f"{where}: '{key}' is {shown(value)}, not a positive number")
    return number


__all__ = ["OutputHead", "checked_head", "config_scales", "load_head"]
