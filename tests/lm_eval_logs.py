"""Sample logs written the way lm-evaluation-harness writes them (``--log_samples``), for the tests; never with tempcal.

A record is built as lm-eval's evaluator builds it in memory (``doc_id``, ``doc``, ``target``, ``arguments``
as (context, continuation) pairs, ``resps`` as one ``[(ll, is_greedy)]`` list per request, ``filtered_resps``
as one ``(ll, is_greedy)`` per request after the default take-first filter, ``filter``, ``metrics``, the three
SHA-256 hashes, then the per-sample metric values ``acc``, ``acc_norm``...), then written in the layout of
one lm-eval version:

* ``"pairs"``: the in-memory record dumped as it is (numbers stay numbers, ``arguments`` a list of pairs),
  as a user's own dump of ``simple_evaluate(log_samples=True)["samples"]`` looks;
* ``"0.4.3"``: ``arguments`` as ``{"gen_args_i": {"arg_j": ...}}`` and every leaf of ``resps`` and
  ``filtered_resps`` as a string (lm-eval's ``sanitize_list``); ``target`` left as it is;
* ``"0.4.4"`` (and later): as 0.4.3, with ``target`` written as ``str(target)``.

Import with ``from lm_eval_logs import ...`` (this folder is on ``sys.path``, as for ``reference``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

VERSIONS = ("pairs", "0.4.3", "0.4.4")
#: lm-eval's file name: ``samples_<task>_<datetime.now().isoformat() with ':' as '-'>.jsonl``.
NAME = "samples_hellaswag_2024-09-05T12-34-56.789012.jsonl"
#: The fields of a multiple-choice record as lm-eval writes them, the per-sample metrics aside.
FIELDS = ("doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics", "doc_hash",
          "prompt_hash", "target_hash")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def mc_record(doc_id: int, context: str, choices: Sequence[str], lls: Sequence[float], gold: Any, *,
              delimiter: str = " ", metrics: Sequence[str] = ("acc", "acc_norm"), filter_name: str = "none",
              mutual_info_lls: Sequence[float] | None = None, gold_index: int | None = None) -> dict[str, Any]:
    """An in-memory multiple-choice record. ``gold`` is what the task's doc_to_target returns (logged as
    ``target``); ``gold_index`` is the index lm-eval scores against when ``gold`` is not one (multiple-input
    tasks such as winogrande)."""
    doc = {"question": context, "choices": list(choices), "answer": gold}
    arguments = [[context, f"{delimiter}{c}"] for c in choices]
    all_lls = list(lls)
    if mutual_info_lls is not None:
        arguments += [["", f"{delimiter}{c}"] for c in choices]
        all_lls += list(mutual_info_lls)
    best = int(np.argmax(all_lls[: len(choices)]))
    greedy = [i == best for i in range(len(all_lls))]
    record: dict[str, Any] = {
        "doc_id": doc_id,
        "doc": doc,
        "target": gold,
        "arguments": arguments,
        "resps": [[[ll, g]] for ll, g in zip(all_lls, greedy, strict=True)],
        "filtered_resps": [[ll, g] for ll, g in zip(all_lls, greedy, strict=True)],
        "filter": filter_name,
        "metrics": list(metrics) + (["acc_mutual_info"] if mutual_info_lls is not None else []),
        "doc_hash": sha256_text(json.dumps(doc, indent=2, ensure_ascii=False)),
        "prompt_hash": sha256_text(context),
        "target_hash": sha256_text(str(gold)),
    }
    index = gold_index if gold_index is not None else gold_index_of(gold, choices)
    record.update(mc_metrics(lls, choices, index, metrics))
    return record


def gold_index_of(gold: Any, choices: Sequence[str]) -> int:
    """lm-eval's reading of doc_to_target: an int is an index, a one-item list holds one, a string is a choice."""
    if isinstance(gold, int):
        return gold
    if isinstance(gold, list):
        return gold[0]
    return list(choices).index(gold)


def mc_metrics(lls: Sequence[float], choices: Sequence[str], gold: int, metrics: Sequence[str]) -> dict[str, float]:
    """Per-sample acc / acc_norm / acc_bytes as lm-eval defines them: argmax of ll, ll / len(choice), ll / bytes."""
    lls_arr = np.asarray(lls, dtype=np.float64)
    chars = np.array([float(len(c)) for c in choices])
    nbytes = np.array([float(len(c.encode("utf-8"))) for c in choices])
    with np.errstate(divide="ignore", invalid="ignore"):  # an empty choice: lm-eval divides by zero too
        preds = {"acc": int(np.argmax(lls_arr)), "acc_norm": int(np.argmax(lls_arr / chars)),
                 "acc_bytes": int(np.argmax(lls_arr / nbytes))}
    return {name: 1.0 if preds[name] == gold else 0.0 for name in metrics if name in preds}


def generate_until_record(doc_id: int = 0) -> dict[str, Any]:
    """A generate_until record: one request whose second argument is the generation settings."""
    return {"doc_id": doc_id, "doc": {"q": "2+2?"}, "target": "4",
            "arguments": [["Q: 2+2?\nA:", {"until": ["\n"], "do_sample": False}]],
            "resps": [["4"]], "filtered_resps": ["4"], "filter": "strict-match", "metrics": ["exact_match"],
            "doc_hash": "0", "prompt_hash": "0", "target_hash": "0", "exact_match": 1.0}


def loglikelihood_record(doc_id: int = 0) -> dict[str, Any]:
    """A loglikelihood record (lambada-like): one (context, continuation) request."""
    return {"doc_id": doc_id, "doc": {"text": "the cat sat"}, "target": " sat",
            "arguments": [["the cat", " sat"]], "resps": [[[-1.2, True]]], "filtered_resps": [[-1.2, True]],
            "filter": "none", "metrics": ["perplexity", "acc"], "doc_hash": "0", "prompt_hash": "0",
            "target_hash": "0", "perplexity": -1.2, "acc": 1}


def rolling_record(doc_id: int = 0) -> dict[str, Any]:
    """A loglikelihood_rolling record (wikitext-like): the request is the text alone."""
    return {"doc_id": doc_id, "doc": {"page": "text"}, "target": "text", "arguments": [["text"]],
            "resps": [[-12.5]], "filtered_resps": [-12.5], "filter": "none", "metrics": ["word_perplexity"],
            "doc_hash": "0", "prompt_hash": "0", "target_hash": "0", "word_perplexity": [-12.5, 1]}


def _stringify(value: Any) -> Any:
    """lm-eval's sanitize_list: every leaf of nested lists as str."""
    return [_stringify(v) for v in value] if isinstance(value, list) else str(value)


def as_written(record: dict[str, Any], version: str = "0.4.4") -> dict[str, Any]:
    """The record as the given lm-eval version's writer puts it on disk (before json.dumps)."""
    out = dict(record)
    if version == "pairs":
        return out
    out["arguments"] = {f"gen_args_{i}": {f"arg_{j}": a for j, a in enumerate(args)}
                        for i, args in enumerate(record["arguments"])}
    out["resps"] = _stringify(record["resps"])
    out["filtered_resps"] = _stringify(record["filtered_resps"])
    if version != "0.4.3":
        out["target"] = str(record["target"])
    return out


def write_log(path: Path, records: Sequence[dict[str, Any]], version: str = "0.4.4") -> Path:
    """Records as JSON Lines (gzip when the name ends in .gz), each dumped as lm-eval dumps them."""
    lines = [json.dumps(as_written(r, version), default=str, ensure_ascii=False) for r in records]
    data = ("\n".join(lines) + "\n").encode("utf-8")
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def random_mc_records(n: int, seed: int = 0, *, choice_counts: Sequence[int] = (2, 3, 4, 5),
                      temperature: float = 2.5) -> tuple[list[dict[str, Any]], list[list[float]], list[int]]:
    """``n`` records with varying choice counts and log-likelihoods of a model overconfident by ``temperature``
    (so T is not 1), golds as int indices; also the raw rows and the labels."""
    rng = np.random.default_rng(seed)
    words = ["alpha", "be", "gamma delta", "épsilon", "zeta-eta", "θ", "iota kappa lambda", "mu"]
    records, rows, labels = [], [], []
    for i in range(n):
        k = int(rng.choice(choice_counts))
        choices = [str(w) for w in rng.choice(words, size=k, replace=False)]
        true_logits = rng.normal(size=k) * 1.5
        gold = int(rng.choice(k, p=np.exp(true_logits) / np.exp(true_logits).sum()))
        lls = [float(x) for x in true_logits * temperature - np.logaddexp.reduce(true_logits * temperature)]
        records.append(mc_record(i, f"Question {i}?", choices, lls, gold, metrics=("acc", "acc_norm", "acc_bytes")))
        rows.append(lls)
        labels.append(gold)
    return records, rows, labels


def padded(rows: Sequence[Sequence[float]]) -> np.ndarray:
    """Ragged rows as one float64 matrix, padded with -inf (written here, independently of tempcal)."""
    width = max(len(r) for r in rows)
    return np.array([list(r) + [-np.inf] * (width - len(r)) for r in rows], dtype=np.float64)


def write_gz_run(path: Path, head: bytes, byte: bytes, total: int, block: int = 1 << 22) -> Path:
    """``head``, then ``total`` bytes of ``byte``, through ``gzip.open`` a block at a time: how a log padded with
    gigabytes of spaces or newlines is made (it compresses about a thousandfold)."""
    run = byte * block
    with gzip.open(path, "wb") as f:
        f.write(head)
        for _ in range(total // block):
            f.write(run)
        f.write(byte * (total % block))
    return path


def record_line(doc_id: int = 0, choices: Sequence[str] = ("a", "b"), gold: int = 0, version: str = "0.4.4") -> str:
    """One multiple-choice record as lm-eval writes it (no newline), log-likelihoods -1, -2, ..."""
    lls = [-float(i + 1) for i in range(len(choices))]
    return json.dumps(as_written(mc_record(doc_id, "q", choices, lls, gold, metrics=()), version), ensure_ascii=False)
