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
    "LogitsData": "core.data",
    "as_logits_data": "core.data",
    "resolve_device": "core.data",
    "Scan": "core.scan",
    "fit_temperature": "core.fitting",
    "FitResult": "core.fitting",
    "T_MIN": "core.fitting",
    "T_MAX": "core.fitting",
    "CalibrationMetrics": "metrics.calibration",
    "ReliabilityBin": "metrics.calibration",
    "calibration_metrics": "metrics.calibration",
    "evaluate": "metrics.calibration",
    "evaluate_many": "metrics.calibration",
    "load_logits": "io.safetensors_header",
    "read_header": "io.safetensors_header",
    "TEMPERATURE_KEY": "io.safetensors_header",
    "write_temperature": "io.writeback",
    "stratified_split": "core.splitting",
    "fit_file": "workflows.common",
    "FitReport": "workflows.common",
    "report_file": "workflows.common",
    "ReportResult": "workflows.common",
    "open_sharded": "sources.safetensors",
    "ShardedLogits": "sources.safetensors",
    "ood_file": "workflows.ood",
    "OodReport": "workflows.ood",
    "OodMetrics": "workflows.ood",
    "detection_metrics": "workflows.ood",
    "fpr_at_recall": "workflows.ood",
    "score_samples": "workflows.ood",
    "load_unlabelled": "workflows.ood",
    "estimators_for": "metrics.estimators",
    "ece_equal_mass": "metrics.estimators",
    "rms_calibration_error": "metrics.estimators",
    "debiased_l2_calibration_error": "metrics.estimators",
    "classwise_sums": "metrics.estimators",
    "classwise_ece": "metrics.estimators",
    "TemperatureScaler": "scaler",
    "TemperatureScaling": "scaler",
    "load_any": "sources.formats",
    "write_stored_temperature": "sources.formats",
    "read_stored_temperature": "sources.formats",
    "is_model_path": "models.torchscript",
    "load_model": "models.torchscript",
    "run_model": "models.torchscript",
    "save_logits": "models.torchscript",
    "save_calibrated_model": "models.torchscript",
    "read_model_temperature": "models.torchscript",
    "open_model_source": "models.torchscript",
    "odin_scores": "models.torchscript",
    "odin_ood": "models.torchscript",
    "bootstrap_intervals": "metrics.bootstrap",
    "per_sample": "metrics.bootstrap",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from .core.data import LogitsData, as_logits_data, resolve_device
    from .core.fitting import T_MAX, T_MIN, FitResult, fit_temperature
    from .core.scan import Scan
    from .core.splitting import stratified_split
    from .errors import DataError, TempcalError
    from .io.safetensors_header import TEMPERATURE_KEY, load_logits, read_header
    from .io.writeback import write_temperature
    from .metrics.bootstrap import bootstrap_intervals, per_sample
    from .metrics.calibration import CalibrationMetrics, ReliabilityBin, calibration_metrics, evaluate, evaluate_many
    from .metrics.estimators import (
        classwise_ece,
        classwise_sums,
        debiased_l2_calibration_error,
        ece_equal_mass,
        estimators_for,
        rms_calibration_error,
    )
    from .models.torchscript import (
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
    from .scaler import TemperatureScaler, TemperatureScaling
    from .sources.formats import load_any, read_stored_temperature, write_stored_temperature
    from .sources.safetensors import ShardedLogits, open_sharded
    from .workflows.common import FitReport, ReportResult, fit_file, report_file
    from .workflows.ood import (
        OodMetrics,
        OodReport,
        detection_metrics,
        fpr_at_recall,
        load_unlabelled,
        ood_file,
        score_samples,
    )


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tempcal' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
