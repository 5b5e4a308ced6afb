"""Confidence tables for the tests, from a known generating process, written as CSV, JSON Lines or parquet.

Each answer's true chance of being right is ``sigmoid(z)``, ``z ~ N(0.4, 1.5^2)``; the model reports the
overconfident ``c = sigmoid(OVERCONFIDENCE * z)``, so the T that calibrates ``ln(c / (1 - c))`` is near
``OVERCONFIDENCE``. ``correct ~ Bernoulli(sigmoid(z))``. A ``task`` column (strings) and a ``level`` column
(integers) group the rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

OVERCONFIDENCE = 2.0
TASKS = ("algebra", "biology", "chemistry")


def make_rows(n: int = 400, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.normal(0.4, 1.5, n)
    confidence = 1 / (1 + np.exp(-OVERCONFIDENCE * z))
    correct = (rng.uniform(size=n) < 1 / (1 + np.exp(-z))).astype(np.int64)
    return {"id": np.arange(n), "confidence": np.round(confidence, 6), "correct": correct,
            "task": np.array([TASKS[i % 3] for i in range(n)]), "level": rng.integers(1, 4, n)}


def logits_of(confidence: np.ndarray, clip: float = 1e-6) -> np.ndarray:
    """The reference logits: ``ln(c / (1 - c))`` in float64 with c clipped to [clip, 1 - clip]."""
    c = np.clip(np.asarray(confidence, dtype=np.float64), clip, 1 - clip)
    return np.log(c) - np.log1p(-c)


def write_table(path: Path, rows: dict[str, np.ndarray], *, scale: float = 1.0, correct_as: str = "int") -> Path:
    """Write ``rows`` (confidence multiplied by ``scale``; ``correct`` as 0/1 or true/false) by the suffix."""
    columns = dict(rows)
    if scale != 1:
        columns["confidence"] = rows["confidence"] * scale
    if correct_as == "bool":
        columns["correct"] = rows["correct"].astype(bool)
    n = len(rows["id"])
    suffix = path.suffix
    if suffix == ".csv":
        lines = [",".join(columns)]
        for i in range(n):
            lines.append(",".join(_text(columns[k][i]) for k in columns))
        path.write_text("\n".join(lines) + "\n")
    elif suffix == ".jsonl":
        path.write_text("".join(json.dumps({k: _json(columns[k][i]) for k in columns}) + "\n" for i in range(n)))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({k: list(map(_json, v)) for k, v in columns.items()}), path)
    return path


def _json(value):
    return value.item() if hasattr(value, "item") else value


def _text(value) -> str:
    value = _json(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)
