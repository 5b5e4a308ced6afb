"""The inspect_ai logs of tests/fixtures/inspect (written by inspect_ai itself, see make_logs.py there), their
reference JSON (read by inspect_ai's own ``read_eval_log``), the rows expected from it by an independent reading,
and helpers that rewrite a log's members for the bad-input cases."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "inspect"
REFERENCE = FIXTURES / "reference"


def fixture(name: str) -> Path:
    return FIXTURES / name


def reference(name: str) -> dict:
    """The reference JSON the fixture script wrote for log ``name`` (``multi/alpha_word1.eval`` too)."""
    return json.loads((REFERENCE / (name.replace("/", "__") + ".json")).read_text())


def _letter(token: str) -> str:
    return "".join(token.replace("\u0120", "").replace("\u2581", "").split()).upper()


def expected_rows(name: str) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Logits (padded with -inf), labels and the samples left out by reason, from the reference's top_logprobs."""
    rows, labels = [], []
    left = {"several_targets": 0, "no_answer": 0, "missing_choice": 0}
    for s in reference(name)["samples"]:
        letters = [chr(ord("A") + j) for j in range(len(s["choices"]))]
        targets = s["target"] if isinstance(s["target"], list) else [s["target"]]
        if len(set(targets)) > 1:
            left["several_targets"] += 1
            continue
        if s["answer_index"] is None:
            left["no_answer"] += 1
            continue
        logits = []
        for letter in letters:
            values = [t["logprob"] for t in s["top_logprobs"] if _letter(t["token"]) == letter]
            logits.append(np.logaddexp.reduce(np.array(values, dtype=np.float64)) if values else -np.inf)
        if -np.inf in logits:
            left["missing_choice"] += 1
            continue
        rows.append(logits)
        labels.append(letters.index(targets[0].strip().upper()))
    width = max(len(r) for r in rows)
    z = np.full((len(rows), width), -np.inf)
    for i, r in enumerate(rows):
        z[i, : len(r)] = r
    return z, np.array(labels, dtype=np.int64), left


def members(path: Path) -> dict[str, bytes]:
    """Every member of an .eval log, decompressed (zstd members with zstandard)."""
    from tempcal.sources.inspect_files import EvalArchive

    with EvalArchive(path) as archive:
        return {name: archive.read(name) for name in archive.members}


def write_eval(path: Path, content: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as out:
        for name, blob in content.items():
            out.writestr(name, blob)
    return path


def rewritten(source: Path, out: Path, change) -> Path:
    """``source`` with each sample member passed through ``change(sample) -> sample`` (deflated members)."""
    content = members(source)
    for name in list(content):
        if name.startswith("samples/"):
            content[name] = json.dumps(change(json.loads(content[name]))).encode()
    return write_eval(out, content)
