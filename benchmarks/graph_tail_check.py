"""Does the last profiled step survive under CUDA-graph replay? Records the demo (full-size pool, CUDA graph,
LAYERS layers) through StepProfiler with different ways of closing the window, and counts the kernels the trace
kept in each GPU-side ProfilerStep. Each variant after the first runs in a process that has profiled before.

    PYTHONPATH=src python3 benchmarks/graph_tail_check.py OUTDIR [LAYERS] ["as shipped,sleep 0.5 s,..."]
        [--prime | --prime-work]

Seen on an H200 (2026-11-29), LAYERS=78, each line a fresh process:
    as shipped, before StepProfiler primed the profiler:   [7437, 7437, 4541]  (the process's first session)
    sleep 0.5 s / extra kernel + sync as first session:    [7437, 7437, 4541]
    --prime (an empty session first):                      [7437, 7437, 4540]
    --prime-work (a session of 25k kernels first):         [7437, 7437, 7437]
    as shipped, with StepProfiler's priming:               [7437, 7437, 7437]
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path

import torch

from decodegap.demo.config import make_config
from decodegap.demo.model import DemoModel
from decodegap.demo.runner import record, set_kv_read


def kernels_per_gpu_step(path: Path) -> list[int]:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "gpu_user_annotation")
    kernels = [e["ts"] for e in events if e.get("cat") == "kernel"]
    return [sum(1 for t in kernels if a <= t < b) for a, b in steps]


def main() -> None:
    out = Path(sys.argv[1])
    model = DemoModel(make_config("full", layers=int(sys.argv[2]) if len(sys.argv) > 2 else 12), "cuda")
    set_kv_read(model, "full_cast", cuda_graph=True)
    if "--prime" in sys.argv:  # an empty profiler session first: is it the process's first session that loses data?
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]):
            torch.cuda.synchronize()
    if "--prime-work" in sys.argv:  # a first session that records as many kernels as the real window
        x = torch.zeros(1, device="cuda")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]):
            for _ in range(25000):
                x.add_(1)
            torch.cuda.synchronize()
    original_stop = torch.profiler.profile.stop

    def variant(name, before_stop):
        def stop(self):
            before_stop()
            return original_stop(self)

        torch.profiler.profile.stop = stop
        try:
            path = record(model, out / name, steps=3, warmup=2, timed_steps=2, record_shapes=False)
        finally:
            torch.profiler.profile.stop = original_stop
        print(f"{name:24} kernels per GPU step: {kernels_per_gpu_step(path)}", flush=True)

    variants = {
        "as shipped": lambda: None,
        "sleep 0.5 s": lambda: time.sleep(0.5),
        "extra kernel + sync": lambda: (torch.ones(1, device="cuda").add_(1), torch.cuda.synchronize()),
    }
    chosen = [a for a in sys.argv[3:] if not a.startswith("--")]
    for name in chosen[0].split(",") if chosen else variants:
        variant(name, variants[name])


if __name__ == "__main__":
    main()
