"""Calibration: the kernel constants fitted from kernel timings (fit.py) and the
calibration sets' published rows as scenarios to validate against (validation.py)."""
