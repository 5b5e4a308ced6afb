"""tempcal: post-hoc temperature scaling, calibration metrics and OOD scores for classifier logits.

The names below are imported lazily, so that ``import tempcal`` (and the CLI's ``--help``)
does not pay for importing torch until a function that needs it is used. :data:`_EXPORTS`
is the one list of them; a test checks the ``TYPE_CHECKING`` imports below match it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from ._version import __version__

#: Public name -> the module that defines it.
_EXPORTS = {
    # errors and checks
    "TempcalError": "errors",
    "DataError": "errors",
    "ProbabilitiesError": "errors",
    "TEMPERATURE_KEY": "errors",
    "PROBS_KEY": "errors",
    # sources -> data
    "open_source": "sources.registry",
    "read_stored_temperature": "sources.registry",
    "write_stored_temperature": "sources.registry",
    "SourceOptions": "sources.base",
    "OpenedSource": "sources.base",
    "LogitsData": "core.data",
    "as_logits_data": "core.data",
    "resolve_device": "core.parallel",
    "read_header": "io.safetensors_header",
    # the scan and the fit
    "Scan": "core.scan",
    "stratified_split": "core.splitting",
    "fit_temperature": "subsets.fits",  # core's fit, with groups= and folds= registered
    "FitResult": "core.fitting",
    "T_MIN": "core.fitting",
    "T_MAX": "core.fitting",
    # metrics and scores
    "CalibrationMetrics": "metrics.calibration",
    "ReliabilityBin": "metrics.calibration",
    "calibration_metrics": "metrics.calibration",
    "evaluate": "metrics.calibration",
    "evaluate_many": "metrics.calibration",
    "estimators_for": "metrics.calibration",
    "ece_equal_mass": "metrics.calibration",
    "rms_calibration_error": "metrics.calibration",
    "debiased_l2_calibration_error": "metrics.calibration",
    "classwise_ece": "metrics.calibration",
    "bootstrap_intervals": "metrics.bootstrap",
    "OodMetrics": "metrics.detection",
    "detection_metrics": "metrics.detection",
    "fpr_at_recall": "metrics.detection",
    # whole commands
    "fit_file": "workflows.fit",
    "FitReport": "workflows.fit",
    "report_file": "workflows.report",
    "ReportResult": "workflows.report",
    "ood_file": "workflows.ood",
    "OodReport": "workflows.ood",
    "score_samples": "workflows.ood",
    "inspect_file": "workflows.inspect",
    "InspectReport": "workflows.inspect",
    "apply_file": "workflows.apply",
    "ApplyResult": "workflows.apply",
    # write-back and deployment
    "write_temperature": "io.safetensors_header",
    "TemperatureScaler": "scaler",
    "TemperatureScaling": "scaler",
    # models
    "is_model_path": "models.detect",
    "LoadedModel": "models.base",
    "run_model": "models.run",
    "save_logits": "models.save",
    "save_calibrated_model": "models.save",
    "odin_scores": "models.odin",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from .core.data import LogitsData, as_logits_data
    from .core.fitting import T_MAX, T_MIN, FitResult
    from .core.parallel import resolve_device
    from .core.scan import Scan
    from .core.splitting import stratified_split
    from .errors import PROBS_KEY, TEMPERATURE_KEY, DataError, ProbabilitiesError, TempcalError
    from .io.safetensors_header import read_header, write_temperature
    from .metrics.bootstrap import bootstrap_intervals
    from .metrics.calibration import (
        CalibrationMetrics,
        ReliabilityBin,
        calibration_metrics,
        classwise_ece,
        debiased_l2_calibration_error,
        ece_equal_mass,
        estimators_for,
        evaluate,
        evaluate_many,
        rms_calibration_error,
    )
    from .metrics.detection import OodMetrics, detection_metrics, fpr_at_recall
    from .models.base import LoadedModel
    from .models.detect import is_model_path
    from .models.odin import odin_scores
    from .models.run import run_model
    from .models.save import save_calibrated_model, save_logits
    from .scaler import TemperatureScaler, TemperatureScaling
    from .sources.base import OpenedSource, SourceOptions
    from .sources.registry import open_source, read_stored_temperature, write_stored_temperature
    from .subsets.fits import fit_temperature
    from .workflows.apply import ApplyResult, apply_file
    from .workflows.fit import FitReport, fit_file
    from .workflows.inspect import InspectReport, inspect_file
    from .workflows.ood import OodReport, ood_file, score_samples
    from .workflows.report import ReportResult, report_file


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tempcal' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
