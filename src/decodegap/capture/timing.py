"""Time target calls without the profiler: CUDA events when the program uses CUDA, else the wall clock.

Also the summary of those samples (median, p10/p90, and whether they fall into two groups) that goes into the
trace metadata as `unprofiled_step_ms`. Stdlib only.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

# The bimodality rule (docs/record.md, "Unprofiled timing"): split the sorted samples at their widest gap, among
# splits that leave at least BIMODAL_MIN_SHARE of the samples (and 2) on each side. The samples are two groups
# when that gap is at least BIMODAL_GAP_FACTOR times the larger of the two sides' spreads and at least
# BIMODAL_MIN_REL_GAP of the median. The spread of a side is its range (below 10 samples) or its p10-p90 width.
# Checked on unimodal noise (normal, lognormal, uniform, exponential, Pareto): under 3% false positives at 10
# samples, none at 20 or more; two groups 3x apart are found every time from 10 samples.
BIMODAL_MIN_SAMPLES = 8
BIMODAL_MIN_SHARE = 0.2
BIMODAL_GAP_FACTOR = 2.0
BIMODAL_MIN_REL_GAP = 0.05
_RANGE_BELOW = 10


def cuda_in_use(torch: Any) -> bool:
    # is_initialized, not is_available: a CPU program on a GPU host must not be timed (or profiled) as CUDA.
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001
        return False


@dataclass(frozen=True)
class Mode:
    median: float
    count: int


@dataclass(frozen=True)
class Spread:
    """What the samples look like: median, p10/p90 (linear interpolation), and their groups if two."""

    median: float | None
    p10: float | None
    p90: float | None
    bimodal: bool
    modes: tuple[Mode, ...]


def percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); `ordered` sorted and non-empty."""
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _side_spread(side: list[float]) -> float:
    if len(side) < _RANGE_BELOW:
        return side[-1] - side[0]
    return percentile(side, 0.9) - percentile(side, 0.1)


def two_modes(samples: list[float]) -> tuple[list[float], list[float]] | None:
    """The two groups of samples under the documented rule, or None when they form one."""
    ordered = sorted(samples)
    n = len(ordered)
    if n < BIMODAL_MIN_SAMPLES:
        return None
    least = max(2, math.ceil(BIMODAL_MIN_SHARE * n))
    splits = range(least, n - least + 1)
    if not splits:
        return None
    cut = max(splits, key=lambda k: ordered[k] - ordered[k - 1])
    low, high = ordered[:cut], ordered[cut:]
    gap = high[0] - low[-1]
    if gap < BIMODAL_GAP_FACTOR * max(_side_spread(low), _side_spread(high)):
        return None
    if gap < BIMODAL_MIN_REL_GAP * statistics.median(ordered):
        return None
    return low, high


def spread(samples: list[float]) -> Spread:
    if not samples:
        return Spread(None, None, None, False, ())
    ordered = sorted(samples)
    groups = two_modes(ordered)
    modes = tuple(Mode(float(statistics.median(g)), len(g)) for g in groups) if groups else ()
    return Spread(
        median=float(statistics.median(ordered)),
        p10=percentile(ordered, 0.1),
        p90=percentile(ordered, 0.9),
        bimodal=groups is not None,
        modes=modes,
    )


def summary(samples: list[float], call_index: list[int], clock: str) -> dict[str, Any]:
    """The `unprofiled_step_ms` metadata: samples in call order with the target call index of each."""
    s = spread(samples)
    return {
        "median": None if s.median is None else round(s.median, 6),
        "samples": [round(x, 6) for x in samples],
        "call_index": list(call_index),
        "clock": clock,
        "p10": None if s.p10 is None else round(s.p10, 6),
        "p90": None if s.p90 is None else round(s.p90, 6),
        "bimodal": s.bimodal,
        "modes": [{"median": round(m.median, 6), "count": m.count} for m in s.modes],
    }


class StepTimer:
    """Collects one duration per call. CUDA events are read once, at `result()`, so the timed steps run
    back to back as they would without us (no per-step synchronize)."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self.clock = "cuda_events" if cuda_in_use(torch) else "wall"
        self._pairs: list[tuple[Any, Any]] = []
        self._wall_ns: list[int] = []
        self._call_index: list[int] = []

    def begin(self) -> Any:
        if self.clock == "cuda_events":
            event = self._torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter_ns()

    def end(self, token: Any, call_index: int) -> None:
        if self.clock == "cuda_events":
            event = self._torch.cuda.Event(enable_timing=True)
            event.record()
            self._pairs.append((token, event))
        else:
            self._wall_ns.append(time.perf_counter_ns() - token)
        self._call_index.append(call_index)

    def result(self) -> dict[str, Any]:
        if self.clock == "cuda_events":
            if self._pairs:
                self._pairs[-1][1].synchronize()
            samples = [float(start.elapsed_time(stop)) for start, stop in self._pairs]
        else:
            samples = [ns / 1e6 for ns in self._wall_ns]
        return summary(samples, self._call_index, self.clock)
