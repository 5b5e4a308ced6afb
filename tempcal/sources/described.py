"""What ``tempcal inspect`` says of a SOURCE in the forms every kind shares (a tensor entry, the stored T); it knows
no kind, so every kind can import it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import PROBS_KEY, READING_KEYS, TEMPERATURE_KEY, TempcalError, temperature_number, temperature_problem
from .lm_eval_records import NORM_KEY
from .stored_groups import GROUP_KEY, parse_stored_groups
from .stored_groups import GROUP_TEMPERATURES as GROUP_TEMPERATURES_KEY

T = TypeVar("T")


@dataclass
class Findings:
    """What inspect found wrong so far (``problems``), and how a step's error is kept as one (``keep``): nothing
    that can be shown is refused."""

    problems: list[str]
    keep: Callable[[TempcalError], str] = str

    def attempt(self, step: Callable[[], T]) -> T | None:
        """``step()``, or None with its one-line error among the problems."""
        try:
            return step()
        except TempcalError as exc:
            self.problems.append(self.keep(exc))
            return None


def tensor_entry(file: Path | str, name: str, shape: Any, dtype: str, options: Any) -> dict[str, Any]:
    """One tensor as the report lists it, with the role the options (a ``SourceOptions``) give its name (logits,
    labels, hidden)."""
    roles = {options.logits_key: "logits", options.labels_key: "labels"}
    if options.head is not None:
        roles = {options.hidden_key: "hidden", options.labels_key: "labels"}
    return {"file": str(file), "name": name, "shape": None if shape is None else [int(n) for n in shape],
            "dtype": dtype, "role": roles.get(name)}


def stored_block(where: str, metadata: Mapping[str, str], shown: str, said: str, opened: Any,
                 problems: list[str]) -> dict[str, Any]:
    """The stored T kept in ``metadata`` (``where``: metadata or sidecar): as commands use it, as recorded, and how it
    was fitted; ``shown`` and ``said`` start messages on the metadata and on T (a bad value is a problem)."""
    text = metadata.get(TEMPERATURE_KEY)
    recorded = temperature_number(text) if text is not None else None
    if text is not None and recorded is None:
        problems.append(f"{said} '{TEMPERATURE_KEY}' is {text!r}, {temperature_problem(text)}")
    groups = Findings(problems).attempt(lambda: parse_stored_groups(metadata, shown))
    return {"temperature": opened.stored if opened is not None and opened.stored_problem is None else None,
            "where": where, "recorded": recorded, "probs": metadata.get(PROBS_KEY) == "true",
            "lm_eval_norm": metadata.get(NORM_KEY), "logits_key": metadata.get(READING_KEYS["logits_key"]),
            "labels_key": metadata.get(READING_KEYS["labels_key"]), "group_key": metadata.get(GROUP_KEY),
            "group_temperatures": None if groups is None else groups.temperatures,
            # the groups' temperatures, when they parse, are listed above rather than as their raw text
            "metadata": {k: v for k, v in metadata.items()
                         if k.startswith("tempcal.") and (k != GROUP_TEMPERATURES_KEY or groups is None)}}


__all__ = ["Findings", "stored_block", "tensor_entry"]
