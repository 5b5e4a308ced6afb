"""``tempcal report``: calibration metrics at one or more temperatures."""
