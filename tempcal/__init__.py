"""tempcal: post-hoc temperature scaling, calibration metrics and OOD scores for classifier logits.

The names below are imported lazily, so that ``import tempcal`` (and the CLI's ``--help``)
does not pay for importing torch until a function that needs it is used. :data:`_MODULES`
is the one list of them; a test checks the ``TYPE_CHECKING`` imports below match it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from ._version import __version__

#: Each module (relative to the package) and the public names it defines.
_MODULES = {
    # errors and checks
    "errors": ("TempcalError", "DataError", "ProbabilitiesError", "TEMPERATURE_KEY", "PROBS_KEY"),
    # sources -> data
    "sources.registry": ("open_source", "read_stored_temperature", "write_stored_temperature"),
    "sources.base": ("SourceOptions", "OpenedSource"),
    "core.data": ("LogitsData", "as_logits_data"),
    "core.parallel": ("resolve_device",),
    "io.safetensors_header": ("read_header", "write_temperature"),
    # the scan and the fit
    "core.scan": ("Scan",),
    "core.splitting": ("stratified_split",),
    "subsets.fits": ("fit_temperature",),  # core's fit, with groups= and folds= registered
    "core.fitting": ("FitResult", "T_MIN", "T_MAX"),
    # metrics and scores
    "metrics.calibration": ("CalibrationMetrics", "ReliabilityBin", "calibration_metrics", "evaluate", "evaluate_many",
                            "estimators_for", "ece_equal_mass", "rms_calibration_error",
                            "debiased_l2_calibration_error", "classwise_ece"),
    "metrics.bootstrap": ("bootstrap_intervals",),
    "metrics.detection": ("OodMetrics", "detection_metrics", "fpr_at_recall"),
    # whole commands
    "workflows.fit": ("fit_file", "FitReport"),
    "workflows.report": ("report_file", "ReportResult"),
    "workflows.ood": ("ood_file", "OodReport", "score_samples"),
    "workflows.inspect": ("inspect_file", "InspectReport"),
    "workflows.apply": ("apply_file", "ApplyResult"),
    # deployment
    "scaler": ("TemperatureScaler", "TemperatureScaling"),
    # models
    "models.detect": ("is_model_path",),
    "models.base": ("LoadedModel",),
    "models.run": ("run_model",),
    "models.save": ("save_logits", "save_calibrated_model"),
    "models.odin": ("odin_scores",),
}
#: Public name -> the module that defines it.
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}

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
