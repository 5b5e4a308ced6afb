"""``tempcal apply`` as a function: every row of SOURCE, in file order, scaled by the stored T (or its group's T)
and streamed to a file chunk by chunk (:mod:`tempcal.io.streamed`): all rows' probabilities are never held."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.scan import RowBlock, Scan, Scratch
from ..errors import TempcalError, check_taus, format_temperature, is_fitted, param, parse_tau
from ..io.paths import same_file
from ..io.streamed import Planned, output_format, write_streamed
from ..sources.base import OpenedSource, SourceOptions
from ..sources.registry import Source, open_source
from ..sources.stored_groups import parse_stored_groups
from ..subsets.options import row_temperatures
from .common import check_stored_reading, scan_source

#: What ``as_`` may ask for, and the name of the output's tensor for each.
OUTPUT_KEYS = {"probs": "probs", "logits": "logits", "log-probs": "log_probs"}
#: Words for each, as the console and messages say them.
WHAT = {"probs": "calibrated probabilities", "logits": "logits / T", "log-probs": "calibrated log-probabilities"}


@dataclass
class ApplyResult:
    """What ``tempcal apply`` wrote: where, which tensor, at which T (per group, where stored)."""

    source: str
    output: str
    as_: str
    key: str
    temperature: float  # the global T: stored, or given
    tau_from: str  # "stored" or "tau"
    shape: list[int]
    dtype: str
    labels: bool  # the labels were written beside the values
    num_classes: int
    passes: int
    device: str
    group_key: str | None = None
    group_temperatures: dict[str, float] | None = None  # the T of every group the rows hold
    group_copied: bool = False  # the group tensor (group_key) was written beside the values
    warnings: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.shape[0]

    def to_json(self) -> dict:
        return {"source": self.source, "output": self.output, "as": self.as_, "key": self.key,
                "temperature": self.temperature, "tau_from": self.tau_from, "rows": self.rows, "shape": self.shape,
                "dtype": self.dtype, "labels": self.labels, "num_classes": self.num_classes,
                "group_key": self.group_key, "group_temperatures": self.group_temperatures,
                "group_copied": self.group_copied, "passes": self.passes,
                "device": self.device, "warnings": self.warnings}


def check_as(value: str) -> str:
    """``as_``: probs, logits or log-probs (any case; ``log_probs`` too)."""
    text = str(getattr(value, "value", value)).strip().lower().replace("_", "-")
    if text not in OUTPUT_KEYS:
        raise TempcalError(f"{param('as_')} {value}: expected probs, logits or log-probs")
    return text


def check_output(output: str | os.PathLike) -> str:
    """The output's format from its suffix (.safetensors, .npz, .npy), checked before any file is read."""
    return output_format(output, f"{param('output')} {output}")


def apply_file(source: Source, output: str | os.PathLike, *, as_: str = "probs", tau: str | float | None = None,
               groups: bool = True, device: str = "auto", chunk_rows: int | None = None,
               options: SourceOptions | None = None, **keys: Any) -> ApplyResult:
    """Write ``source``'s calibrated probabilities (``as_="logits"``: logits / T; ``"log-probs"``) to ``output``.

    T is the stored one (``tau`` None or ``"fitted"``), each row at its group's stored T when SOURCE stores
    per-group temperatures (``groups=False``: the global T for every row); or ``tau``, a number, for every row.
    ``options`` or keyword arguments (``logits_key=...``) say how to read SOURCE, as for :func:`open_source`;
    labels are optional. A T fitted on probabilities is applied to log(p), as it was fitted.
    """
    as_ = check_as(as_)
    if tau is not None:
        check_taus([tau])
    options = (options or SourceOptions()).but(ignore_index=None, **keys)  # every row is written
    loaded = open_source(source, options, labels_optional=True)
    writer = loaded.kind.apply_writer(loaded)
    suffix = check_output(output) if writer is None else ""
    if writer is not None and as_ != "probs":
        raise TempcalError(f"{param('as_')} {as_}: {loaded.name} gets its calibrated confidences (probs) added")
    for path in loaded.paths:
        if same_file(path, output):
            raise TempcalError(f"{param('output')} {output}: would overwrite SOURCE {path}; give it a path of its own")
    temperature, tau_from = _temperature(loaded, tau)
    warnings: list[str] = []
    per_row: float | torch.Tensor = temperature  # each row's T: the global T, or its group's
    group_key, per_group, group_values = None, None, None
    metadata = loaded.kind.stored_metadata(loaded.paths[0]) if loaded.paths else {}  # shards are written alike
    stored = parse_stored_groups(metadata, f"{loaded.name}:") if groups and tau_from == "stored" else None
    if stored is not None:
        per_row, per_group, group_values = row_temperatures(loaded, stored, temperature, warnings)
        group_key = stored.key
    scan = scan_source(loaded, device=device, chunk_rows=chunk_rows, probs=loaded.options.probs, warnings=warnings,
                       labelled=False)
    if writer is not None:  # the kind writes its own output (a confidence table): each row's P(class 1)
        chunks = _scaled_chunks(scan, "probs", per_row, False)
        calibrated = torch.cat([chunk[:, -1].to(torch.float64).cpu() for chunk in chunks]).numpy()
        key, shape, dtype = writer(str(output), calibrated), [len(calibrated)], "float64"
        with_labels, group_copied = loaded.has_labels, False
    else:
        written = torch.float64 if scan.data.dtype == torch.float64 else torch.float32
        single = as_ == "logits" and scan.data.binary  # a single binary logit as logits / T keeps its [N] form
        size = (scan.num_samples,) if single else (scan.num_samples, scan.num_classes)
        planned = [Planned(OUTPUT_KEYS[as_], written, size, lambda: _scaled_chunks(scan, as_, per_row, single))]
        with_labels = loaded.has_labels and suffix != ".npy"
        if with_labels:
            labels = scan.data.labels.to(torch.int64)
            planned.append(Planned("labels", torch.int64, (labels.numel(),), lambda: [labels]))
        group_copied = suffix != ".npy" and _copy_groups(planned, group_key, group_values, loaded.name, warnings)
        write_streamed(output, planned, metadata=_output_metadata(loaded, as_, temperature, group_key, per_group),
                       what=param("output"))
        key, shape, dtype = planned[0].name, list(planned[0].shape), str(planned[0].dtype).removeprefix("torch.")
    return ApplyResult(loaded.name, str(output), as_, key, temperature, tau_from, shape, dtype, with_labels,
                       scan.num_classes, scan.passes, str(scan.device), group_key, per_group, group_copied, warnings)


def _copy_groups(planned: list[Planned], key: str | None, values: torch.Tensor | None, name: str,
                 warnings: list[str]) -> bool:
    """Plan the group tensor KEY beside the values (each output row's group, as SOURCE holds it), so that the rows
    stay grouped downstream; False when there is none, or when KEY is the name of a tensor written already."""
    if key is None or values is None:
        return False
    if key in {p.name for p in planned}:
        warnings.append(f"{name}: the group tensor '{key}' is not copied: the output's tensor '{key}' has that name")
        return False
    planned.append(Planned(key, torch.int64, (values.numel(),), lambda: [values]))
    return True


def _temperature(loaded: OpenedSource, tau: str | float | None) -> tuple[float, str]:
    """The global T and where it came from: the stored T (``tau`` None or ``fitted``), or ``tau``."""
    if tau is not None and not is_fitted(tau):
        return parse_tau(tau, None), "tau"
    check_stored_reading(loaded, True)
    stored = loaded.stored_temperature
    if stored is None:
        raise TempcalError(f"{loaded.name}: has no stored temperature ({loaded.temperature_place()}; or give the "
                           f"temperature with {param('tau')} T)")
    return stored, "stored"


def _scaled_chunks(scan: Scan, as_: str, temperature: float | torch.Tensor, single: bool) -> Iterator[torch.Tensor]:
    """One pass over the scan's blocks (shared among the pass's threads, in row order): each block's logits divided
    by its rows' T, then as asked. An overflow is raised for the first block, in row order, that has one."""
    written = torch.float64 if scan.data.dtype == torch.float64 else torch.float32  # as apply_file writes it

    def block(b: RowBlock, _: Scratch) -> torch.Tensor | TempcalError:
        z, n = b.z, b.z.shape[0]
        t = temperature if isinstance(temperature, float) else temperature[b.start:b.start + n, None].to(z.device)
        try:
            return _scaled(z, t, as_, single, written)
        except TempcalError as error:  # raised by the caller, in row order
            return error

    for out in scan.block_pass(block):
        if isinstance(out, TempcalError):
            raise out
        yield out


def _scaled(z: torch.Tensor, t: float | torch.Tensor, as_: str, single: bool, written: torch.dtype) -> torch.Tensor:
    """One block's logits ``z`` divided by ``t``, then as asked."""
    if not _overflows(z, t, written):
        scaled = z / (t if isinstance(t, float) else t.to(z.dtype))
    elif as_ == "logits":
        shown = float(t) if isinstance(t, float) else float(t.min())
        raise TempcalError(f"the logits / T overflow {str(written).removeprefix('torch.')} at T = {shown!r}; "
                           "write probs or log-probs (--as), or use a larger T; nothing written")
    else:  # at a tiny T, z / T overflows: each row less its largest logit first (in float64), then / T
        scaled = (z.to(torch.float64) - z.max(1, keepdim=True).values.to(torch.float64)) / t
    if as_ == "logits":
        return scaled[:, 1] if single else scaled  # a binary logit z is the row [0, z]
    return (torch.softmax(scaled, 1) if as_ == "probs" else torch.log_softmax(scaled, 1)).to(z.dtype)


def _overflows(z: torch.Tensor, t: float | torch.Tensor, written: torch.dtype) -> bool:
    """Whether ``z / t`` could leave the range of ``z``'s dtype or the one ``written`` (or ``t`` is below it)."""
    narrow = min(torch.finfo(z.dtype).max, torch.finfo(written).max)
    smallest = float(t) if isinstance(t, float) else float(t.min())
    largest = float(torch.nan_to_num(z, posinf=0.0, neginf=0.0).abs().max()) if z.numel() else 0.0
    return smallest < max(torch.finfo(z.dtype).tiny, torch.finfo(written).tiny) or largest / smallest >= narrow / 4


def _output_metadata(loaded: OpenedSource, as_: str, temperature: float, group_key: str | None,
                     per_group: dict[str, float] | None) -> dict[str, str]:
    """What the output says of itself (safetensors only): what it holds, at which T, from which SOURCE."""
    metadata = {"tempcal.applied": as_, "tempcal.applied_temperature": format_temperature(temperature),
                "tempcal.applied_to": loaded.name}
    if loaded.options.probs:
        metadata["tempcal.applied_to_probs"] = "true"  # T scaled log(p)
    if group_key is not None and per_group is not None:
        metadata["tempcal.applied_group_key"] = group_key
        metadata["tempcal.applied_group_temperatures"] = json.dumps(per_group)
    return metadata


__all__ = ["ApplyResult", "apply_file", "check_output"]
