"""inspect_ai logs (``.eval``, ``.json``, a folder or glob of them) as SOURCE: a row per multiple-choice sample and
epoch, each choice's logit from ``top_logprobs`` at the answer position, samples left out counted; T in each sidecar."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import TempcalError, param
from .base import OpenedSource, RowGroups, SourceKind, SourceOptions, file_groups
from .inspect_files import EvalArchive, InspectLogError, json_log
from .lm_eval import ChoiceRows, counts_shown, padded_source

#: Why a sample is left out, in the order they are checked (the contract's ``rows_incomplete`` keys), in words.
INCOMPLETE = {"several_targets": "with several targets", "no_answer": "without an answer position",
              "missing_choice": "with a choice's letter missing from the answer's top_logprobs"}
#: The options of ``inspect eval`` that record log-probabilities.
LOGPROB_OPTIONS = "--logprobs --top-logprobs 20"
_MARKERS = str.maketrans("", "", "\u0120\u2581")
_ANSWER_END = re.compile(r"answer\s*:\Z", re.IGNORECASE)
#: How much of the text so far is searched for ``ANSWER:`` at its end.
_TAIL = 64


@dataclass
class SampleRow:
    """A sample read: its logits (one per choice) and label, or why it is left out (``incomplete``)."""

    id: Any
    epoch: int
    logits: list[float] | None = None
    label: int = -1
    incomplete: str | None = None
    choices: int = 0


def letter_of(token: Any, letters: str) -> int | None:
    """The index of ``token``'s letter among ``letters`` (``ĠB``, `` b``, ``▁B`` -> 1), or None."""
    if not isinstance(token, str) or len(token) > 16:
        return None
    bare = "".join(token.translate(_MARKERS).split())
    if len(bare) != 1:
        return None
    at = letters.find(bare.upper())
    return at if at >= 0 else None


def answer_position(tokens: list[str], letters: str) -> int | None:
    """The answer position among the generated ``tokens``: the first token with a letter after the last ``ANSWER:``
    (None: there is none)."""
    text, start = "", 0
    for i, token in enumerate(tokens):
        text = (text + token)[-_TAIL:]
        if _ANSWER_END.search(text):
            start = i + 1
    return next((i for i in range(start, len(tokens)) if letter_of(tokens[i], letters) is not None), None)


def sample_row(sample: dict[str, Any], where: str) -> SampleRow | None:
    """Sample ``sample`` as a row; None for a sample without choices (not a multiple-choice sample)."""
    sid, epoch = sample.get("id"), sample.get("epoch", 1)
    choices = sample.get("choices")
    if not isinstance(choices, list) or not choices:
        return None
    named = f"{where}: sample id {sid!r} epoch {epoch}"
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        raise InspectLogError(f"{named}: its epoch is not an integer")
    if len(choices) > 26:
        raise InspectLogError(f"{named}: {len(choices)} choices; a multiple-choice sample has at most 26 (A-Z)")
    letters = "".join(chr(ord("A") + j) for j in range(len(choices)))
    targets = _targets(sample.get("target"), letters, named)
    row = SampleRow(sid, epoch, choices=len(choices))
    if len(targets) > 1:
        row.incomplete = "several_targets"
        return row
    content = _content(sample, named)
    if content is None:
        row.incomplete = "no_logprobs"
        return row
    tokens = [entry.get("token") if isinstance(entry, dict) else None for entry in content]
    at = answer_position([t if isinstance(t, str) else "" for t in tokens], letters)
    if at is None:
        row.incomplete = "no_answer"
        return row
    logits = _choice_logits(content[at], letters, f"{named}: the answer position (token {at})")
    if any(v == -math.inf for v in logits):
        row.incomplete = "missing_choice"
        return row
    row.logits, row.label = logits, targets[0]
    return row


def _targets(target: Any, letters: str, named: str) -> list[int]:
    """The choices the target names by letter; a letter naming no choice is bad input."""
    values = target if isinstance(target, list) else [target]
    if not values:
        raise InspectLogError(f"{named}: its target is an empty list; expected the correct choice's letter "
                              f"({', '.join(letters)})")
    out = []
    for value in values:
        text = value.strip() if isinstance(value, str) else None
        if text is None or len(text) != 1 or text.upper() not in letters:
            raise InspectLogError(f"{named}: its target {str(value)[:40]!r} names no choice; expected one of "
                                  f"{', '.join(letters)} for its {len(letters)} choices")
        out.append(letters.index(text.upper()))
    return sorted(set(out))


def _content(sample: dict[str, Any], named: str) -> list[Any] | None:
    """The generated tokens with their log-probabilities; None when the output has none."""
    output = sample.get("output")
    choices = output.get("choices") if isinstance(output, dict) else None
    if not isinstance(choices, list) or not choices:
        return []  # no output (an error): no answer position
    first = choices[0] if isinstance(choices[0], dict) else {}
    logprobs = first.get("logprobs")
    if logprobs is None:
        return None
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        raise InspectLogError(f"{named}: output.choices[0].logprobs.content is not a list")
    return content


def _choice_logits(entry: Any, letters: str, where: str) -> list[float]:
    """Per letter, the logsumexp of the ``top_logprobs`` entries whose token is that letter (-inf: none)."""
    top = entry.get("top_logprobs") if isinstance(entry, dict) else None
    if not isinstance(top, list):
        raise InspectLogError(f"{where}: has no top_logprobs list (run inspect with {LOGPROB_OPTIONS})")
    found: list[list[float]] = [[] for _ in letters]
    for k, item in enumerate(top):
        j = letter_of(item.get("token") if isinstance(item, dict) else None, letters)
        if j is None:
            continue
        value = item.get("logprob")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value > 1e-6:
            raise InspectLogError(f"{where}: top_logprobs[{k}].logprob {str(value)[:40]} is not a log-probability")
        found[j].append(float(value))
    return [_logsumexp(values) for values in found]


def _logsumexp(values: list[float]) -> float:
    top = max(values, default=-math.inf)
    if top == -math.inf:
        return top
    return top + math.log(math.fsum(math.exp(v - top) for v in values))


#: The ``--group-by`` keys of inspect_ai logs.
GROUP_KEYS = ("task", "model")
#: The top-level keys every inspect_ai log has, beside ``samples``.
LOG_KEYS = ("version", "status", "eval")
_SNIFF = 4096


@dataclass
class InspectLogInfo:
    """One log: its task and model, and its rows (complete) and the samples left out, by reason."""

    path: Path
    task: str = ""
    model: str = ""
    rows: list[SampleRow] = field(default_factory=list)
    incomplete: dict[str, int] = field(default_factory=lambda: dict.fromkeys(INCOMPLETE, 0))
    epochs: set[int] = field(default_factory=set)
    samples: int = 0
    logprobs: bool = False  # some sample has log-probabilities

    def take(self, sample: dict[str, Any]) -> None:
        """Count one sample of the log, a multiple-choice one as a row or as left out."""
        row = sample_row(sample, str(self.path))
        if row is None:
            return
        self.samples += 1
        self.epochs.add(row.epoch)
        self.logprobs |= row.incomplete != "no_logprobs"
        if row.incomplete is None:
            self.rows.append(row)
        else:  # a sample without log-probabilities has no answer position
            self.incomplete["no_answer" if row.incomplete == "no_logprobs" else row.incomplete] += 1

    @property
    def complete(self) -> int:
        return len(self.rows)


def is_inspect_log(path: Path) -> bool:
    """An ``.eval`` file, or a ``.json`` file whose start reads like inspect_ai's JSON log (not a sidecar)."""
    name = path.name.lower()
    if name.endswith(".eval"):
        return True
    if not name.endswith(".json") or name.endswith(".tempcal.json") or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF)
    except OSError:
        return False
    return b'"eval"' in head and b'"version"' in head and b'"status"' in head


def log_files(paths: list[Path]) -> list[Path]:
    """The logs of ``paths``: a folder gives its ``.eval`` and ``.json`` logs, sorted by name."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and is_inspect_log(p))
            if not found:
                raise TempcalError(f"{path}: a folder without inspect_ai logs (.eval or .json)")
            out.extend(found)
        else:
            out.append(path)
    return out


def read_inspect_log(path: Path) -> InspectLogInfo:
    """Every row of one log, and what it says of itself; refusals name the file and the sample or member."""
    info = InspectLogInfo(path)
    if path.name.lower().endswith(".json"):
        if not is_inspect_log(path):
            _check_json_log(path)
        header = json_log(path, info.take)
    else:
        with EvalArchive(path) as archive:
            name = "header.json" if "header.json" in archive.members else "_journal/start.json"
            if name not in archive.members:
                raise InspectLogError(f"{path}: no header.json or _journal/start.json; not an inspect_ai .eval log")
            header = archive.json(name)
            for member in archive.sample_names():
                sample = archive.json(member)
                if not isinstance(sample, dict):
                    raise InspectLogError(f"{path}: member {member} is not a sample (a JSON object)")
                info.take(sample)
    _read_header(info, header)
    if info.samples and not info.logprobs:
        raise InspectLogError(f"{path}: written without log-probabilities; run inspect eval with "
                              f"{LOGPROB_OPTIONS} (or eval(..., logprobs=True, top_logprobs=20))")
    info.rows.sort(key=lambda r: (r.epoch, r.id if isinstance(r.id, str) else str(r.id).zfill(20)))
    return info


def _check_json_log(path: Path) -> None:
    """A ``.json`` SOURCE is read as an inspect_ai log: one without the log's top-level keys is refused, naming them."""
    top = json_log(path, lambda sample: None)
    missing = [key for key in LOG_KEYS if key not in top]
    if missing:
        said = ("keys " if len(missing) > 1 else "key ") + ", ".join(f"'{key}'" for key in missing)
        raise InspectLogError(f"{path}: a .json SOURCE is read as an inspect_ai log (written by inspect eval "
                              f"--log-format json), and this one has no {said} (a log's top level has "
                              f"{', '.join(repr(k) for k in LOG_KEYS)} and 'samples')")


def _read_header(info: InspectLogInfo, header: Any) -> None:
    """Task and model; a plan that shuffled choices inside ``multiple_choice`` is refused."""
    spec = header.get("eval") if isinstance(header, dict) else None
    if not isinstance(spec, dict):
        raise InspectLogError(f"{info.path}: no 'eval' record (task, model); not an inspect_ai log")
    info.task, info.model = str(spec.get("task", "")), str(spec.get("model", ""))
    plan = header.get("plan")
    steps = plan.get("steps") if isinstance(plan, dict) else None
    for step in steps if isinstance(steps, list) else []:
        solver = str(step.get("solver", "")) if isinstance(step, dict) else ""
        params = step.get("params") if isinstance(step, dict) else None
        if solver.rsplit("/", 1)[-1] == "multiple_choice" and isinstance(params, dict) and params.get("shuffle"):
            raise InspectLogError(f"{info.path}: its plan's multiple_choice shuffled the choices (shuffle=True, "
                                  "deprecated in inspect_ai): the stored choices and target are not those the "
                                  "model saw; shuffle the dataset's choices instead (Sample/dataset shuffle_choices)")


def _warning(infos: list[InspectLogInfo], counts: dict[str, int], name: str) -> list[str]:
    left = sum(counts.values())
    if not left:
        return []
    parts = ", ".join(f"{n} {INCOMPLETE[k]}" for k, n in counts.items() if n)
    total = left + sum(i.complete for i in infos)
    return [f"{name}: {left} of {total} samples left out of every figure ({parts})"]


class InspectLogKind(SourceKind):
    """inspect_ai ``.eval`` / ``.json`` logs, a folder or a glob of them."""

    name = "inspect"
    title = "inspect_ai log"
    shards = True

    def claims(self, paths: list[Path], options: SourceOptions) -> bool:
        path = paths[0]
        if path.is_dir():
            return any(p.is_file() and is_inspect_log(p) for p in path.iterdir())
        # Its registry line asks of .eval and .json only: any .json but a sidecar, opening says what a log lacks.
        return not path.name.lower().endswith(".tempcal.json")

    def open(self, paths: list[Path], options: SourceOptions, *, labels_optional: bool = False) -> OpenedSource:
        self.refuse_probs(options, f"{paths[0]} is an inspect_ai log of log-probabilities")
        infos = [read_inspect_log(path) for path in log_files(paths)]
        name = str(paths[0]) if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} more logs)"
        models = sorted({i.model for i in infos})
        if len(models) > 1 and options.group_by != "model":
            raise TempcalError(f"{name}: logs of {len(models)} models ({', '.join(models[:4])}); one T for several "
                               f"models means nothing: pass {param('group_by')} model, or one model's logs")
        counts = {reason: sum(i.incomplete[reason] for i in infos) for reason in INCOMPLETE}
        if not any(i.complete for i in infos):
            said = ", ".join(f"{k} {n}" for k, n in counts.items())
            raise InspectLogError(f"{name}: no sample has a complete row ({said}); see the answer position rules in "
                                  "docs/evaluation-logs.md")
        rows = ChoiceRows()
        for row in (r for i in infos for r in i.rows):
            rows.add(row.logits or [], row.label)
        return padded_source(self, [i.path for i in infos], [rows], options, warnings=_warning(infos, counts, name),
                             file_rows=[i.complete for i in infos], label=name,
                             file_names={"task": [i.task for i in infos], "model": [i.model for i in infos]},
                             json={"source_kind": self.name, "rows_incomplete": counts})

    def read_groups(self, opened: OpenedSource, key: str, option: str) -> RowGroups:
        """One group per task or model, each log's rows in its group."""
        if key not in GROUP_KEYS:
            raise TempcalError(f"{opened.name}: {option} groups inspect_ai logs by task or model, not '{key}'")
        return file_groups(opened, key)

    def sidecar_of(self, path: Path) -> Path:
        """A folder's T lives in the sidecars of its logs: the first log's stands for it."""
        return log_files([path])[0] if path.is_dir() else path

    def describe_details(self, paths: list[Path], options: SourceOptions) -> Any:
        """Per log: task, model, epochs, samples, complete rows and the samples left out by reason."""
        return [{"file": str(i.path), "task": i.task, "model": i.model, "epochs": sorted(i.epochs),
                 "samples": i.samples, "rows": i.complete, "rows_incomplete": dict(i.incomplete),
                 "choice_counts": _choice_counts(i), "summary": _summary(i)}
                for i in map(read_inspect_log, log_files(paths))]


def _summary(info: InspectLogInfo) -> str:
    left = ", ".join(f"{k} {n}" for k, n in info.incomplete.items())
    counts = ", ".join(f"{v} x {k}" for k, v in _choice_counts(info).items())
    return (f"task {info.task}, model {info.model}, epochs {len(info.epochs)}, {info.samples} samples: "
            f"{info.complete} rows ({counts} choices), incomplete: {left}")


def _choice_counts(info: InspectLogInfo) -> dict[str, int]:
    return counts_shown(Counter(row.choices for row in info.rows))


__all__ = ["InspectLogKind", "read_inspect_log"]
