"""lighteval details files for the tests: the committed fixtures written by lighteval 0.13 itself (see
``fixtures/lighteval/make_details.py``) with the reference JSON beside each, and small files in lighteval's layout
written here with pyarrow for bad input (never read back with tempcal to make a reference).

Import with ``from lighteval_details import ...`` (this folder is on ``sys.path``, as for ``reference``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "lighteval"


def fixture(task: str) -> Path:
    """The committed details file of ``task`` (``tempcal_mc`` or ``tempcal_listed``)."""
    (path,) = sorted(FIXTURES.glob(f"details_{task}_0_*.parquet"))
    return path


def copied(task: str, folder: Path) -> Path:
    """The fixture of ``task`` copied into ``folder`` (so a fit's sidecar is not written beside the committed file)."""
    path = fixture(task)
    return Path(shutil.copyfile(path, folder / path.name))


def reference_rows(task: str) -> list[dict[str, Any]]:
    """Per row, as pyarrow/pandas read lighteval's file when it was written: gold_index, choices, logprobs."""
    path = fixture(task)
    return json.loads(path.with_name(path.name + ".reference.json").read_text())["rows"]


def complete(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with one gold index and one log-probability per choice."""
    def gold_ok(g: Any) -> bool:
        return not isinstance(g, list) or len(g) == 1
    return [r for r in rows if gold_ok(r["gold_index"]) and len(r["logprobs"]) == len(r["choices"])]


def gold(row: dict[str, Any]) -> int:
    g = row["gold_index"]
    return g[0] if isinstance(g, list) else g


def matrix(rows: list[dict[str, Any]], norm: str = "none", width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """float64 logits padded with -inf and labels, normalised by each choice text's length (leading space removed)
    in characters or UTF-8 bytes, by a plain loop."""
    width = width or max(len(r["logprobs"]) for r in rows)
    z = np.full((len(rows), width), -np.inf)
    for i, r in enumerate(rows):
        for j, (value, text) in enumerate(zip(r["logprobs"], r["choices"], strict=True)):
            text = text.lstrip()
            length = {"none": 1, "chars": len(text), "bytes": len(text.encode("utf-8"))}[norm]
            z[i, j] = value / length
    return z, np.array([gold(r) for r in rows], dtype=np.int64)


def write_details(path: Path, rows: list[dict[str, Any]], *, drop: tuple[str, ...] = (),
                  row_group_size: int | None = None) -> Path:
    """A details file in lighteval's layout (``doc``, ``metric``, ``model_response`` structs) from rows of
    ``gold_index``, ``choices`` and ``logprobs``; ``drop`` leaves out fields (``doc.gold_index``,
    ``model_response``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = []
    for r in rows:
        doc = {"query": "Q", "choices": r["choices"], "gold_index": r["gold_index"], "task_name": "t|0"}
        response = {"logprobs": r["logprobs"], "input_tokens": [1, 2]}
        records.append({"doc": doc, "metric": {"acc": 1}, "model_response": response})
    for name in drop:
        for record in records:
            top, _, child = name.partition(".")
            if child:
                record[top].pop(child)
            else:
                record.pop(top)
    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=row_group_size)
    return path


def mc_rows(n: int, seed: int = 0, choices: tuple[int, ...] = (2, 3, 4)) -> list[dict[str, Any]]:
    """``n`` random complete rows (log-probabilities from a peaked softmax, gold drawn from it)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        k = int(rng.choice(choices))
        z = rng.normal(0, 2.0, k)
        logp = z - np.log(np.exp(z).sum())
        rows.append({"gold_index": int(rng.choice(k, p=np.exp(logp))), "choices": [f" c{i}_{j}" for j in range(k)],
                     "logprobs": [float(v) for v in logp]})
    return rows
