"""Pipeline schedules as plain functions: (stages, microbatches) -> per-stage op order."""

from .pipeline import SCHEDULES, Step, gpipe, one_f_one_b, peak_inflight, step_label

__all__ = ["SCHEDULES", "Step", "gpipe", "one_f_one_b", "peak_inflight", "step_label"]
