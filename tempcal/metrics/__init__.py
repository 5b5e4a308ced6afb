"""tempcal.metrics.calibration."""
