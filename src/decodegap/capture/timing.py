"""Time target calls without the profiler: CUDA events when the program uses CUDA, else the wall clock.

Also the summary of those samples (median, p10/p90, and whether they fall into two groups) that goes into the
trace metadata as `unprofiled_step_ms`. Stdlib only.
"""

from __future__ import annotations

import time
from typing import Any

from decodegap.samples import spread


def cuda_in_use(torch: Any) -> bool:
    # is_initialized, not is_available: a CPU program on a GPU host must not be timed (or profiled) as CUDA.
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001
        return False


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
