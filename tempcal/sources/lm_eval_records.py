"""One line of an lm-evaluation-harness sample log as a row of logits and a label: JSON decoded within bounds, then read
as a multiple-choice record; anything else is a :class:`LmEvalLogError` naming the line."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import DataError, param
from ..io.bounded_read import JsonLongInteger, JsonTooDeep, load_json

#: ``--lm-eval-norm`` values: log-likelihood as is, per character of the choice text, per UTF-8 byte of it.
NORMS: tuple[str, ...] = ("none", "chars", "bytes")
#: The sidecar key recording the ``--lm-eval-norm`` a stored T was fitted under.
NORM_KEY = "tempcal.lm_eval_norm"
#: The per-sample metric of lm-eval whose prediction each normalisation reproduces (a consistency check).
NORM_METRIC = {"none": "acc", "chars": "acc_norm", "bytes": "acc_bytes"}
#: The most choices a record may have (lm-eval's multiple-choice tasks have 2 to a few hundred); the check comes
#: before the record's responses are read.
MAX_CHOICES = 10_000
#: Indices of at most 9 digits: a longer one is a bad key (and ``int`` of thousands of digits is refused).
_INDEXED_KEY = re.compile(r"^(gen_args|arg)_(\d{1,9})$")
_DIGITS = re.compile(r"^[0-9]+$")


class LmEvalLogError(DataError):
    """Bad input in a sample log: one line that starts with the file name (and the line, where it applies)."""


@dataclass(frozen=True)
class Where:
    """File and line (or ``unit``: a details file's row), for messages; ``error`` makes a ``kind`` naming them."""

    path: str
    line: int
    unit: str = "line"
    kind: type[LmEvalLogError] = LmEvalLogError

    def error(self, message: str) -> LmEvalLogError:
        return self.kind(f"{self.path}: {self.unit} {self.line}: {message}")


#: JSON arrays and objects nested deeper than this are refused; an lm-eval record nests about 5 deep.
MAX_DEPTH = 200
#: The most JSON values and keys a line may hold; a record holds about 15 per choice (10,000 choices: 150,000).
MAX_VALUES = 1_000_000
#: Integers with more digits are refused (the default of Python's own limit on reading an int).
MAX_INT_DIGITS = 4300
#: A backslash escape in a JSON string; removed before quotes are matched.
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
#: Bytes counted at a time (the count's memory: a few bytes per byte of a block).
_COUNT_BLOCK = 1 << 16


def decode_line(data: bytes, where: Where) -> str:
    """The line as text (a byte-order mark at the start of line 1 dropped); bytes that are not UTF-8 are an error."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise where.error(f"not UTF-8 text (byte {exc.start + 1} of the line)") from None
    return text.removeprefix("\ufeff") if where.line == 1 else text


def load_record(text: str, data: bytes, where: Where) -> Any:
    """``json.loads`` of the line (``data``: its bytes) with one-line errors naming it."""
    marks = data.count(b"[") + data.count(b"{") + data.count(b",") + data.count(b":")
    if marks > MAX_VALUES:  # strings included: an upper bound
        values = count_values(data)
        if values > MAX_VALUES:
            raise where.error(_too_many_values(values, data))
    text = text.rstrip("\r\n")
    try:
        return load_json(text, max_depth=MAX_DEPTH, max_int_digits=MAX_INT_DIGITS)
    except JsonLongInteger as exc:
        raise where.error(f"an integer of {exc.digits:,} digits; tempcal reads integers of at most "
                          f"{MAX_INT_DIGITS:,} digits (an lm-eval record's are indices and counts)") from None
    except JsonTooDeep:
        raise where.error(f"JSON nested more than {MAX_DEPTH} levels deep; an lm-eval sample record nests a few "
                          "levels, so this is not a sample log") from None
    except json.JSONDecodeError as exc:
        if where.line == 1 and text.strip() == "[":
            raise where.error("not JSON Lines but one JSON array (lm-eval before 0.4.3 wrote sample logs that "
                              "way); re-run lm-eval >= 0.4.3 with --log_samples") from None
        raise where.error(f"not JSON ({exc.msg} at column {exc.pos + 1})") from None


def _too_many_values(values: int, data: bytes) -> str:
    """The message for a line of too many values, with its count of requests where its keys show them."""
    requests = data.count(b'"gen_args_') - data.count(b'\\"gen_args_')  # keys (a quote in a string is escaped)
    counted = f"{requests:,} requests in 'arguments' and " if requests > MAX_CHOICES else ""
    return (f"{counted}{values:,} JSON values and keys; tempcal reads records of at most {MAX_CHOICES:,} choices "
            f"and {MAX_VALUES:,} values (lm-eval's multiple-choice records have a few choices, about 15 values "
            "each), so this is not a sample log")


def count_values(data: bytes) -> int:
    """The JSON values and keys in ``data``, counted by commas, colons and opening brackets outside strings (numpy, a
    block at a time)."""
    import numpy as np

    marks = np.zeros(256, dtype=bool)
    marks[list(b",:[{")] = True
    plain = _ESCAPE.sub(b"", data)  # after this every quote opens or closes a string
    inside, count = 0, 0
    for start in range(0, len(plain), _COUNT_BLOCK):
        block = np.frombuffer(plain, dtype=np.uint8, count=min(_COUNT_BLOCK, len(plain) - start), offset=start)
        quotes = block == ord('"')
        seen = np.cumsum(quotes, dtype=np.int64)
        outside = (((seen + inside) & 1) == 0) & ~quotes
        inside = (inside + int(seen[-1])) & 1
        count += int(np.count_nonzero(marks[block] & outside))
    return count


@dataclass(frozen=True)
class ParsedRecord:
    """One record read: the row's (normalised) log-likelihoods, its label and how it was read."""

    logits: list[float]
    label: int
    arguments_form: str  # "gen_args" (lm-eval >= 0.4.3) or "pairs"
    target_kind: str  # "index", "text" or "acc" (a target naming several choices, settled by the record's acc)
    check_agrees: bool | None  # lm-eval's metric for this norm equals (argmax(row) == label); None: no metric


def parse_record(record: Any, norm: str, where: Where) -> ParsedRecord:
    """Turn one decoded sample record into a row; anything that is not a usable multiple-choice record is an error."""
    if not isinstance(record, dict):
        raise where.error(f"expected a JSON object (an lm-eval sample record), got {json_kind(record)}")
    for key in ("arguments", "filtered_resps", "target"):
        if key not in record:
            raise where.error(f"no '{key}' field: not an lm-eval sample record")
    _check_choice_count(record, where)
    pairs, form = _arguments(record["arguments"], where)
    raw = _loglikelihoods(record["filtered_resps"], where)
    if len(raw) != len(pairs):
        raise where.error(f"'filtered_resps' holds {len(raw)} responses for {len(pairs)} requests in 'arguments'")
    pairs, raw = _drop_unconditional(record, pairs, raw, where)
    if len(pairs) < 2:
        raise where.error("a record with a single continuation (a loglikelihood task such as lambada), "
                          "not a multiple-choice record: a softmax over one choice carries no calibration")
    texts = [continuation.lstrip() for _, continuation in pairs]
    label, target_kind = resolve_target(record["target"], texts, raw, record.get("acc"), where)
    if raw[label] == -math.inf:
        raise where.error(f"the correct choice ({label}) has log-likelihood -inf: its NLL would be infinite")
    logits = normalise(raw, texts, norm, where)
    agrees = _metric_agrees(record.get(NORM_METRIC[norm]), logits, label)
    return ParsedRecord(logits=logits, label=label, arguments_form=form, target_kind=target_kind, check_agrees=agrees)


def _check_choice_count(record: dict[str, Any], where: Where) -> None:
    """Refuse a record of more than :data:`MAX_CHOICES` choices before its requests are read."""
    requests = record["arguments"]
    if isinstance(requests, (list, dict)):
        choices = len(requests) // 2 if _is_mutual_info(record) else len(requests)
        if choices > MAX_CHOICES:
            raise where.error(f"{choices:,} choices; tempcal reads records of at most {MAX_CHOICES:,} choices "
                              "(lm-eval's multiple-choice tasks have a few)")


def _arguments(value: Any, where: Where) -> tuple[list[tuple[str, str]], str]:
    """``(context, continuation)`` per request, from a list of pairs or from the ``gen_args_<i>`` object."""
    if isinstance(value, dict):
        entries, form = _gen_args_entries(value, where), "gen_args"
    elif isinstance(value, list):
        entries, form = [(f"arguments[{i}]", entry) for i, entry in enumerate(value)], "pairs"
    else:
        raise where.error(f"'arguments' must be a list of [context, continuation] pairs or a gen_args_<i> object, "
                          f"got {json_kind(value)}")
    if not entries:
        raise where.error("'arguments' is empty")
    return [_request_pair(name, entry, where) for name, entry in entries], form


def _gen_args_entries(value: dict[str, Any], where: Where) -> list[tuple[str, Any]]:
    """The ``gen_args_<i>`` entries in index order, each as its list of ``arg_<j>`` values."""
    indexed = _by_index(value, "gen_args", "arguments", where)
    if [i for i, _, _ in indexed] != list(range(len(indexed))):
        raise where.error(f"'arguments' keys are not gen_args_0 .. gen_args_{len(indexed) - 1}")
    out = []
    for _, key, entry in indexed:
        if not isinstance(entry, dict):
            raise where.error(f"'arguments.{key}' must be an object of arg_0, arg_1, ..., got {json_kind(entry)}")
        out.append((f"arguments.{key}", [arg for _, _, arg in _by_index(entry, "arg", f"arguments.{key}", where)]))
    return out


def _by_index(value: dict[str, Any], prefix: str, name: str, where: Where) -> list[tuple[int, str, Any]]:
    """``(i, key, entry)`` per ``<prefix>_<i>`` key of object ``name``, by index (``_10`` after ``_9``); any other
    key is an error."""
    indexed = []
    for key, entry in value.items():
        match = _INDEXED_KEY.match(key)
        if not match or match.group(1) != prefix:
            raise where.error(f"'{name}' has a key '{clip(key)}'; expected {prefix}_0, {prefix}_1, ...")
        indexed.append((int(match.group(2)), key, entry))
    return sorted(indexed, key=lambda item: item[0])


def _request_pair(name: str, entry: Any, where: Where) -> tuple[str, str]:
    """One request's ``(context, continuation)``; a generation or rolling-loglikelihood request is an error."""
    if not isinstance(entry, list):
        raise where.error(f"'{name}' must be a [context, continuation] pair, got {json_kind(entry)}")
    if len(entry) == 1:
        raise where.error("a loglikelihood_rolling (perplexity) record, not a multiple-choice record")
    if len(entry) < 2:
        raise where.error(f"'{name}' is empty; expected [context, continuation]")
    context, continuation = entry[0], entry[1]
    if isinstance(continuation, dict):
        raise where.error("a generate_until record (its arguments hold generation settings, not choices); "
                          "tempcal reads multiple-choice tasks")
    if not isinstance(continuation, str) or not isinstance(context, str):
        raise where.error(f"'{name}' must hold a context and a continuation string, got "
                          f"{json_kind(context)} and {json_kind(continuation)}")
    return context, continuation


def _loglikelihoods(value: Any, where: Where) -> list[float]:
    """Each request's log-likelihood from ``filtered_resps``: ``[ll, is_greedy]`` (or ``[[ll, is_greedy]]``)."""
    if not isinstance(value, list):
        raise where.error(f"'filtered_resps' must be a list, got {json_kind(value)}")
    out: list[float] = []
    for i, pair in enumerate(value):
        if isinstance(pair, list) and len(pair) == 1 and isinstance(pair[0], list):
            pair = pair[0]  # one response per request, still wrapped (as in 'resps')
        if isinstance(pair, str):
            raise where.error(f"'filtered_resps[{i}]' is text ({short(pair)}): a generation record, "
                              "not a multiple-choice record")
        if not isinstance(pair, list) or len(pair) != 2:
            raise where.error(f"'filtered_resps[{i}]' must be a [log-likelihood, is-greedy] pair, "
                              f"got {json_kind(pair)}")
        out.append(_loglikelihood(pair[0], f"filtered_resps[{i}]", where))
    return out


def _loglikelihood(value: Any, name: str, where: Where) -> float:
    """A log-likelihood: a JSON number or a numeric string (lm-eval >= 0.4.3 writes ``str(float)``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise where.error(f"'{name}' log-likelihood must be a number, got {json_kind(value)}")
    number = as_number(value)
    if number is None:
        raise where.error(f"'{name}' log-likelihood {short(value)} is not a number")
    if math.isnan(number) or number == math.inf:
        raise where.error(f"'{name}' log-likelihood is {clip(str(value).strip())}; expected a finite number or -inf")
    return number


def _is_mutual_info(record: dict[str, Any]) -> bool:
    """Whether the record is scored by ``acc_mutual_info`` (its requests are the choices twice)."""
    metrics = record.get("metrics")
    return "acc_mutual_info" in record or (isinstance(metrics, list) and "acc_mutual_info" in metrics)


def _drop_unconditional(record: dict[str, Any], pairs: list[tuple[str, str]], raw: list[float],
                        where: Where) -> tuple[list[tuple[str, str]], list[float]]:
    """Keep the conditional half of an ``acc_mutual_info`` record (lm-eval appends ``("", continuation)`` requests)."""
    if not _is_mutual_info(record):
        return pairs, raw
    half = len(pairs) // 2
    first, second = pairs[:half], pairs[half:]
    if len(pairs) % 2 or any(ctx != "" for ctx, _ in second) or [c for _, c in first] != [c for _, c in second]:
        raise where.error("an acc_mutual_info record whose requests are not the choices followed by the same "
                          "continuations with an empty context")
    return first, raw[:half]


def resolve_target(target: Any, texts: Sequence[str], raw: Sequence[float], acc: Any, where: Where) -> tuple[int, str]:
    """The correct choice's index and how it was found (``index``, ``text`` or ``acc``): an integer or ``[i]`` is an
    index; a string is digits and/or a choice's text, the record's ``acc`` settling a tie between them."""
    k = len(texts)
    if isinstance(target, bool) or target is None or isinstance(target, (float, dict)):
        raise where.error(f"target must be a choice index or the text of a choice, got {json_kind(target)}")
    if isinstance(target, int):
        if not 0 <= target < k:
            raise where.error(f"target {short(target)} is out of range for {k} choices")
        return target, "index"
    if isinstance(target, list):
        return _single_listed_target(target, k, where), "index"
    by_text = [i for i, text in enumerate(texts) if text.strip() == target.strip()]
    by_index = _index_from_string(target, k, bool(by_text), where)
    candidates = sorted(set(by_text) | set(by_index))
    if len(candidates) == 1:
        return candidates[0], "text" if by_text else "index"
    if not candidates:
        hint = f"; as an index it is out of range for {k} choices" if _DIGITS.match(target.strip()) else ""
        shown = ", ".join(short(t, 30) for t in texts[:6]) + (", ..." if k > 6 else "")
        raise where.error(f"target {short(target)} matches no choice (choices {shown}){hint}")
    settled = _settle_by_acc(candidates, raw, acc)
    if settled is not None:
        return settled, "acc"
    how = "; ".join(f"as {what}: {', '.join(map(str, found))}" for what, found in (("an index", by_index),
                                                                                    ("text", by_text)) if found)
    raise where.error(f"target {short(target)} is ambiguous: it could be choice {', '.join(map(str, candidates))} "
                      f"({how}) and the record's 'acc' does not settle it")


def _index_from_string(target: str, k: int, matched_text: bool, where: Where) -> list[int]:
    """The index a target string names: digits, or ``[i]`` (a list with several indices is an error)."""
    text = target.strip()
    if _DIGITS.match(text):
        significant = text.lstrip("0") or "0"  # int() of thousands of digits is refused (and slow): compare lengths
        return [int(significant)] if len(significant) <= len(str(k)) and int(significant) < k else []
    if text.startswith("[") and text.endswith("]") and not matched_text:
        try:
            listed = json.loads(text)
        except (ValueError, RecursionError):  # not JSON, an integer of thousands of digits, or nested too deep
            return []
        if isinstance(listed, list):
            return [_single_listed_target(listed, k, where)]
    return []


def _single_listed_target(listed: list[Any], k: int, where: Where) -> int:
    """The index in a one-element target list; several correct choices cannot be one label."""
    if len(listed) != 1:
        raise where.error(f"target {short(listed)} lists {len(listed)} correct choices; tempcal needs exactly "
                          "one per record")
    only = listed[0]
    if isinstance(only, bool) or not isinstance(only, int) or not 0 <= only < k:
        raise where.error(f"target {short(listed)} is not a choice index in 0..{k - 1}")
    return only


def as_number(value: Any) -> float | None:
    """A number or numeric string as a float (an integer past float's range: +-inf); None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None
    except OverflowError:
        return math.inf if int(value) > 0 else -math.inf


def _zero_or_one(value: Any) -> bool | None:
    """A per-sample 0/1 metric (a number or numeric string) as a bool; None when absent or anything else."""
    number = as_number(value)
    return None if number not in (0.0, 1.0) else number == 1.0


def _settle_by_acc(candidates: list[int], raw: Sequence[float], acc: Any) -> int | None:
    """The one candidate consistent with the record's ``acc`` (lm-eval: ``acc = argmax(lls) == gold``), if only one."""
    correct = _zero_or_one(acc)
    if correct is None:
        return None
    pred = first_argmax(raw)
    kept = [c for c in candidates if (c == pred) == correct]
    return kept[0] if len(kept) == 1 else None


def _metric_agrees(value: Any, logits: Sequence[float], label: int) -> bool | None:
    """Whether lm-eval's per-sample 0/1 metric equals ``argmax(row) == label``; None when absent or not 0/1."""
    correct = _zero_or_one(value)
    return None if correct is None else (first_argmax(logits) == label) == correct


def normalise(raw: Sequence[float], texts: Sequence[str], norm: str, where: Where) -> list[float]:
    """Divide each log-likelihood by its choice text's length (``chars``) or UTF-8 length (``bytes``)."""
    if norm == "none":
        return list(raw)
    lengths = [len(t) if norm == "chars" else _utf8_length(t, i, where) for i, t in enumerate(texts)]
    for i, length in enumerate(lengths):
        if length == 0:
            raise where.error(f"choice {i} has an empty text: it cannot be normalised by its length "
                              f"({param('lm_eval_norm')} {norm})")
    return [ll / length for ll, length in zip(raw, lengths, strict=True)]


def _utf8_length(text: str, index: int, where: Where) -> int:
    """The length of a choice text in UTF-8 bytes; a lone surrogate (a ``\\ud800`` escape) has none."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise where.error(f"choice {index}'s text holds a lone surrogate ({text[exc.start]!a} at character "
                          f"{exc.start + 1}), which is not Unicode text and has no length in UTF-8 bytes "
                          f"({param('lm_eval_norm')} bytes)") from None


def first_argmax(values: Sequence[float]) -> int:
    """Index of the largest value, the first one on ties (numpy's ``argmax``, which lm-eval uses)."""
    return max(range(len(values)), key=values.__getitem__, default=0)


def json_kind(value: Any) -> str:
    """A JSON value's kind as a message shows it (``true``, ``the string "x"``, ``an object``...)."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return f"the number {short(value)}"
    if isinstance(value, str):
        return f"the string {short(value)}"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    return "an object" if isinstance(value, dict) else type(value).__name__


def clip(text: str, limit: int = 40) -> str:
    """A name from the input, cut to ``limit`` characters for a one-line message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short(value: Any, limit: int = 60) -> str:
    """A value quoted for a one-line message, cut to ``limit`` characters."""
    return clip(json.dumps(value, ensure_ascii=False), limit)


__all__ = ["MAX_CHOICES", "MAX_DEPTH", "NORMS", "NORM_KEY", "NORM_METRIC", "LmEvalLogError", "ParsedRecord", "Where",
           "as_number", "clip", "count_values", "decode_line", "first_argmax", "load_record", "normalise",
           "parse_record", "short"]
