"""CPU-op breakdown for traces with no GPU events (a model run on the CPU), and the one finding it supports:
a pool-wide dtype cast once per layer (kv_pool_cast), seen from the cast op's recorded shapes.

The GPU breakdown groups kernels; on a CPU-only trace there are none, so this groups the leaf-most ops that do
the work (aten::copy_ for casts) inside each ProfilerStep annotation, by name and input shapes. Times are the ops'
own wall time on the host thread, a share of the step's wall time."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from decodegap import shapes as shape_info
from decodegap.findings.base import Finding, layer_multiple
from decodegap.findings.kv_pool_cast import FIX, MIN_BYTES_PER_CALL, MIN_SHARE, POOL_ROWS

# Ops that convert dtypes; copy_ is the one that does the work, the others wrap it (counted once: copy_ only).
CAST_OPS = ("aten::copy_",)


@dataclass(frozen=True)
class CpuFinding(Finding):
    """A finding measured on the host timeline: its share is of the step's wall time, not of GPU time."""

    @property
    def share_of(self) -> str:
        return "step_wall"


@dataclass(frozen=True)
class CpuOpGroup:
    name: str
    input_shapes: list  # [[shape, dtype], ...]
    calls_per_step: float
    ms_per_step: float
    share: float  # of the step's wall time (ops nest, so shares of different groups may overlap)
    bytes_per_call: int | None


@dataclass(frozen=True)
class CpuBreakdown:
    steps: int
    step_ms: float  # median wall time of a step (CPU annotation)
    groups: list[CpuOpGroup]  # by time per step, largest first


def cpu_breakdown(rank) -> CpuBreakdown | None:
    """Group the CPU ops inside the decode steps of one rank (a RankAnalysis); None without steps."""
    trace, decode = rank.trace, rank.steps.decode
    if not decode:
        return None
    ops = trace.cpu_ops
    wall = [s.wall_ns for s in decode]
    acc: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for s in decode:
        rows = np.flatnonzero((ops.ts_ns >= s.start_ns) & (ops.ts_ns + ops.dur_ns <= s.end_ns))
        for r in rows.tolist():
            key = (int(ops.name_id[r]), ops.input_dims[r], ops.input_types[r])
            acc[key][0] += 1
            acc[key][1] += int(ops.dur_ns[r])
    n, total = len(decode), float(sum(wall))
    groups = []
    for (name_id, dims, types), (calls, dur) in acc.items():
        name = trace.names[name_id]
        tensors = shape_info.tensors(dims, types)
        groups.append(CpuOpGroup(name, [[shape, dtype] for shape, dtype in tensors], calls / n, dur / 1e6 / n,
                                 dur / total if total else 0.0, shape_info.bytes_moved(name, tensors)))
    groups.sort(key=lambda g: -g.ms_per_step)
    return CpuBreakdown(n, float(np.median(wall)) / 1e6, groups)


def detect_kv_pool_cast(report, layers: int | None = None) -> list[Finding]:
    """kv_pool_cast on a CPU-only trace: a copy_ between two dtypes over a pool-sized tensor, k times per layer."""
    main = report.main
    if main.trace.has_gpu:
        return []  # the GPU detector covers it
    b = cpu_breakdown(main)
    if b is None:
        return []
    model = report.options.model
    layers = layers or (model.num_layers if model is not None else None)
    for g in b.groups:
        if g.name not in CAST_OPS or len(g.input_shapes) < 2 or g.bytes_per_call is None:
            continue
        (dst_shape, dst_type), (src_shape, src_type) = g.input_shapes[:2]
        if dst_type == src_type or src_shape[0] < POOL_ROWS or len(src_shape) < 2:
            continue
        per_layer = layer_multiple(g.calls_per_step, layers) if layers else (
            round(g.calls_per_step) if g.calls_per_step >= 2 and g.calls_per_step == round(g.calls_per_step) else None)
        if per_layer is None or g.bytes_per_call < MIN_BYTES_PER_CALL or g.share < MIN_SHARE:
            continue
        row_width = shape_info.numel(src_shape[1:])
        if model is not None and row_width != model.kv_width:
            continue
        evidence = {"op": g.name, "calls_per_step": round(g.calls_per_step, 2), "layers": layers,
                    "calls_per_layer": per_layer, "shape": src_shape, "pool_slots": src_shape[0],
                    "row_elements": row_width, "dtype_from": _short(src_type), "dtype_to": _short(dst_type),
                    "bytes_per_call": g.bytes_per_call, "bytes_per_step": int(g.bytes_per_call * g.calls_per_step),
                    "us_per_call": round(g.ms_per_step * 1e3 / g.calls_per_step, 1), "bytes_source": "shapes",
                    "timeline": "cpu"}
        active = getattr(report.options, "active_tokens", None)
        if active:
            evidence.update(active_tokens=active, active_fraction=round(active / src_shape[0], 6))
        shape = ", ".join(str(d) for d in src_shape)
        title = (f"{g.calls_per_step:g} times per step"
                 + (f", once per layer ({layers} layers)" if per_layer == 1 and layers else "")
                 + f", the CPU casts the whole KV pool [{shape}] {evidence['dtype_from']} -> {evidence['dtype_to']}: "
                 f"{g.bytes_per_call / 1e6:,.0f} MB per call, {evidence['bytes_per_step'] / 1e9:,.2f} GB per step"
                 + (f" for {active:,} active tokens ({active / src_shape[0]:.2%} of the pool)" if active else ""))
        return [CpuFinding("kv_pool_cast", title, g.ms_per_step, g.share, evidence, FIX)]
    return []


def _short(dtype: str) -> str:
    return dtype.replace("c10::", "").replace("Float8_e4m3fn", "fp8_e4m3").replace("BFloat16", "bf16")


def render_cpu_table(b: CpuBreakdown, top: int = 10):
    """The top CPU ops as a rich Table, for a report's extra sections."""
    from rich.table import Table

    table = Table(title=f"top CPU ops per step (no GPU events; {b.steps} steps, median {b.step_ms:.3f} ms)",
                  title_justify="left")
    for col in ("op", "calls/step", "ms/step", "% of step", "shapes"):
        table.add_column(col, justify="left" if col in ("op", "shapes") else "right")
    for g in b.groups[:top]:
        shapes = " ".join(f"[{','.join(map(str, s))}]{_short(t)}" for s, t in g.input_shapes[:3])
        table.add_row(g.name, f"{g.calls_per_step:g}", f"{g.ms_per_step:.3f}", f"{g.share:.1%}", shapes)
    return table
