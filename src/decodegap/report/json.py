"""The JSON report contract (schema decodegap.report/1). Names here are stable: other tools read them."""

from __future__ import annotations

import msgspec

from decodegap import __version__
from decodegap.breakdown import Spread
from decodegap.names import short_kernel_name
from decodegap.samples import spread
from decodegap.steps import PHASES, describe

SCHEMA = "decodegap.report/1"


def _r(value, digits: int = 4):
    return None if value is None else round(float(value), digits)


def kernel_dict(k) -> dict:
    return {
        "name": k.name, "short_name": short_kernel_name(k.name), "category": k.category,
        "calls_per_step": _r(k.calls_per_step, 3), "ms_per_step": _r(k.ms_per_step), "share": _r(k.share),
        "us_per_call": _r(k.us_per_call, 3), "op": k.op, "input_shapes": k.input_shapes, "grid": k.grid,
        "block": k.block, "from_graph": k.from_graph, "bytes_per_call": k.bytes_per_call,
        "bytes_source": k.bytes_source, "gbps": _r(k.gbps, 1),
    }


def report_dict(report) -> dict:
    main = report.main
    b, steps = main.breakdown, main.steps
    out = {
        "schema": SCHEMA,
        "tool": {"name": "decodegap", "version": __version__},
        "trace": {"path": str(report.path), "files": [str(r.trace.path) for r in report.ranks],
                  "device": main.trace.device_name, "detail_rank": main.rank if len(report.ranks) > 1 else None},
        "workload": steps.workload,
        "summary": describe(steps, b.layers),
        "steps": steps_dict(steps),
        "breakdown_phase": b.phase,
        "layers": b.layers,
        "layers_evidence": b.layers_evidence,
        "layer_kinds": [{"count": k.count, "markers": list(k.markers)} for k in b.layer_kinds],
        "gpu_busy_fraction": _r(b.gpu_busy_fraction),
        "gpu_ms_per_step": _r(b.gpu_ms_per_step),
        "idle_ms_per_step": _r(max(b.step_ms.median - b.busy_ms_per_step, 0.0)),
        "kernels_per_step": _r(b.kernels_per_step, 2),
        "launch_us_per_kernel": _r(b.launch_us_per_kernel, 3),
        "categories": [{"name": c.name, "ms_per_step": _r(c.ms_per_step), "share": _r(c.share),
                        "share_of_step": _r(c.share_of_step)} for c in b.categories],
        "kernels": [kernel_dict(k) for k in b.kernels],
        "ranks": [{"rank": r.rank, "path": str(r.trace.path), "decode_steps": r.breakdown.decode_count,
                   "step_ms_median": _r(r.breakdown.step_ms.median),
                   "gpu_busy_fraction": _r(r.breakdown.gpu_busy_fraction),
                   "collective_ms_per_step": _r(r.collective_ms_per_step())} for r in report.ranks],
        "slowest_rank": main.rank if len(report.ranks) > 1 else None,
        "findings": [f.to_dict() for f in report.findings],
        "profiler_check": profiler_check(report),
        "warnings": list(report.warnings),
    }
    out["floor"] = report.floor_dict
    out["gap"] = report.gap
    return out


def _ms(values: list[float]) -> dict:
    s = Spread.of(values)
    return {"median": _r(s.median), "mean": _r(s.mean), "min": _r(s.min), "max": _r(s.max), "p90": _r(s.p90)}


def _known(values: list) -> int | None:
    """The value the steps agree on (their median), None when no step knows it."""
    known = sorted(v for v in values if v)
    return known[len(known) // 2] if known else None


def steps_dict(steps) -> dict:
    out = {}
    for phase in PHASES:
        group = steps.of(phase)
        out[phase] = {"count": len(group), "source": steps.source, "ms": _ms([s.wall_ns / 1e6 for s in group]),
                      "ms_each": [_r(s.wall_ns / 1e6) for s in group],
                      "tokens": _known([s.tokens for s in group]), "batch": _known([s.batch for s in group])}
    out["source"] = steps.source
    out["source_detail"] = steps.detail
    out["dropped_partial"] = steps.dropped_partial
    return out


def profiler_check(report) -> dict | None:
    """Profiled step time against the time per token measured without the profiler (--tpot or record's), with
    the spread of record's unprofiled samples (p10-p90): a median alone hides two kinds of call in one window."""
    main = report.main
    unprofiled, source = report.options.tpot_ms, "--tpot"
    meta = main.trace.record_meta or {}
    timing = meta.get("unprofiled_step_ms") if isinstance(meta.get("unprofiled_step_ms"), dict) else None
    if unprofiled is None and timing is not None:
        unprofiled, source = timing.get("median"), "decodegap record (unprofiled steps)"
    if not _finite_positive(unprofiled):
        return None
    profiled = main.breakdown.step_ms.median
    out = {"unprofiled_ms": _r(unprofiled), "profiled_ms": _r(profiled), "ratio": _r(profiled / unprofiled),
           "source": source}
    if source != "--tpot" and timing is not None:
        out.update(_spread(timing))
    return out


def _finite_positive(value) -> bool:
    import math

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


def _plain(value):
    """numpy scalars and arrays that slip into evidence become plain JSON numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot encode {type(value).__name__}")


_encoder = msgspec.json.Encoder(enc_hook=_plain)


def render_json(report) -> str:
    return msgspec.json.format(_encoder.encode(report_dict(report)), indent=2).decode()
