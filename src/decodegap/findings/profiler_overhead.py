"""profiler_overhead: the profiled step against the time per token measured without the profiler
(--tpot, or what `decodegap record` measured). The incident's engineers checked 93.2 vs 95 ms this way."""

from __future__ import annotations

from decodegap.findings.base import Finding
from decodegap.report.json import profiler_check

TOLERANCE = 0.15

FIX_SLOWER = ("Trust the ratios more than the absolute times: profiling (especially record_shapes and with_stack) "
              "slows the host, so host-bound steps look slower than they are. Capture fewer steps with "
              "record_shapes off to confirm, or compare with CUDA-graph replay.")
FIX_FASTER = ("The unprofiled time per token is longer than the profiled step: time is spent outside the "
              "captured region (scheduler, detokenizer, sampling on the CPU, host syncs between steps). Profile "
              "the whole loop, or time the pieces between steps.")


def detect(report) -> list[Finding]:
    check = profiler_check(report)
    if check is None:
        return []
    profiled, unprofiled = check["profiled_ms"], check["unprofiled_ms"]
    diff = profiled - unprofiled
    if abs(diff) <= TOLERANCE * unprofiled:
        return []
    ev = dict(check)
    if diff > 0:
        title = (f"The profiled step ({profiled:.1f} ms) is {diff:.1f} ms slower than without the profiler "
                 f"({unprofiled:.1f} ms): profiler overhead inflates the host-bound part of the step")
        return [Finding("profiler_overhead", title, diff, diff / profiled, ev, FIX_SLOWER)]
    title = (f"Without the profiler a token takes {unprofiled:.1f} ms, {-diff:.1f} ms more than the profiled step "
             f"({profiled:.1f} ms): time goes outside the captured step")
    return [Finding("outside_step", title, -diff, -diff / unprofiled, ev, FIX_FASTER)]
