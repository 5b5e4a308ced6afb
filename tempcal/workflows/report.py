"""``tempcal report`` as a function: calibration at several temperatures from one pass."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..metrics.calibration import DEFAULT_BINS, CalibrationMetrics, evaluate_many
from ..sources.base import SourceOptions
from ..sources.registry import Source, open_source
from ..validation import check_taus, resolve_taus
from .common import check_stored_reading, extra_figures, scan_source, uses_stored


@dataclass
class ReportResult:
    """Calibration of one SOURCE at several temperatures, all from one pass."""

    source: str
    num_classes: int
    count: int
    stored_temperature: float | None
    results: list[CalibrationMetrics]
    sweep: list[float] = field(default_factory=list)  # the sweep's temperatures, if one was asked for
    bins: int = DEFAULT_BINS
    device: str = "cpu"
    warnings: list[str] = field(default_factory=list)
    extras: list[dict] = field(default_factory=list)  # per temperature: other estimators, bootstrap intervals
    opened: Any = field(default=None, repr=False)  # the OpenedSource (a model's logits can be saved from it)

    @property
    def sweep_best(self) -> float | None:
        """The sweep temperature with the lowest NLL."""
        return self.sweep_lowest("nll")

    def sweep_lowest(self, figure: str) -> float | None:
        """The sweep temperature with the lowest ``figure`` (``nll``, ``smece``, ``aurc``...; NaN never counts)."""
        in_sweep = [m for m in self.results if m.tau in self.sweep and getattr(m, figure) == getattr(m, figure)]
        return min(in_sweep, key=lambda m: getattr(m, figure)).tau if in_sweep else None

    def to_json(self) -> dict:
        rows = []
        for k, m in enumerate(self.results):
            row = m.to_dict()
            row["stored"] = self.stored_temperature is not None and m.tau == self.stored_temperature
            if self.extras:
                row.update(self.extras[k])
            rows.append(row)
        return {"results": rows, "source": self.source, "n": self.count, "num_classes": self.num_classes,
                "stored_temperature": self.stored_temperature, "bins_count": self.bins,
                "sweep": self._sweep_json() if self.sweep else None,
                "min_nll_tau": min(self.results, key=lambda m: m.nll).tau if self.results else None,
                "device": self.device, "warnings": self.warnings}

    def _sweep_json(self) -> dict:
        """The sweep's temperatures and, for each decision, its best: the lowest NLL, ECE, smooth ECE and AURC."""
        return {"taus": self.sweep, "best_nll_tau": self.sweep_best, "best_ece_tau": self.sweep_lowest("ece"),
                "best_smece_tau": self.sweep_lowest("smece"), "best_aurc_tau": self.sweep_lowest("aurc")}


def report_file(source: Source, *, taus: Sequence[float | str] | None = None, sweep: Sequence[float] | None = None,
                bins: int = DEFAULT_BINS, device: str = "auto", chunk_rows: int | None = None,
                estimators: Sequence[str] = (), bootstrap: int = 0, seed: int = 0,
                options: SourceOptions | None = None, **keys: Any) -> ReportResult:
    """Calibration metrics of ``source`` at each temperature (``fitted`` = the stored T), in one pass.

    Without ``taus`` (and no ``sweep``): the stored T, else 1. ``options`` or keyword arguments
    (``logits_key=...``) say how to read the source, as for :func:`open_source`; a T fitted on probabilities
    is applied to log(p), as it was fitted.
    """
    warnings: list[str] = []
    check_taus(taus or [])
    loaded = open_source(source, options, **keys)
    stored = loaded.stored_temperature
    sweep = list(sweep or [])
    check_stored_reading(loaded, uses_stored(taus, sweep))
    resolved = resolve_taus(taus, stored, loaded.name, sweep=sweep, place=loaded.temperature_place())
    scan = scan_source(loaded, device=device, chunk_rows=chunk_rows, probs=loaded.options.probs, warnings=warnings)
    results = evaluate_many(scan, resolved, bins=bins)
    extras = extra_figures(scan, resolved, bins=bins, estimators=estimators, bootstrap=bootstrap, seed=seed)
    return ReportResult(loaded.name, loaded.data.num_classes, scan.num_samples, stored, results, sweep, bins,
                        str(scan.device), warnings, extras, loaded)


__all__ = ["ReportResult", "report_file"]
