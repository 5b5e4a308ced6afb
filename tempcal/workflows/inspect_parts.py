"""What ``tempcal inspect`` reads of a SOURCE, one part at a time: its tensors (from headers where the format has
them), a sample of its values, its labels, and the T stored with it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import TempcalError
from ..io.safetensors_header import dtype_name, read_header
from ..sources.base import SourceKind, SourceOptions
from ..sources.groups import GROUP_KEY, parse_stored_groups
from ..sources.groups import GROUP_TEMPERATURES as GROUP_TEMPERATURES_KEY
from ..validation import PROBS_KEY, TEMPERATURE_KEY, temperature_number, temperature_problem

#: The values are judged from at most this many of the first rows (the rest is not read) ...
SAMPLE_ROWS = 10_000
#: ... and at most this many values (a 128k vocabulary: 32 rows, 32 MB in float64).
SAMPLE_VALUES = 1 << 22
#: How far a row's sum (probabilities) or log-sum-exp (log-probabilities) may be from 1 or 0.
ROW_TOLERANCE = 1e-3
#: Where each kind keeps its T.
STORED_IN = {"safetensors": "metadata", "head": "metadata", "model": "model"}


def tensor_entry(file: Path | str, name: str, shape: Any, dtype: str, options: SourceOptions) -> dict[str, Any]:
    """One tensor as the report lists it, with the role the options give its name (logits, labels, hidden)."""
    roles = {options.logits_key: "logits", options.labels_key: "labels"}
    if options.head is not None:
        roles = {options.hidden_key: "hidden", options.labels_key: "labels"}
    return {"file": str(file), "name": name, "shape": None if shape is None else [int(n) for n in shape],
            "dtype": dtype, "role": roles.get(name)}


def tensors_of(kind: SourceKind, paths: list[Path], options: SourceOptions) -> list[dict[str, Any]]:
    """Every tensor (array) in SOURCE's files, from their headers where the format has them; none for a log."""
    if kind.name in ("safetensors", "head"):
        return [tensor_entry(path, name, info.shape, dtype_name(info.dtype), options)
                for path in paths for name, info in read_header(path).tensors.items()]
    if kind.name == "npz":
        from ..sources.numpy import npz_arrays

        return [tensor_entry(path, name, shape, dtype, options) for path in paths
                for name, (dtype, shape) in npz_arrays(path).items()]
    if kind.name == "npy":
        return _npy_pair(paths[0], options)
    if kind.name == "pt":
        return _pt_entries(paths[0], options)
    if kind.name == "model" and options.inputs is not None:
        header = read_header(options.inputs)
        renamed = options.but(logits_key=options.inputs_key)
        return [{**tensor_entry(options.inputs, name, info.shape, dtype_name(info.dtype), renamed),
                 "role": {options.inputs_key: "inputs", options.labels_key: "labels"}.get(name)}
                for name, info in header.tensors.items()]
    return []


def _npy_pair(path: Path, options: SourceOptions) -> list[dict[str, Any]]:
    from ..sources.numpy import npy_array, npy_labels_path

    dtype, shape = npy_array(path)
    entries = [{**tensor_entry(path, path.name, shape, dtype, options), "role": "logits"}]
    labels = npy_labels_path(path, options.logits_key, options.labels_key)
    if labels is not None and labels.is_file():
        dtype, shape = npy_array(labels)
        entries.append({**tensor_entry(labels, labels.name, shape, dtype, options), "role": "labels"})
    return entries


def _pt_entries(path: Path, options: SourceOptions) -> list[dict[str, Any]]:
    from ..sources.torch_dict import load_pt_dict

    entries = []
    for name, value in load_pt_dict(path).items():
        if isinstance(value, torch.Tensor):
            entries.append(tensor_entry(path, str(name), value.shape, str(value.dtype).removeprefix("torch."),
                                        options))
        else:
            entries.append({**tensor_entry(path, str(name), None, type(value).__name__, options), "role": None})
    return entries


def sample_values(data: Any) -> dict[str, Any]:
    """How the first rows' values look (at most :data:`SAMPLE_ROWS` rows, about :data:`SAMPLE_VALUES` values):
    probabilities (every row in [0, 1] summing to 1), log-probabilities (every row <= 0 with a log-sum-exp of 0),
    or logits; their range, and the NaN and infinite values among them."""
    rows = min(SAMPLE_ROWS, max(1, SAMPLE_VALUES // data.num_classes), data.num_samples)
    if rows < 1:
        return {"looks_like": None, "sampled_rows": 0, "total_rows": data.num_samples}
    z = next(iter(data.chunks(rows, torch.device("cpu"), torch.float64)))[1]
    if data.binary:
        z = z[:, 1:]  # the single logit (a chunk holds it as the row [0, z])
    nan, posinf, neginf = int(torch.isnan(z).sum()), int((z == math.inf).sum()), int((z == -math.inf).sum())
    finite = z[torch.isfinite(z)]
    looks = None if nan or posinf else _looks_like(z, data.binary)
    return {"looks_like": looks, "sampled_rows": int(z.shape[0]), "total_rows": data.num_samples,
            "min": float(finite.min()) if finite.numel() else None,
            "max": float(finite.max()) if finite.numel() else None, "nan": nan, "posinf": posinf, "neginf": neginf}


def _looks_like(z: torch.Tensor, binary: bool) -> str:
    if bool(((z >= 0) & (z <= 1)).all()) and (binary or bool(((z.sum(1) - 1).abs() <= ROW_TOLERANCE).all())):
        return "probabilities"
    if bool((z <= 0).all()) and (binary or bool((torch.logsumexp(z, 1).abs() <= ROW_TOLERANCE).all())):
        return "log-probabilities"
    return "logits"


def labels_summary(data: Any, has_labels: bool, ignore_index: int | None, key: str) -> dict[str, Any]:
    """The labels' range and counts over every row: distinct values, rows ignored, values outside the classes."""
    if not has_labels:
        return {"present": False, "key": key}
    y = data.labels
    ignored = y == ignore_index if ignore_index is not None else torch.zeros_like(y, dtype=torch.bool)
    counted = y[~ignored]
    bad = (counted < 0) | (counted >= data.num_classes)
    return {"present": True, "key": key, "rows": int(y.numel()), "ignored": int(ignored.sum()),
            "ignore_index": ignore_index, "min": int(counted.min()) if counted.numel() else None,
            "max": int(counted.max()) if counted.numel() else None,
            "distinct": int(torch.unique(counted).numel()), "out_of_range": int(bad.sum())}


def stored_fields(metadata: Mapping[str, str], where: str, problems: list[str], *, said: str | None = None
                  ) -> dict[str, Any]:
    """What ``metadata`` says of the stored T: its value, and how it was fitted (probabilities, lm-eval's
    normalisation, tensor names, groups). A value that does not parse is a problem, not an error, worded as the
    other commands word it (``said`` starts the message about T: where they say it is)."""
    from ..sources.base import READING_KEYS
    from ..sources.lm_eval import NORM_KEY

    text = metadata.get(TEMPERATURE_KEY)
    recorded = temperature_number(text) if text is not None else None
    if text is not None and recorded is None:
        problems.append(f"{said or where} '{TEMPERATURE_KEY}' is {text!r}, {temperature_problem(text)}")
    out: dict[str, Any] = {"recorded": recorded, "probs": metadata.get(PROBS_KEY) == "true",
                           "lm_eval_norm": metadata.get(NORM_KEY),
                           "logits_key": metadata.get(READING_KEYS["logits_key"]),
                           "labels_key": metadata.get(READING_KEYS["labels_key"]),
                           "group_key": metadata.get(GROUP_KEY), "group_temperatures": None}
    try:
        groups = parse_stored_groups(metadata, where)
    except TempcalError as exc:
        problems.append(str(exc))
    else:
        if groups is not None:
            out["group_temperatures"] = groups.temperatures
    out["metadata"] = {k: v for k, v in metadata.items() if k.startswith("tempcal.")}
    if GROUP_TEMPERATURES_KEY in out["metadata"] and out["group_temperatures"] is not None:
        out["metadata"].pop(GROUP_TEMPERATURES_KEY)  # listed, parsed, above
    return out


def lm_eval_details(paths: list[Path], norm: str) -> list[dict[str, Any]]:
    """Per log: its task, records, choice counts, filter and the forms of its arguments and targets."""
    from ..sources.lm_eval import read_lm_eval_log

    details = []
    for path in paths:
        info = read_lm_eval_log(path, norm)[2]
        details.append({"file": str(path), "task": info.task, "records": info.records,
                        "choice_counts": {str(k): v for k, v in sorted(info.choice_counts.items())},
                        "filter": info.filter, "arguments_forms": info.arguments_forms, "targets": info.targets})
    return details


__all__ = ["SAMPLE_ROWS", "STORED_IN", "labels_summary", "lm_eval_details", "sample_values", "stored_fields",
           "tensor_entry", "tensors_of"]
