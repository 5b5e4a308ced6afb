"""What ``tempcal inspect`` reads of any opened SOURCE: a sample of its values and its labels (what each kind says
of its own files, tensors and stored T is the kind's: ``SourceKind.describe_*``)."""

from __future__ import annotations

import math
from typing import Any

import torch

#: The values are judged from at most this many of the first rows (the rest is not read) ...
SAMPLE_ROWS = 10_000
#: ... and at most this many values (a 128k vocabulary: 32 rows, 32 MB in float64).
SAMPLE_VALUES = 1 << 22
#: How far a row's sum (probabilities) or log-sum-exp (log-probabilities) may be from 1 or 0.
ROW_TOLERANCE = 1e-3
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


__all__ = ["SAMPLE_ROWS", "labels_summary", "sample_values"]
