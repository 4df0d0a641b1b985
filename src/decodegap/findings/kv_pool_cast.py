"""kv_pool_cast: a dtype cast that runs once per layer per step over far more KV than the step reads.

The incident: `pool.to(bfloat16)` on the whole preallocated FP8 KV pool [495552, 1, 576], 78 times per step,
857 MB per call, for ~2,000 active tokens. Found from the launching op's shapes when recorded, else from the
launch shape (grid x block x elements per thread) under CUDA-graph replay."""

from __future__ import annotations

from decodegap.findings.base import RankInput, layer_multiple, step_context
from decodegap.findings.host_bound import rest_unchanged
from decodegap.findings.records import AfterFix, Finding, after_fix, make_finding
from decodegap.ops.shapes import DTYPE_BYTES, numel

MIN_BYTES_PER_CALL = 32e6  # a per-layer cast this large is pool-sized, not activation-sized
MIN_SHARE = 0.05  # of the step's GPU time
POOL_ROWS = 16384  # a cached-token dimension at least this long looks like a preallocated pool

FIX = ("Cast only the KV the step reads: gather the active slots first, then convert them (the incident's "
       "patch: +29% tokens/s), or better, use an attention kernel that reads the FP8 cache directly and "
       "dequantizes in registers (decodegap.kernels.mla_decode, FlashMLA, TRT-LLM/CUTLASS MLA, vLLM TRITON_MLA). "
       "In SGLang look for `get_key_buffer(layer_id).to(q.dtype)` in the attention backend.")


# Elements from grid x block x per-thread work overshoot by up to one block's work (the last block is partial).
LAUNCH_SLACK = 1024


def _slots_from_launch(elements: int | None, row_width: int) -> int | None:
    """Rows of `row_width` that a launch of `elements` (an upper bound) covers, if a whole number fits."""
    if not elements:
        return None
    rows = elements // row_width
    return rows if rows and elements - rows * row_width < LAUNCH_SLACK else None


def _short_dtype(dtype: str) -> str:
    return dtype.replace("c10::", "").replace("Float8_e4m3fn", "fp8_e4m3").replace("BFloat16", "bf16")


def _active_tokens(b, pool_shape: list[int]) -> int | None:
    """An index/gather over the same pool tensor reveals how many slots the step reads: its index length."""
    for k in b.kernels:
        if not k.input_shapes or len(k.input_shapes) < 2:
            continue
        shapes = [s for s, _ in k.input_shapes]
        if shapes[0][1:] == pool_shape[1:] and shapes[0][0] == pool_shape[0]:
            for shape, dtype in k.input_shapes[1:]:
                if len(shape) == 1 and dtype in ("long int", "int") and shape[0] < pool_shape[0]:
                    return shape[0]
    return None


def detect(rank: RankInput) -> list[Finding]:
    b = rank.breakdown
    ctx = step_context(b, rank.active_tokens)
    if ctx is None:
        return []
    model = rank.geometry
    layers = b.layers or (model.num_layers if model is not None else None)
    found = []
    for k in b.kernels:
        if k.category not in ("cast", "copy") or k.bytes_per_call is None:
            continue
        per_layer = layer_multiple(k.calls_per_step, layers)
        if per_layer is None or k.bytes_per_call < MIN_BYTES_PER_CALL or k.share < MIN_SHARE:
            continue
        evidence = {"kernel": k.name, "calls_per_step": round(k.calls_per_step, 2), "layers": layers,
                    "calls_per_layer": per_layer, "bytes_per_call": k.bytes_per_call,
                    "bytes_per_step": int(k.bytes_per_call * k.calls_per_step),
                    "us_per_call": round(k.us_per_call, 1), "gbps": round(k.gbps, 1) if k.gbps else None,
                    "bytes_source": k.bytes_source, "op": k.op, "from_graph": k.from_graph}
        pool_rows, row_width, dtypes = None, None, None
        if k.input_shapes and k.bytes_source == "shapes":
            shapes = [s for s, _ in k.input_shapes]
            types = [t for _, t in k.input_shapes]
            biggest = max(range(len(shapes)), key=lambda i: numel(shapes[i]))
            pool_shape = shapes[biggest]
            if pool_shape[0] < POOL_ROWS or len(pool_shape) < 2:
                continue
            pool_rows, row_width = pool_shape[0], numel(pool_shape[1:])
            if k.op in ("aten::copy_", "aten::_to_copy", "aten::to") and len(types) >= 2 and types[0] != types[1]:
                dtypes = (types[1], types[0])  # copy_(dst, src): src -> dst
            elif len(set(types)) > 1:
                dtypes = tuple(types[:2])
            evidence.update({"shape": pool_shape, "pool_slots": pool_rows, "row_elements": row_width})
            if dtypes:
                evidence.update({"dtype_from": _short_dtype(dtypes[0]), "dtype_to": _short_dtype(dtypes[1])})
            active = _active_tokens(b, pool_shape)
        else:
            if k.category != "cast":
                continue  # without shapes, only a kernel that converts dtypes qualifies
            evidence["elements_per_call"] = k.elements_per_call
            active = None
            slots = _slots_from_launch(k.elements_per_call, model.kv_width) if model is not None else None
            if slots:
                pool_rows, row_width = slots, model.kv_width
                evidence.update({"pool_slots": pool_rows, "row_elements": row_width})
            elif k.elements_per_call:
                evidence["note"] = ("no shapes under CUDA-graph replay: elements from grid x block x per-thread "
                                    "work; bytes count the source as 1 byte (a lower bound)")
        if model is not None and row_width is not None:
            evidence["matches_model_kv_width"] = row_width == model.kv_width
            evidence["model_kv_width"] = model.kv_width
            if row_width != model.kv_width and k.bytes_source == "shapes":
                continue  # pool-sized, but not this model's KV: leave it to weight_copy
        if active is None and ctx.active_tokens is not None:
            active = ctx.active_tokens
        if active is not None and pool_rows:
            evidence["active_tokens"] = active
            evidence["active_fraction"] = round(active / pool_rows, 6)
            needed = active * (row_width or 0) * (DTYPE_BYTES.get(dtypes[0], 1) if dtypes else 1)
            evidence["bytes_needed_per_call"] = needed
        found.append(_finding(k, evidence, ctx, model, _after_fix(k, evidence, ctx, b)))
    return found[:1] if found else []


def _after_fix(k, ev: dict, ctx, b) -> AfterFix | None:
    """The step with the cast reading only the active tokens, at the bandwidth this kernel reached in the trace (its
    time scales with the bytes it moves); None when the trace and the caller do not say how many tokens are active."""
    active, slots = ev.get("active_tokens"), ev.get("pool_slots")
    if not active or not slots or active >= slots or k.ms_per_step <= 0:
        return None
    fraction = active / slots
    cast_ms = k.ms_per_step * fraction
    assumes = (f"the cast reads only the {active:,} active tokens of the {slots:,}-slot pool at its own measured "
               f"{k.gbps or 0:,.0f} GB/s ({k.calls_per_step:g} x {k.bytes_per_call * fraction / 1e6:,.2f} MB: "
               f"{cast_ms:.3f} ms per step instead of {k.ms_per_step:.3f}); {rest_unchanged(b)}")
    return after_fix(ctx.step_ms - k.ms_per_step + cast_ms, assumes)


def _finding(k, ev: dict, ctx, model, after: AfterFix | None) -> Finding:
    per_call_mb = ev["bytes_per_call"] / 1e6
    per_step_gb = ev["bytes_per_step"] / 1e9
    if "shape" in ev:
        what = f"[{', '.join(str(d) for d in ev['shape'])}] {ev.get('dtype_from', '?')} -> {ev.get('dtype_to', '?')}"
    elif "pool_slots" in ev:
        what = (f"of {ev['pool_slots']:,} slots x {ev['row_elements']} (from the launch shape: no op shapes under "
                "CUDA-graph replay)")
    else:
        what = (f"(~{(ev.get('elements_per_call') or 0) / 1e6:.1f}M elements per call from grid x block x per-thread "
                "work: no op shapes under CUDA-graph replay)")
    active = (f" for {ev['active_tokens']:,} active tokens ({ev['active_fraction']:.2%} of the "
              f"{ev['pool_slots']:,}-slot pool)") if "active_tokens" in ev else ""
    layers = f", once per layer ({ev['layers']} layers)" if ev["calls_per_layer"] == 1 else (
        f", {ev['calls_per_layer']} per layer" if ev["layers"] else "")
    actor = "an op" if k.op == k.name else "a kernel"  # CPU-only traces group ops, not kernels
    title = (f"{ev['calls_per_step']:g} times per step{layers}, {actor} casts the whole KV pool {what}: "
             f"{per_call_mb:,.0f} MB per call, {per_step_gb:,.1f} GB per step{active}")
    if model is not None and ev.get("matches_model_kv_width"):
        title += (f"; the row width {ev['row_elements']} is the model's KV width "
                  f"({'latent kv_lora_rank + qk_rope_head_dim' if model.is_mla else 'kv heads x head_dim'})")
    return make_finding("kv_pool_cast", title, k.ms_per_step, k.share, ev, FIX, after)
