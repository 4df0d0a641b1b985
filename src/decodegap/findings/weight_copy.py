"""weight_copy: large same-dtype copies or gathers of weights every step (expert weights indexed per token,
weights made contiguous or transposed per call): bytes that a fused kernel would read in place.

Rule: the copied tensors must be weights, never activations. A tensor counts as a weight when its shape is one:
rank 2 or 3 with at least two dimensions of >= MIN_WEIGHT_DIM (a matrix, or a stack of expert matrices; an
activation of a decode step has a token dimension as small as the batch, and attention activations are rank 4),
and, with --model, every dimension one of the model's weight widths (hidden, MLP/expert widths, head widths,
vocabulary, expert counts; whole or split over TP ranks); and the same copy (op and shapes) recurs a whole number
of times in every step. Such copies must move >= MIN_BYTES_PER_STEP and take
>= MIN_SHARE of the step's GPU time together. Copies without shapes (CUDA-graph replay) cannot be told apart and
are left out."""

from __future__ import annotations

from decodegap.findings.base import RankInput, step_context
from decodegap.findings.host_bound import rest_unchanged
from decodegap.findings.records import Finding, after_fix, make_finding
from decodegap.ops.kernel_names import short_kernel_name

MIN_BYTES_PER_STEP = 64e6
MIN_SHARE = 0.03  # of GPU time, all such copies together
MIN_WEIGHT_DIM = 256
TP_SPLITS = (1, 2, 4, 8, 16)
INDEX_TYPES = ("long int", "int")

FIX_EXPERTS = ("Stop copying expert weights every step: index experts inside the GEMM (grouped GEMM / fused MoE "
               "kernels such as vLLM/SGLang fused_moe) instead of gathering expert weights with aten::index, "
               "and keep weights in the layout the GEMM wants (no per-step .contiguous(), .t().contiguous()).")
FIX_LAYOUT = ("Stop copying weights every step: keep them in the layout the GEMM wants (transpose once at load, "
              "no per-step .contiguous(), .t().contiguous() or .clone()), or let the GEMM read the transposed "
              "view (cuBLAS/CUTLASS take either layout).")


def model_weight_widths(model) -> set[int]:
    """Every size a weight dimension of this model can have, whole or split over TP ranks."""
    g = model
    qk = g.qk_nope_head_dim + g.qk_rope_head_dim
    base = {g.hidden, g.intermediate, 2 * g.intermediate, g.moe_intermediate, 2 * g.moe_intermediate,
            g.shared_expert_intermediate, 2 * g.shared_expert_intermediate, g.vocab,
            g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim, 2 * g.num_kv_heads * g.head_dim,
            (g.num_heads + 2 * g.num_kv_heads) * g.head_dim, g.q_lora_rank, g.kv_lora_rank,
            g.kv_lora_rank + g.qk_rope_head_dim, g.num_heads * qk, g.num_heads * (g.qk_nope_head_dim + g.v_head_dim),
            g.num_heads * g.v_head_dim, g.head_dim, g.qk_nope_head_dim, g.v_head_dim}
    widths = {w // s for w in base if w for s in TP_SPLITS if w % s == 0}
    return widths | set(range(1, max(g.num_experts, g.experts_per_token) + 1))


def weight_shape(shape: list[int], widths: set[int] | None) -> bool:
    if len(shape) not in (2, 3) or sum(1 for d in shape if d >= MIN_WEIGHT_DIM) < 2:
        return False
    return widths is None or all(d in widths for d in shape)


def _weight_tensor(k, widths) -> list[int] | None:
    """The weight-shaped tensor a copy or gather moves, if its op's shapes show one."""
    for shape, dtype in k.input_shapes or []:
        if dtype not in INDEX_TYPES and weight_shape(shape, widths):
            return shape
    return None


def _every_step(rank: RankInput, k) -> bool:
    """Weights are read in every step: the group's kernel runs a whole number of times per step on average, and
    every decode step launches that kernel at least that often. A copy in only some steps follows the data."""
    calls = round(k.calls_per_step)
    if calls < 1 or abs(k.calls_per_step - calls) > 0.05:
        return False
    if rank.calls_in_each_step is None:
        return True  # no per-step rows to check (CPU-only breakdowns): the average is all there is
    return min(rank.calls_in_each_step(k.name)) >= calls


def detect(rank: RankInput) -> list[Finding]:
    b = rank.breakdown
    ctx = step_context(b, rank.active_tokens)
    if ctx is None:
        return []
    model = rank.geometry
    widths = model_weight_widths(model) if model is not None else None
    groups, activations = [], []
    for k in b.kernels:
        if k.category != "copy" or not k.bytes_per_call:
            continue
        dtypes = {d for _, d in (k.input_shapes or [])}
        if k.input_shapes and len([d for d in dtypes if d not in INDEX_TYPES]) > 1:
            continue  # a dtype change is a cast, not a copy
        if k.bytes_per_call * k.calls_per_step < MIN_BYTES_PER_STEP / 4:
            continue
        shape = _weight_tensor(k, widths) if _every_step(rank, k) else None
        (groups if shape is not None else activations).append((k, shape))
    ms = sum(k.ms_per_step for k, _ in groups)
    bytes_per_step = sum(k.bytes_per_call * k.calls_per_step for k, _ in groups)
    if not groups or bytes_per_step < MIN_BYTES_PER_STEP or ms / max(ctx.gpu_ms, 1e-9) < MIN_SHARE:
        return []
    experts = any(len(shape) == 3 for _, shape in groups)
    ev = {
        "bytes_per_step": int(bytes_per_step),
        "rule": (f"copies of weight-shaped tensors (rank 2-3, two dims >= {MIN_WEIGHT_DIM}"
                 + (", every dim a model width" if widths is not None else "") + ", in every step"
                 + f") move >= {MIN_BYTES_PER_STEP / 1e6:g} MB per step and take >= {MIN_SHARE:.0%} of GPU time"),
        "shape_checked_against_model": widths is not None,
        "groups": [{"kernel": short_kernel_name(k.name), "op": k.op, "shapes": [s for s, _ in (k.input_shapes or [])],
                    "weight_shape": shape, "calls_per_step": round(k.calls_per_step, 2),
                    "bytes_per_call": k.bytes_per_call, "ms_per_step": round(k.ms_per_step, 3)}
                   for k, shape in groups[:6]],
        "left_out_as_activations": [{"op": k.op, "shapes": [s for s, _ in (k.input_shapes or [])][:3],
                                     "ms_per_step": round(k.ms_per_step, 3)} for k, _ in activations[:4]],
    }
    ops = sorted({k.op for k, _ in groups if k.op})
    what = "expert weights" if experts else "weights"
    title = (f"Same-dtype copies of {what} move {bytes_per_step / 1e9:.2f} GB per step "
             f"({ms:.2f} ms, {len(groups)} kernel group{'s' if len(groups) != 1 else ''}"
             + (f": {', '.join(ops[:3])}" if ops else "") + ")")
    after = after_fix(ctx.step_ms - ms, f"the GEMMs read the weights in place at no extra cost: the copies' "
                                        f"{ms:.3f} ms per step gone; {rest_unchanged(b)}")
    return [make_finding("weight_copy", title, ms, ms / ctx.gpu_ms, ev, FIX_EXPERTS if experts else FIX_LAYOUT, after)]
