"""The one-line errors users see, and each check of what they give, defined once (temperatures and ``--tau``, ranges,
bins, labels, probabilities); nothing here imports torch or numpy as it loads, so ``tempcal --help`` stays fast."""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_MARK = "\x1f"
_PARAM = re.compile(f"{_MARK}([A-Za-z0-9_]+)(?:=(True|False))?{_MARK}")


def param(name: str, value: bool | None = None) -> str:
    """The parameter ``name`` (a Python argument name) marked inside a message: Python callers read ``labels_key``,
    the command line ``--labels-key``; with an on/off ``value``, ``probs=False`` and ``--no-probs``."""
    return f"{_MARK}{name}{'' if value is None else f'={value}'}{_MARK}"


def render(message: str, *, flags: bool) -> str:
    """A message with its parameters shown as command-line flags (``--labels-key``) or argument names."""
    def shown_param(match: re.Match[str]) -> str:
        name, value = match.groups()
        if not flags:
            return f"{name}={value}" if value else name
        return f"--{'no-' if value == 'False' else ''}{name.replace('_', '-')}"

    return _PARAM.sub(shown_param, message)


class Note(str):
    """A warning's text: reads as the Python message; ``raw`` keeps the parameter marks, so the CLI can show flags."""

    raw: str

    def __new__(cls, raw: str) -> Note:
        note = super().__new__(cls, render(raw, flags=False))
        note.raw = raw
        return note


class Info(Note):
    """A remark rather than a warning (say, how many groups had no fitting rows): the CLI shows it as ``note:``,
    and not under ``--quiet``; the JSON lists it among the warnings all the same."""


class StoredNote(Note):
    """A note about the stored T alone (ignored: fitted under other options, or stale): said by the commands that
    would use that T, left out by a fit, which replaces it."""


#: Characters that reorder the text around them (bidirectional embeddings, overrides, isolates and marks): a name
#: holding U+202E would show the rest of its line reversed, so every console line and page shows them as escapes.
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_BIDI_ESCAPES = str.maketrans({c: f"\\u{ord(c):04x}" for c in BIDI_CONTROLS})


def neutral(text: str) -> str:
    """``text`` with its bidirectional control characters written as escapes, so that they show, not act."""
    return text.translate(_BIDI_ESCAPES)


def for_cli(text: str | TempcalError) -> str:
    """A message, warning or :class:`TempcalError` as the command line shows it: parameters as flags."""
    return render(text.raw if isinstance(text, (Note, TempcalError)) else text, flags=True)


class TempcalError(ValueError):
    """Bad input or usage: the CLI prints the message on one line and exits with status 2."""

    @property
    def raw(self) -> str:
        """The message with its parameter marks (see :func:`param`)."""
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return render(self.raw, flags=False)

    def prefixed(self, prefix: str) -> TempcalError:
        """The same error (same class) with ``prefix`` (e.g. a file name) in front of its message."""
        return type(self)(prefix + self.raw)


class DataError(TempcalError):
    """The logits or labels themselves are invalid (NaN, out-of-range label, ...)."""


#: Rows with this label are left out, as in ``torch.nn.functional.cross_entropy``.
IGNORE_INDEX = -100
#: The metadata key (safetensors metadata, sidecars, model extra files) that holds a fitted T.
TEMPERATURE_KEY = "tempcal.temperature"
#: The metadata key saying the stored T was fitted on log-probabilities (``"true"``): later reads take log(p) too.
PROBS_KEY = "tempcal.probs"
#: The ``SourceOptions`` fields a kind may keep beside T, and their metadata keys.
READING_KEYS = {"probs": PROBS_KEY, "logits_key": "tempcal.logits_key", "labels_key": "tempcal.labels_key",
                "confidence": "tempcal.confidence", "correct": "tempcal.correct",
                "confidence_scale": "tempcal.confidence_scale"}


# -- temperatures -------------------------------------------------------------------------
def positive_number(value: object) -> float | None:
    """``value`` (text or a number) as a finite float > 0, or None when it is not one."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond any float (10**400)
        return None
    return number if math.isfinite(number) and number > 0 else None


#: The smallest temperature any command takes: logits are multiplied by 1 / T, which must be a finite float64
#: (below this, 1 / T overflows to inf and every probability becomes NaN).
MIN_TEMPERATURE = 1.0 / 1.7976931348623157e308


def temperature_number(value: object) -> float | None:
    """``value`` as a temperature: a finite number > 0 whose inverse is finite too (T >= :data:`MIN_TEMPERATURE`),
    or None when it is not one. Every T a command takes, given or stored, passes here."""
    number = positive_number(value)
    return number if number is not None and number >= MIN_TEMPERATURE else None


def temperature_problem(value: object) -> str:
    """Why ``value`` is not a temperature, as the end of a message."""
    number = positive_number(value)
    if number is not None and number < MIN_TEMPERATURE:
        return f"too small: 1 / T overflows (T must be at least {MIN_TEMPERATURE:.3g})"
    return "not a positive number"


def as_temperature(value: object, what: str = "temperature") -> float:
    """``value`` as a temperature: a finite number > 0 with a finite inverse, else :class:`TempcalError`."""
    number = temperature_number(value)
    if number is None:
        raise TempcalError(f"{what} must be a positive finite number whose inverse is finite, got {value} "
                           f"({temperature_problem(value)})")
    return number


def format_temperature(temperature: float) -> str:
    """The shortest decimal string that reads back as the same float (how T is stored everywhere)."""
    return repr(float(temperature))


def stored_temperature(text: str | bytes | None, where: str) -> float | None:
    """A stored T (metadata value, sidecar entry, model extra file): None when absent, else a positive float."""
    if text is None:
        return None
    value = temperature_number(text)
    if value is None:
        given = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        raise TempcalError(f"{where} '{TEMPERATURE_KEY}' is {shown(given)}, {temperature_problem(text)}")
    return value


def shown(value: object) -> str:
    """``repr`` of a value read from a file, cut to 80 characters: a message stays one line whatever the file holds."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def is_fitted(text: str | float) -> bool:
    """True for ``fitted`` (any case, surrounding spaces ignored)."""
    return isinstance(text, str) and text.strip().lower() == "fitted"


def parse_tau(text: str | float, stored: float | None, source: str | os.PathLike = "SOURCE",
              place: str | None = None) -> float:
    """A temperature from ``--tau``: a finite number > 0, or ``fitted`` for the T stored in ``source`` (``place``
    says where that T would be and what to do, when it is not the safetensors metadata)."""
    if is_fitted(text):
        if stored is None:
            raise TempcalError(f"{param('tau')} fitted: {source} has no stored temperature "
                               f"({place or f'metadata {TEMPERATURE_KEY!r}; run tempcal fit first'})")
        return float(stored)
    value = temperature_number(text)
    if value is None:
        if positive_number(text) is not None:
            raise TempcalError(f"{param('tau')} {text}: {temperature_problem(text)}")
        raise TempcalError(f"{param('tau')} {text}: expected a number > 0 or 'fitted'")
    return value


def check_taus(values: Iterable[str | float]) -> None:
    """Refuse a bad number before any file is read (``fitted`` is resolved once the file is open)."""
    for text in values:
        if not is_fitted(text):
            parse_tau(text, None)


def resolve_taus(values: Sequence[str | float] | None, stored: float | None, source: str | os.PathLike = "SOURCE",
                 *, defaults: Sequence[float] = (), sweep: Sequence[float] = (), sort: bool = True,
                 place: str | None = None) -> list[float]:
    """The temperatures a command reports at, without repeats: the given values (``fitted``: the stored T) and
    ``sweep``; with none, ``defaults`` and ``sweep`` (the stored T joins them), else the stored T, else 1.0."""
    given = [parse_tau(text, stored, source, place) for text in values or ()]
    extra = [float(t) for t in (sweep if values else [*defaults, *sweep])]
    if extra and stored is not None:
        extra.append(float(stored))
    if not values and not extra:
        extra = [float(stored) if stored is not None else 1.0]
    taus = list(dict.fromkeys([*given, *extra]))
    return sorted(taus) if sort or not values else taus


# -- numbers in a range --------------------------------------------------------------------
#: The whole numbers a 64-bit integer holds: the widest any count, index or seed may be.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Integers with more digits than this are shown by their length, not spelled out.
_SHOWN_DIGITS = 24


def shown_value(value: object, *, quote: bool = True) -> str:
    """A value as a message shows it: a 400-digit integer cut short with its length, long text cut short."""
    if isinstance(value, int) and not isinstance(value, bool) and len(digits := str(abs(value))) > _SHOWN_DIGITS:
        return f"{'-' if value < 0 else ''}{digits[:12]}... ({len(digits)} digits)"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f'"{text}"' if quote else text
    return repr(value)


class OutOfRange(TempcalError):
    """A number outside its range: ``expected`` says the range, ``value`` is what was given; callers add the name."""

    def __init__(self, expected: str, value: object) -> None:
        super().__init__(f"expected {expected}, got {shown_value(value)}")
        self.expected = expected
        self.value = value


@dataclass(frozen=True)
class Bounds:
    """The range of a number: ``low`` and ``high`` (None: unbounded), each end included unless it is open."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def contains(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def within(self, low: int, high: int) -> Bounds:
        """These bounds narrowed to ``[low, high]`` (the 64-bit range of a whole number)."""
        lo_in = self.low is not None and self.low >= low
        hi_in = self.high is not None and self.high <= high
        return Bounds(self.low if lo_in else low, self.high if hi_in else high,
                      self.low_open and lo_in, self.high_open and hi_in)

    def describe(self, noun: str = "a number") -> str:
        """``a number in (0, 1]``, ``a whole number from 1 to 100000``, ``a number > 0``."""
        lo, hi = _bound(self.low), _bound(self.high)
        if lo and hi:
            if not (self.low_open or self.high_open):
                return f"{noun} from {lo} to {hi}"
            return f"{noun} in {'(' if self.low_open else '['}{lo}, {hi}{')' if self.high_open else ']'}"
        if lo:
            return f"{noun} {'>' if self.low_open else '>='} {lo}"
        return f"{noun} {'<' if self.high_open else '<='} {hi}" if hi else noun


def _bound(value: float | None) -> str:
    """A bound as messages show it: ``0``, ``100000``, ``9223372036854775807``, ``0.5``."""
    if value is None:
        return ""
    if isinstance(value, int) or (float(value).is_integer() and abs(value) < 1e15):
        return str(int(value))
    return f"{value:g}"


def check_number(value: Any, bounds: Bounds | None = None, *, whole: bool = False) -> Any:
    """``value`` checked: a whole number within ``bounds`` and 64 bits, or a finite number (a float) within
    ``bounds``; else :class:`OutOfRange`. A 400-digit integer is out of range, never an OverflowError."""
    bounds = bounds or Bounds()
    if whole:
        bounds = bounds.within(INT64_MIN, INT64_MAX)
        if not bounds.contains(value):
            raise OutOfRange(bounds.describe("a whole number"), value)
        return int(value)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise OutOfRange(bounds.describe("a finite number"), value)
    if not bounds.contains(number):
        raise OutOfRange(bounds.describe(), value)
    return number


def check_option(name: str, value: Any, bounds: Bounds, *, whole: bool = False) -> Any:
    """The one range check of an option, for the commands and the API alike: ``value`` as :func:`check_number`
    gives it, else ``NAME VALUE: expected RANGE`` (``name``: the flag, or the marked argument name)."""
    try:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise OutOfRange(bounds.describe("a whole number" if whole else "a number"), value)
        return check_number(value, bounds, whole=whole)
    except OutOfRange as exc:
        raise TempcalError(f"{name} {shown_value(value, quote=False)}: expected {exc.expected}") from None


#: Ranges that ``typer.Option(min=, max=)`` cannot say (open ends), each declared once: the commands' options carry
#: them as markers, and the API checks its arguments against the same ones.
POSITIVE = Bounds(0, low_open=True)
FRACTION = Bounds(0, 1, low_open=True)
UNIT = Bounds(0, 1)
NON_NEGATIVE = Bounds(0)
PERCENTILE = Bounds(0, 100, low_open=True)
MISCOVERAGE = Bounds(0, 1, low_open=True, high_open=True)


# -- sizes --------------------------------------------------------------------------------
def whole_number(value: object, what: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``; booleans and fractions are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise TempcalError(f"{what} must be a whole number >= {minimum}, got {value}")
    number = int(value)  # type: ignore[call-overload]
    if maximum is not None and number > maximum:
        raise TempcalError(f"{what} must be at most {maximum}, got {number}")
    return number


#: The most equal-width bins a figure is computed with (every bin is kept, and listed, at every temperature).
MAX_BINS = 100_000
#: The most bootstrap resamples (percentile intervals settle long before; each costs a pass over the samples).
MAX_RESAMPLES = 100_000


def check_bins(bins: object) -> int:
    """The number of equal-width bins: a whole number in ``[1, MAX_BINS]``."""
    return whole_number(bins, "bins", maximum=MAX_BINS)


def check_confidences(confidence: Any) -> None:
    """Per-sample confidences (a float64 numpy array) must lie in [0, 1]: the count and the first bad index."""
    import numpy as np

    bad = ~((confidence >= 0) & (confidence <= 1))
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise TempcalError(f"{int(bad.sum())} confidences outside [0, 1]; first at index {first} "
                           f"({confidence[first]!r})")


# -- labels -------------------------------------------------------------------------------
def check_labels(labels: Any, logits_shape: Sequence[int], where: str = "", name: str = "labels",
                 logits_name: str = "logits") -> torch.Tensor:
    """Integer labels matching logits of ``logits_shape`` as a flat int64 tensor: logits ``[N, C]`` / ``[N]`` take
    labels ``[N]`` (or ``[N, 1]``), token-level ``[B, L, V]`` take ``[B, L]``; ``where`` starts every message."""
    import torch

    y = torch.as_tensor(labels)
    if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
        raise DataError(f"{where}'{name}' has dtype {str(y.dtype).removeprefix('torch.')}; expected an integer dtype")
    shape = list(logits_shape)
    if len(shape) == 3:
        if list(y.shape) != shape[:2]:
            raise DataError(f"{where}'{logits_name}' of shape {shape} has {shape[0] * shape[1]} rows but '{name}' "
                            f"has shape {list(y.shape)} (token-level logits [B, L, V] need labels [B, L])")
        return y.reshape(-1).to(torch.int64)
    if y.dim() == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.dim() != 1:
        raise DataError(f"{where}'{name}' has shape {list(y.shape)}; expected [N]")
    rows = shape[0] if shape else 0
    if y.shape[0] != rows:
        raise DataError(f"{where}'{logits_name}' has {rows} rows but '{name}' has {y.shape[0]}")
    return y.to(torch.int64)


# -- probabilities ------------------------------------------------------------------------
#: How a probabilities message names the choice: ``probs=True`` in Python, ``--probs`` on the command line.
AS_LOGITS, AS_PROBS = param("probs", False), param("probs", True)


class ProbabilitiesError(DataError):
    """Probabilities given where logits are read, or a T fitted on log(p) about to meet raw values; the message names
    the choice as the caller makes it (``probs=True`` in Python, ``--probs`` on the command line)."""


def probabilities_refused(what: str, where: str = "") -> ProbabilitiesError:
    """The refusal of values that look like probabilities when the caller did not say whether they are."""
    return ProbabilitiesError(f"{where}every row of {what} looks like a probability vector (values in [0, 1], each "
                              f"row summing to 1); pass {AS_PROBS}, or {AS_LOGITS} to treat the values as logits")


def stored_probs(text: str | None, where: str) -> bool:
    """Whether metadata says the stored T was fitted on probabilities (``"true"``; absent or ``"false"``: no)."""
    if text in (None, "false", "true"):
        return text == "true"
    raise TempcalError(f"{where} '{PROBS_KEY}' is {shown(text)}; expected \"true\" or \"false\" (fix or delete it, "
                       "or fit again)")


def check_alphas(alphas: Sequence[float]) -> list[float]:
    """The conformal miscoverage levels, each strictly between 0 and 1, in the order given (repeats dropped)."""
    return list(dict.fromkeys(check_option(param("conformal_alpha"), alpha, MISCOVERAGE) for alpha in alphas))


__all__ = ["FRACTION", "IGNORE_INDEX", "MAX_BINS", "MAX_RESAMPLES", "MISCOVERAGE", "NON_NEGATIVE", "PERCENTILE",
           "POSITIVE", "PROBS_KEY", "READING_KEYS", "TEMPERATURE_KEY", "UNIT", "Bounds", "DataError", "Info", "Note",
           "OutOfRange", "ProbabilitiesError", "StoredNote", "TempcalError", "as_temperature", "check_alphas",
           "check_bins", "check_confidences", "check_labels", "check_number", "check_option", "check_taus", "for_cli",
           "format_temperature", "is_fitted", "neutral", "param", "parse_tau", "positive_number",
           "probabilities_refused", "render", "resolve_taus", "shown", "shown_value", "stored_probs",
           "stored_temperature", "temperature_number", "temperature_problem", "whole_number"]
