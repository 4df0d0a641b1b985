"""weight_copy: large same-dtype copies or gathers every step (expert weights indexed per token, weights made
contiguous or transposed per call) — bytes that a fused kernel would read in place."""

from __future__ import annotations

from decodegap.findings.base import Finding, step_context
from decodegap.names import short_kernel_name

MIN_BYTES_PER_STEP = 64e6
MIN_SHARE = 0.03  # of GPU time, all such copies together

FIX = ("Stop copying weights every step: index experts inside the GEMM (grouped GEMM / fused MoE kernels such as "
       "vLLM/SGLang fused_moe) instead of gathering expert weights with aten::index, and keep weights in the "
       "layout the GEMM wants (no per-step .contiguous(), .t().contiguous() or .to()).")


def detect(report) -> list[Finding]:
    ctx = step_context(report)
    if ctx is None:
        return []
    b = report.main.breakdown
    groups = []
    for k in b.kernels:
        if k.category != "copy" or not k.bytes_per_call:
            continue
        if k.bytes_per_call * k.calls_per_step < MIN_BYTES_PER_STEP / 4:
            continue
        dtypes = {d for _, d in (k.input_shapes or [])}
        if k.input_shapes and len([d for d in dtypes if d not in ("long int", "int")]) > 1:
            continue  # a dtype change is a cast, not a copy
        groups.append(k)
    ms = sum(k.ms_per_step for k in groups)
    bytes_per_step = sum(k.bytes_per_call * k.calls_per_step for k in groups)
    if not groups or bytes_per_step < MIN_BYTES_PER_STEP or ms / max(ctx.gpu_ms, 1e-9) < MIN_SHARE:
        return []
    ev = {"bytes_per_step": int(bytes_per_step), "groups": [
        {"kernel": short_kernel_name(k.name), "op": k.op, "shapes": [s for s, _ in (k.input_shapes or [])],
         "calls_per_step": round(k.calls_per_step, 2), "bytes_per_call": k.bytes_per_call,
         "ms_per_step": round(k.ms_per_step, 3)} for k in groups[:6]]}
    ops = sorted({k.op for k in groups if k.op})
    title = (f"Same-dtype copies and gathers move {bytes_per_step / 1e9:.2f} GB per step "
             f"({ms:.2f} ms, {len(groups)} kernel group{'s' if len(groups) != 1 else ''}" + (f": {', '.join(ops[:3])}" if ops else "") + ")")
    return [Finding("weight_copy", title, ms, ms / ctx.gpu_ms, ev, FIX)]
