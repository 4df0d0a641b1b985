"""Time target calls without the profiler: CUDA events when the program uses CUDA, else the wall clock."""

from __future__ import annotations

import statistics
import time
from typing import Any


def cuda_in_use(torch: Any) -> bool:
    # is_initialized, not is_available: a CPU program on a GPU host must not be timed (or profiled) as CUDA.
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001
        return False


class StepTimer:
    """Collects one duration per call. CUDA events are read once, at `result()`, so the timed steps run
    back to back as they would without us (no per-step synchronize)."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self.clock = "cuda_events" if cuda_in_use(torch) else "wall"
        self._pairs: list[tuple[Any, Any]] = []
        self._wall_ns: list[int] = []

    def begin(self) -> Any:
        if self.clock == "cuda_events":
            event = self._torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter_ns()

    def end(self, token: Any) -> None:
        if self.clock == "cuda_events":
            event = self._torch.cuda.Event(enable_timing=True)
            event.record()
            self._pairs.append((token, event))
        else:
            self._wall_ns.append(time.perf_counter_ns() - token)

    def result(self) -> dict[str, Any]:
        if self.clock == "cuda_events":
            if self._pairs:
                self._pairs[-1][1].synchronize()
            samples = [float(start.elapsed_time(stop)) for start, stop in self._pairs]
        else:
            samples = [ns / 1e6 for ns in self._wall_ns]
        median = float(statistics.median(samples)) if samples else None
        return {"median": median, "samples": [round(s, 6) for s in samples], "clock": self.clock}
