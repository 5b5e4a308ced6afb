"""One inspect_ai sample as a row: the choice letters' log-probabilities at the answer position, and its target.

A token's letter is its text without whitespace and the word-start markers ``Ġ`` and ``▁``; the answer position is
the first token with a letter of the sample after the last ``ANSWER:`` in the text so far; choice j's logit is the
``logsumexp`` of the ``top_logprobs`` there whose letter is j (docs/evaluation-logs.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from .inspect_files import InspectLogError

#: Why a sample is left out, in the order they are checked (the contract's ``rows_incomplete`` keys).
INCOMPLETE = ("several_targets", "no_answer", "missing_choice")
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
    """The index of the answer position among the generated ``tokens`` (see the module's docstring), or None."""
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
        raise InspectLogError(f"{where}: has no top_logprobs list (run inspect with --logprobs --top-logprobs 20)")
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
    if not values:
        return -math.inf
    top = max(values)
    if top == -math.inf:
        return -math.inf
    return top + math.log(math.fsum(math.exp(v - top) for v in values))


__all__ = ["INCOMPLETE", "SampleRow", "answer_position", "letter_of", "sample_row"]
