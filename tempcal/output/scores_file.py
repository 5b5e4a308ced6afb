"""``tempcal ood --scores PATH``: every per-sample score as a safetensors file, one tensor per tau and side."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..errors import param
from ..io.atomic import atomic_path


def tau_label(tau: float) -> str:
    """The shortest text that reads back as ``tau`` ("2", "0.5", "2.3575053928861727")."""
    text = repr(float(tau))
    return text[:-2] if text.endswith(".0") else text


def score_key(side: str, score: str, tau: float) -> str:
    """Tensor name in the scores file: ``id.msp.tau=2`` or ``ood.0.msp.tau=2`` (0 = the first OOD file)."""
    return f"{side}.{score}.tau={tau_label(tau)}"


def score_tensors(report) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every per-sample score of an ``OodReport`` as a float64 tensor, and metadata naming the files."""
    tensors: dict[str, torch.Tensor] = {}
    for name in report.scores:
        for k, tau in enumerate(report.taus):
            tensors[score_key("id", name, tau)] = torch.from_numpy(np.ascontiguousarray(report.id_scores[name][k]))
            for i, scores in enumerate(report.ood_scores):
                tensors[score_key(f"ood.{i}", name, tau)] = torch.from_numpy(np.ascontiguousarray(scores[name][k]))
    metadata = {"tempcal.source": report.source, "tempcal.taus": ",".join(tau_label(t) for t in report.taus),
                "tempcal.scores": ",".join(report.scores), "tempcal.convention": "higher = more in-distribution"}
    metadata.update({f"tempcal.ood.{i}": path for i, path in enumerate(report.ood_files)})
    if report.stored_temperature is not None:
        metadata["tempcal.calibration_temperature"] = tau_label(report.stored_temperature)
    if "gen" in report.scores:
        metadata.update({f"tempcal.{key}": repr(value) for key, value in report.score_options.items()})
    if report.react is not None:
        metadata.update({"tempcal.react_percentile": repr(report.react.percentile),
                         "tempcal.react_threshold": repr(report.react.threshold)})
    return tensors, metadata


def save_scores(report, path: str | os.PathLike) -> Path:
    """Write the per-sample scores as a safetensors file, atomically."""
    from safetensors.torch import save_file

    tensors, metadata = score_tensors(report)
    with atomic_path(path, what=param("scores")) as temporary:
        save_file(tensors, str(temporary), metadata=metadata)
    return Path(path)


__all__ = ["save_scores", "score_key", "score_tensors", "tau_label"]
