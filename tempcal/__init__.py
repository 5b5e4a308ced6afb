"""tempcal: post-hoc temperature scaling and calibration metrics for classifier logits.

The names below are imported lazily, so that ``import tempcal`` (and the CLI's ``--help``)
does not pay for importing torch until a function that needs it is used.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from ._version import __version__

_EXPORTS = {
    "TempcalError": "errors",
    "DataError": "errors",
    "LogitsData": "data",
    "as_logits_data": "data",
    "resolve_device": "data",
    "Scan": "scan",
    "fit_temperature": "fitting",
    "FitResult": "fitting",
    "T_MIN": "fitting",
    "T_MAX": "fitting",
    "CalibrationMetrics": "metrics",
    "ReliabilityBin": "metrics",
    "calibration_metrics": "metrics",
    "evaluate": "metrics",
    "evaluate_many": "metrics",
    "load_logits": "loading",
    "read_header": "loading",
    "TEMPERATURE_KEY": "loading",
    "write_temperature": "writeback",
    "stratified_split": "splitting",
    "fit_file": "workflows",
    "FitReport": "workflows",
    "report_file": "workflows",
    "ReportResult": "workflows",
    "open_sharded": "sharded",
    "ShardedLogits": "sharded",
    "ood_file": "ood",
    "OodReport": "ood",
    "OodMetrics": "ood",
    "detection_metrics": "ood",
    "fpr_at_recall": "ood",
    "score_samples": "ood",
    "load_unlabelled": "ood",
    "estimators_for": "estimators",
    "ece_equal_mass": "estimators",
    "rms_calibration_error": "estimators",
    "debiased_l2_calibration_error": "estimators",
    "classwise_sums": "estimators",
    "classwise_ece": "estimators",
    "TemperatureScaler": "scaler",
    "TemperatureScaling": "scaler",
    "load_any": "formats",
    "write_stored_temperature": "formats",
    "read_stored_temperature": "formats",
    "is_model_path": "models",
    "load_model": "models",
    "run_model": "models",
    "save_logits": "models",
    "save_calibrated_model": "models",
    "read_model_temperature": "models",
    "open_model_source": "models",
    "odin_scores": "models",
    "odin_ood": "models",
    "bootstrap_intervals": "bootstrap",
    "per_sample": "bootstrap",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from .bootstrap import bootstrap_intervals, per_sample
    from .data import LogitsData, as_logits_data, resolve_device
    from .errors import DataError, TempcalError
    from .estimators import (
        classwise_ece,
        classwise_sums,
        debiased_l2_calibration_error,
        ece_equal_mass,
        estimators_for,
        rms_calibration_error,
    )
    from .fitting import T_MAX, T_MIN, FitResult, fit_temperature
    from .formats import load_any, read_stored_temperature, write_stored_temperature
    from .loading import TEMPERATURE_KEY, load_logits, read_header
    from .metrics import CalibrationMetrics, ReliabilityBin, calibration_metrics, evaluate, evaluate_many
    from .models import (
        is_model_path,
        load_model,
        odin_ood,
        odin_scores,
        open_model_source,
        read_model_temperature,
        run_model,
        save_calibrated_model,
        save_logits,
    )
    from .ood import OodMetrics, OodReport, detection_metrics, fpr_at_recall, load_unlabelled, ood_file, score_samples
    from .scaler import TemperatureScaler, TemperatureScaling
    from .scan import Scan
    from .sharded import ShardedLogits, open_sharded
    from .splitting import stratified_split
    from .workflows import FitReport, ReportResult, fit_file, report_file
    from .writeback import write_temperature


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tempcal' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
