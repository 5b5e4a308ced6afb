"""``tempcal inspect`` as a function: what a SOURCE holds (each kind describes its files: ``SourceKind.describe_*``),
a sample of its values, its labels and the T stored with it; what is wrong goes in ``problems``, not an error."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..errors import Note, TempcalError, param
from ..sources.base import DEFAULT_KEYS, OpenedSource, SourceKind, SourceOptions, expand_sources
from ..sources.described import Findings
from ..sources.registry import Source, kind_of, open_source, stored_reading

#: The values are judged from at most this many of the first rows (the rest is not read) ...
SAMPLE_ROWS = 10_000
#: ... and at most this many values (a 128k vocabulary: 32 rows, 32 MB in float64).
SAMPLE_VALUES = 1 << 22
#: How far a row's sum (probabilities) or log-sum-exp (log-probabilities) may be from 1 or 0.
ROW_TOLERANCE = 1e-3


@dataclass
class InspectReport:
    """What ``tempcal inspect`` found in one SOURCE (``to_json`` lists every field)."""

    source: str
    kind: str
    files: list[str]
    tensors: list[dict[str, Any]]
    stored: dict[str, Any]
    sidecar: dict[str, Any] | None = None
    rows: int | None = None
    num_classes: int | None = None
    binary: bool | None = None
    labels: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    details: Any = None  # lm-eval logs: per file, task and records; a model: its format
    problems: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    title: str = ""  # how the kind is called in the report (``kind_name``)
    extra: dict[str, Any] = field(default_factory=dict)  # the keys the kind adds to the JSON (``source_kind``)

    def to_json(self) -> dict:
        return {"source": self.source, "kind": self.kind, "kind_name": self.title or self.kind,
                "files": self.files, "tensors": self.tensors, "rows": self.rows, "num_classes": self.num_classes,
                "binary": self.binary, "labels": self.labels, "values": self.values, "stored": self.stored,
                "sidecar": self.sidecar, "details": self.details, "problems": self.problems, "hints": self.hints,
                "warnings": self.warnings, **self.extra}


def inspect_file(source: Source, *, options: SourceOptions | None = None, **keys: Any) -> InspectReport:
    """Describe ``source`` (a file, shards, a glob; a model with ``inputs``; hidden states with ``head``).

    ``options`` or keyword arguments (``logits_key=...``) say how the other commands would read it. Only a
    SOURCE that cannot be found or told apart is an error; anything wrong inside it is listed in ``problems``.
    """
    options = (options or SourceOptions()).but(**keys)
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)  # type: ignore[arg-type]
    paths = expand_sources(sources)
    if not paths:
        raise TempcalError("no SOURCE file given")
    kind = kind_of(paths, options)
    if kind.inspect_needs_file and not paths[0].exists():
        raise TempcalError(f"{paths[0]}: no such file")
    report = InspectReport(" ".join(str(s) for s in sources), kind.name, [str(p) for p in paths], [], {},
                           title=kind.title or kind.name)
    findings = Findings(report.problems, as_problem)
    report.tensors = findings.attempt(partial(kind.describe_tensors, paths, options)) or []
    report.sidecar = kind.describe_sidecar(paths[0])
    unopened = kind.describes_unopened(options)
    opened = None if unopened else _opened(paths, options, findings)
    if opened is None and not unopened and (other := _other_logits(report.tensors, options)) is not None:
        opened = _opened(paths, options.but(logits_key=other), Findings([]))
        if opened is not None:
            report.hints.append(Note(f"'{options.logits_key}' is absent; '{other}' is read as the logits here: name "
                                     f"it with {param('logits_key')} {other}"))
    report.stored = _stored(kind, paths[0], opened, report)
    if opened is not None:  # rows, classes, labels and a sample of the values
        data = opened.data
        report.rows, report.num_classes, report.binary = data.num_samples, data.num_classes, data.binary
        report.labels = labels_summary(data, opened.has_labels, options.ignore_index, opened.options.labels_key)
        report.values = findings.attempt(lambda: sample_values(data))
        report.warnings.extend(opened.warnings)
        report.extra = dict(opened.json)
        # SOURCE as the other commands read it: with what its kind keeps beside T (a confidence table's columns)
        read = stored_reading(kind, paths[0], options)[0]
        options = options.but(**{name: getattr(read, name) for name in DEFAULT_KEYS})
    report.details = findings.attempt(lambda: kind.describe_details(paths, options))
    report.hints += _hints(report, kind, options)
    report.problems = list(dict.fromkeys(report.problems))  # each problem once, however many steps met it
    return report


def as_problem(exc: TempcalError) -> Note:
    """An error kept as a problem, read as Python callers or the command line are told it."""
    return Note(exc.raw)


def _opened(paths: list[Path], options: SourceOptions, findings: Findings) -> OpenedSource | None:
    """SOURCE opened as the other commands open it, but as raw values (``probs=False``) with every row kept and
    labels optional; None (and the reason among ``findings``' problems) when it cannot be."""
    raw = options.but(probs=False, ignore_index=None)
    return findings.attempt(lambda: open_source(paths, raw, labels_optional=True))


def _other_logits(tensors: list[dict[str, Any]], options: SourceOptions) -> str | None:
    """The one float tensor of rank 1 to 3 that could hold the logits when ``logits_key`` is absent, if there is
    exactly one (hidden states excepted)."""
    names = {t["name"] for t in tensors}
    if options.logits_key in names or options.head is not None:
        return None
    floats = {t["name"] for t in tensors if t["role"] is None and t["shape"] is not None and 1 <= len(t["shape"]) <= 3
              and str(t["dtype"]).startswith(("float", "bfloat"))
              and t["name"] != options.hidden_key}
    return floats.pop() if len(floats) == 1 else None


def _stored(kind: SourceKind, path: Path, opened: OpenedSource | None, report: InspectReport) -> dict[str, Any]:
    """The stored T as its kind describes it, and why a recorded T is ignored."""
    out = kind.describe_stored(path, opened, report.sidecar, Findings(report.problems, as_problem))
    if out["recorded"] is not None and out["temperature"] is None:
        stale = report.sidecar is not None and report.sidecar["state"] == "stale"
        out["ignored"] = ("the sidecar was written for a different version of the file" if stale else
                          "SOURCE cannot be read as the other commands read it (see problems)" if opened is None else
                          "it was fitted under other options (see warnings)")
    return out


def _hints(report: InspectReport, kind: SourceKind, options: SourceOptions) -> list[str]:
    """What to pass, or do, to use this SOURCE, from what was found."""
    hints: list[str] = []
    roles = {t["role"] for t in report.tensors}
    if options.head is None and options.hidden_key in {t["name"] for t in report.tensors} and "logits" not in roles:
        hints.append(Note(f"it holds hidden states '{options.hidden_key}': pass {param('head')} HEAD (the output "
                          "layer) to compute the logits"))
    looks = (report.values or {}).get("looks_like")
    if looks == "probabilities" and not report.stored.get("probs"):
        hints.append(Note(f"the values look like probabilities: pass {param('probs', True)} to read them as such (T "
                          f"then scales log p), or {param('probs', False)} to treat them as logits"))
    if report.labels is not None and not report.labels["present"]:
        hints.append(Note(f"no labels '{report.labels['key']}' (name them with {param('labels_key')}): fit and report "
                          "need them; ood and apply read the file without"))
    hints += kind.describe_hints(options)
    stored = report.stored
    if stored.get("ignored") and report.sidecar and report.sidecar["state"] == "stale":
        hints.append("the sidecar's T is for an earlier version of the file: run tempcal fit again")
    elif stored.get("temperature") is None and not stored.get("recorded") and report.rows:
        hints.append("no stored temperature: run tempcal fit to fit and store one")
    if stored.get("lm_eval_norm") and stored["lm_eval_norm"] != options.lm_eval_norm:
        hints.append(Note(f"its T was fitted with {param('lm_eval_norm')} {stored['lm_eval_norm']}: pass it to use "
                          "that T"))
    return hints


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

__all__ = ["InspectReport", "inspect_file"]
