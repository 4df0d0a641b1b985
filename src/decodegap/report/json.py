"""The JSON report contract (schema decodegap.report/1). Names here are stable: other tools read them."""

from __future__ import annotations

import msgspec

from decodegap import __version__
from decodegap.names import short_kernel_name

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
        "steps": {
            "decode": {"count": b.decode_count, "source": steps.source,
                       "ms": {"median": _r(b.step_ms.median), "mean": _r(b.step_ms.mean), "min": _r(b.step_ms.min),
                              "max": _r(b.step_ms.max), "p90": _r(b.step_ms.p90)},
                       "ms_each": [_r(v) for v in b.step_ms_each]},
            "prefill": {"count": b.prefill_count, "ms_each": [_r(v) for v in b.prefill_ms_each]},
            "dropped_partial": steps.dropped_partial,
        },
        "layers": b.layers,
        "layers_evidence": b.layers_evidence,
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


def profiler_check(report) -> dict | None:
    """Profiled step time against the time per token measured without the profiler (--tpot or record's)."""
    main = report.main
    unprofiled, source = report.options.tpot_ms, "--tpot"
    meta = main.trace.record_meta or {}
    if unprofiled is None and isinstance(meta.get("unprofiled_step_ms"), dict):
        unprofiled, source = meta["unprofiled_step_ms"].get("median"), "decodegap record (unprofiled steps)"
    if not isinstance(unprofiled, (int, float)) or unprofiled <= 0:
        return None
    profiled = main.breakdown.step_ms.median
    return {"unprofiled_ms": _r(unprofiled), "profiled_ms": _r(profiled), "ratio": _r(profiled / unprofiled),
            "source": source}


def _plain(value):
    """numpy scalars and arrays that slip into evidence become plain JSON numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot encode {type(value).__name__}")


# msgspec writes NaN and the infinities as null: the output is strict JSON whatever slips into a report.
_encoder = msgspec.json.Encoder(enc_hook=_plain)


def render_json(report) -> str:
    """The report as strict JSON (never NaN or Infinity, which JSON has no words for)."""
    return msgspec.json.format(_encoder.encode(report_dict(report)), indent=2).decode()
