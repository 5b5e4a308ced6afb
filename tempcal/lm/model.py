"""A Hugging Face causal language model loaded from a local folder (``--lm MODEL``), checked first: nothing is
downloaded, unpickled or run from the folder (docs/language-models.md); its own output layer is the head.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.limits import shown_bytes
from ..core.parallel import resolve_device
from ..core.precision import no_tf32
from ..errors import TempcalError, param
from ..io.hf_folder import (
    CONFIG_NAME,
    INDEX_NAME,
    MAX_CONFIG_BYTES,
    SINGLE_NAME,
    check_model_folder,
    checkpoint_file,
    read_json,
    weight_map,
)
from ..io.optional import require
from ..models.base import error_line, quiet, reraise_control
from ..models.head import OutputHead, checked_head, config_scales
from .checks import check_config_json, check_weights, checkpoint_tensors, offline, remote_code_message

#: Files of a model folder a loader may read: each is checked (a regular file, links kept inside) first.
READ_SUFFIXES = (".json", ".safetensors", ".model", ".txt", ".jinja", ".tiktoken", ".spm")
#: The small JSON files beside a model that its loaders read whole: bounded as config.json is, and checked by tempcal.
SMALL_JSON = ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json", "added_tokens.json",
              "preprocessor_config.json", "processor_config.json")
#: The largest other side file a loader may read (tokenizer.json, vocabularies; the largest are tens of MB).
MAX_SIDE_FILE_BYTES = 256 << 20
#: Files one of which a tokenizer needs.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
#: ``config.json`` keys that give the most positions a model takes, in the order they are asked.
LIMIT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")
#: Tokens of the probe that compares the head with the model's own logits.
PROBE_TOKENS = 16
#: The largest difference allowed between the head's logits and the model's, relative to the largest logit:
#: rounding, not a missing scale or cap (16-bit models round each logit to 3 significant digits).
PROBE_TOLERANCE = {"16-bit": 5e-2, "other": 1e-3}


@dataclass
class CausalLM:
    """A loaded causal LM: the model, its base (token ids -> final hidden states), tokenizer and output head."""

    folder: Path
    model: Any
    base: Any
    tokenizer: Any
    head: OutputHead
    limit: int | None  # the most positions the model takes (None: unknown)
    input_device: torch.device  # where token ids go (the input embedding's device)
    dtype: torch.dtype
    device_map: str | None = None
    probe_difference: float | None = None
    load_seconds: float = 0.0


def load_causal_lm(folder: str | os.PathLike, device: str | torch.device = "auto", *,
                   device_map: str | None = None) -> CausalLM:
    """The causal LM in ``folder`` on ``device`` (or placed by transformers' ``device_map``), checked."""
    began = time.perf_counter()
    folder = Path(folder)
    config_json, tensors = check_folder(folder)
    with offline():
        transformers = require("transformers", "lm", needed_for=param("lm"))
        with _transformers_quiet(transformers):
            config = _config(transformers, folder)
            check_weights(transformers, config, tensors, folder)
            model = _model(transformers, folder, config, resolve_device(device), device_map)
            tokenizer = _tokenizer(transformers, folder)
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        raise TempcalError(f"{folder}: {type(model).__name__} has no base model to give the final hidden states")
    head = _head(model, folder, config_json)
    embedding = model.get_input_embeddings()
    input_device = embedding.weight.device if embedding is not None else next(model.parameters()).device
    return CausalLM(folder, model, base, tokenizer, head, _limit(config, tokenizer), input_device,
                    next(model.parameters()).dtype, device_map, load_seconds=time.perf_counter() - began)


def check_folder(folder: Path) -> tuple[dict, dict[str, tuple[int, ...]]]:
    """Refuse what is not a local model folder with safetensors weights, or that asks for remote code, hub kernels
    or oversized side files; the parsed ``config.json`` and the checkpoint's tensors (name -> shape)."""
    check_model_folder(folder, param("lm"))
    if not os.path.lexists(folder / CONFIG_NAME):
        raise TempcalError(f"{folder}: no config.json; {param('lm')} takes a Hugging Face model folder")
    config = read_json(folder, CONFIG_NAME, MAX_CONFIG_BYTES)
    if not isinstance(config, dict):
        raise TempcalError(f"{folder / CONFIG_NAME}: not a JSON object")
    check_config_json(config, folder / CONFIG_NAME)
    shards = weight_map(folder)
    if shards is None and not os.path.lexists(folder / SINGLE_NAME):
        raise TempcalError(f"{folder}: no {SINGLE_NAME} or {INDEX_NAME} (tempcal loads safetensors weights only; "
                           "save with save_pretrained(..., safe_serialization=True))")
    tensors = checkpoint_tensors(folder, shards, SINGLE_NAME)
    for entry in sorted(os.listdir(folder)):
        if entry.lower().endswith(READ_SUFFIXES) and not entry.startswith("."):
            _check_side_file(folder, entry)
    if not any((folder / name).exists() for name in TOKENIZER_FILES):
        raise TempcalError(f"{folder}: no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save it beside the model "
                           "with tokenizer.save_pretrained")
    return config, tensors


def _check_side_file(folder: Path, name: str) -> None:
    """A file a loader may read: inside the folder (:func:`checkpoint_file`), of a bounded size; the small JSON
    files (a tokenizer's configuration) read through the bounded reader and refused if they ask for remote code."""
    path = checkpoint_file(folder, name)
    if name.lower().endswith(".safetensors"):
        return
    size = path.stat().st_size
    limit = MAX_CONFIG_BYTES if name in SMALL_JSON else MAX_SIDE_FILE_BYTES
    if size > limit:
        raise TempcalError(f"{path}: {shown_bytes(size)}, more than the {shown_bytes(limit)} tempcal lets a "
                           "loader read from a model's side file")
    if name in SMALL_JSON:
        parsed = read_json(folder, name, limit)
        if isinstance(parsed, dict):
            check_config_json(parsed, path)


@contextlib.contextmanager
def _transformers_quiet(transformers: Any) -> Iterator[None]:
    """transformers' log records, warnings and progress bars silenced while it loads (restored afterwards)."""
    logging = transformers.utils.logging
    verbosity = logging.get_verbosity()
    bars = logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        with quiet():
            yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _config(transformers: Any, folder: Path) -> Any:
    """The model's configuration, which must be that of a causal LM transformers knows (no remote code)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        raise TempcalError(f"{folder / CONFIG_NAME}: transformers {transformers.__version__} cannot read it: "
                           f"{remote_code_message(error_line(exc, last=False))}") from None
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        kind = getattr(config, "model_type", None) or type(config).__name__
        raise TempcalError(f"{folder}: not a causal language model (model_type '{kind}' has no causal LM in "
                           f"transformers {transformers.__version__})")
    return config


def _model(transformers: Any, folder: Path, config: Any, device: torch.device, device_map: str | None) -> Any:
    """The model in its own dtype, in eval mode, on ``device`` (or placed by ``device_map``)."""
    from packaging.version import Version  # a dependency of transformers

    dtype_key = "dtype" if Version(transformers.__version__).release >= (4, 56) else "torch_dtype"
    kwargs: dict[str, Any] = {dtype_key: "auto", "local_files_only": True, "use_safetensors": True,
                              "trust_remote_code": False}
    if device_map is not None:
        kwargs["device_map"] = device_map
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, config=config, **kwargs)
        if device_map is None:
            model = model.to(device)
    except BaseException as exc:  # a Rust panic in a loader is a BaseException
        reraise_control(exc)
        line = remote_code_message(error_line(exc, last=False))
        if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
            weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
            line = f"out of memory ({shown_bytes(weights)} of weights)"
        raise TempcalError(f"{folder}: transformers {transformers.__version__} cannot load the model: {line}") from None
    return model.eval()


def _tokenizer(transformers: Any, folder: Path) -> Any:
    try:
        return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except BaseException as exc:  # the tokenizers library panics (a BaseException) on some hostile files
        reraise_control(exc)
        raise TempcalError(f"{folder}: transformers cannot load the tokenizer: "
                           f"{remote_code_message(error_line(exc, last=False))}") from None


def _head(model: Any, folder: Path, config_json: dict) -> OutputHead:
    """The model's own output layer (its weight as loaded, detached), with the configuration's scales and cap."""
    layer = model.get_output_embeddings()
    weight = getattr(layer, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise TempcalError(f"{folder}: {type(model).__name__} has no output layer with a [V, d] weight")
    bias = getattr(layer, "bias", None)
    bias = bias.detach() if isinstance(bias, torch.Tensor) else None
    scale, softcap = config_scales(config_json, folder / CONFIG_NAME)
    return checked_head(OutputHead(weight.detach(), bias, scale, softcap, name=f"{folder} (output layer)"))


def _limit(config: Any, tokenizer: Any) -> int | None:
    """The most positions the model takes: its configuration's limit, else the tokenizer's (if it states one)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in LIMIT_KEYS:
        value = getattr(text, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 1 < value < 10**7 else None


def max_length(lm: CausalLM, asked: int | None) -> int:
    """Tokens per text: ``--max-length`` (at most the model's limit), else the model's limit."""
    if asked is None:
        if lm.limit is None:
            raise TempcalError(f"{lm.folder}: the configuration states no limit on positions; give "
                               f"{param('max_length')} N")
        return lm.limit
    if asked < 2:
        raise TempcalError(f"{param('max_length')} {asked}: expected at least 2 tokens (one prediction needs two)")
    if lm.limit is not None and asked > lm.limit:
        raise TempcalError(f"{param('max_length')} {asked}: more than the {lm.limit} positions {lm.folder} takes")
    return asked


def final_hidden(lm: CausalLM, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The output layer's input ``[B, L, d]`` for token ids ``[B, L]`` (call under inference mode)."""
    out = lm.base(input_ids=ids, attention_mask=mask, use_cache=False, return_dict=True)
    hidden = getattr(out, "last_hidden_state", None)
    return hidden if isinstance(hidden, torch.Tensor) else out[0]


def check_head(lm: CausalLM, ids: list[int]) -> float:
    """Refuse the model unless its output head applied to its final hidden states gives its own logits, on the
    first tokens ``ids``; returns the largest difference relative to the largest logit."""
    ids = ids[:PROBE_TOKENS]
    x = torch.tensor([ids], dtype=torch.int64, device=lm.input_device)
    with torch.inference_mode(), no_tf32(), quiet():
        theirs = lm.model(input_ids=x, use_cache=False, return_dict=True).logits[0].float()
        hidden = final_hidden(lm, x, None)[0]
        head = lm.head.to(hidden.device)
        mine = head.logits(hidden, torch.empty(len(ids), head.vocab, device=hidden.device))
    theirs, mine = theirs.cpu(), mine.cpu()
    if theirs.shape != mine.shape:
        raise TempcalError(f"{lm.folder}: the model gives {list(theirs.shape)} logits for {len(ids)} tokens but its "
                           f"output layer maps to {head.vocab} classes")
    relative = float((theirs - mine).abs().max()) / max(1.0, float(theirs.abs().max()))
    tolerance = PROBE_TOLERANCE["16-bit" if lm.dtype.itemsize == 2 else "other"]
    if not relative <= tolerance:
        raise TempcalError(f"{lm.folder}: the model's logits are not its output layer applied to its final hidden "
                           f"states (relative difference {relative:.3g} on {len(ids)} tokens); tempcal knows an "
                           "lm_head or tied embedding followed by logit_scale, logits_scaling and "
                           "final_logit_softcapping, and this architecture does something else")
    lm.probe_difference = relative
    return relative


__all__ = ["CausalLM", "check_folder", "check_head", "final_hidden", "load_causal_lm", "max_length"]
