"""The profiled step against the time per token measured without the profiler (`--tpot`, or what `decodegap record`
measured beside its trace), with the spread of record's unprofiled samples. Findings and the report read it."""

from __future__ import annotations

import math

from decodegap.records import Struct
from decodegap.rounding import rounded as _r
from decodegap.samples import spread

NO_SHAPES_WARNING = (
    "the trace has no GPU events and its ops no shapes (recorded without record_shapes): the layer count comes from "
    "op names alone, so ops that run twice per layer can double it, and casts cannot be sized, so kv_pool_cast cannot "
    "fire; record with shapes (decodegap record --record-shapes, StepProfiler(record_shapes=True), "
    "torch.profiler.profile(record_shapes=True))")


def recording_warnings(has_gpu: bool, breakdown) -> list[str]:
    """What the profiler's settings took from the analysis: a CPU-only trace without op shapes groups its ops by name
    alone (the layer count and the cast detector need the shapes)."""
    if has_gpu or not breakdown.kernels or any(k.input_shapes for k in breakdown.kernels):
        return []
    return [NO_SHAPES_WARNING]


class ProfilerCheck(Struct, omit_defaults=True):
    unprofiled_ms: float
    profiled_ms: float
    ratio: float
    source: str
    samples: int | None = None
    unprofiled_p10_ms: float | None = None
    unprofiled_p90_ms: float | None = None
    spread_ms: float | None = None
    bimodal: bool | None = None
    call_index: list[int] | None = None
    samples_ms: list[float] | None = None


def profiler_check(tpot_ms: float | None, record_meta: dict | None, profiled_ms: float) -> ProfilerCheck | None:
    """Profiled step time (`profiled_ms`, the detailed rank's median) against the time per token measured without
    the profiler (`tpot_ms`, else what `decodegap record` stored beside the trace), with the spread of record's
    unprofiled samples (p10-p90): a median alone hides two kinds of call in one window."""
    unprofiled, source = tpot_ms, "--tpot"
    meta = record_meta or {}
    timing = meta.get("unprofiled_step_ms") if isinstance(meta.get("unprofiled_step_ms"), dict) else None
    if unprofiled is None and timing is not None:
        unprofiled, source = timing.get("median"), "decodegap record (unprofiled steps)"
    if not _finite_positive(unprofiled):
        return None
    out = {"unprofiled_ms": _r(unprofiled), "profiled_ms": _r(profiled_ms), "ratio": _r(profiled_ms / unprofiled),
           "source": source}
    if source != "--tpot" and timing is not None:
        out.update(_spread(timing))
    return ProfilerCheck(**out)


def _finite_positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _spread(timing: dict) -> dict:
    """p10/p90/bimodal as record wrote them, or computed by the same rule for traces recorded before it did."""
    raw = timing.get("samples") if isinstance(timing.get("samples"), list) else []
    samples = [float(v) for v in raw if _finite_positive(v)]
    out: dict = {"samples": len(samples)}
    computed = spread(samples)
    p10, p90 = timing.get("p10"), timing.get("p90")
    if not (_finite_positive(p10) and _finite_positive(p90)):
        p10, p90 = computed.p10, computed.p90
    if _finite_positive(p10) and _finite_positive(p90):
        out.update({"unprofiled_p10_ms": _r(p10), "unprofiled_p90_ms": _r(p90), "spread_ms": _r(p90 - p10)})
    bimodal = timing.get("bimodal")
    out["bimodal"] = bimodal if isinstance(bimodal, bool) else computed.bimodal
    if isinstance(timing.get("call_index"), list):
        out["call_index"] = timing["call_index"][:64]
    out["samples_ms"] = [_r(v, 3) for v in samples[:64]]
    return out
