"""Capture decode steps of a live program: a step-window profiler and the hooks behind `decodegap record`.

Importing this package is cheap (stdlib only); torch is imported when an enabled profiler leaves warmup.
"""

from decodegap.capture.profiler import ENV_ENABLE, METADATA_KEY, STEP_PREFIX, StepProfiler, profile_steps

__all__ = ["ENV_ENABLE", "METADATA_KEY", "STEP_PREFIX", "StepProfiler", "profile_steps"]
