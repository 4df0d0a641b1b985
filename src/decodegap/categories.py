"""Kernel name -> category, in one ordered table. The first matching rule wins, so specific rules come first.

Categories: gemm, attention, collective, cast, copy, norm, moe, elementwise, reduce, memcpy, memset, sampling,
other. A dtype conversion is `cast`; a copy that keeps the dtype is `copy` (the two look alike by name in
PyTorch: `direct_copy_kernel` with LoadWithCast/StoreWithCast casts, the same kernel without them copies)."""

from __future__ import annotations

import re
from functools import lru_cache

CATEGORIES = ("gemm", "attention", "collective", "cast", "copy", "norm", "moe", "elementwise", "reduce",
              "memcpy", "memset", "sampling", "other")

_RULES: list[tuple[str, str]] = [
    # --- collectives: NCCL/RCCL kernels, custom all-reduce (vLLM/SGLang/TRT-LLM), symmetric-memory, DeepEP ---
    ("collective", r"\bnccl|ncclDevKernel|ncclKernel|rccl|cross_device_reduce|custom_?all_?reduce|allreduce|"
                   r"all_reduce|all_gather|allgather|reduce_scatter|reducescatter|one_shot_all|two_shot_all|"
                   r"multimem|deep_ep|intranode::|internode::|lamport|mscclpp|quickreduce"),
    # --- torch.compile (Inductor) kernels say what they are in their prefix; their names also list every fused
    #     op (`_to_copy`, `add`, `rsqrt`), so they are sorted before the rules that would match those words ---
    ("gemm", r"^triton_(tem|mm)_"),
    ("norm", r"^triton_(red|per)_\w*(rsqrt|norm)"),
    ("reduce", r"^triton_(red|per)_"),
    ("elementwise", r"^triton_poi_"),
    # --- MoE: routing, token permutation, grouped expert GEMMs, fused MoE (Triton, CUTLASS, FlashInfer) ---
    ("moe", r"fused_moe|moe_align|moe_sum|moe_|_moe|topk_gating|topkGating|grouped_topk|expert|"
            r"count_and_sort|permute|unpermute|gather_scatter|cutlass_moe|group_gemm|grouped_gemm|"
            r"MoeGemm|moe::"),
    # --- names that would otherwise fall to a broader rule below (FlashInfer's norm and sampling kernels) ---
    ("norm", r"rms_?norm|layer_?norm|group_?norm|norm_kernel"),
    ("sampling", r"sampling|argmax|multinomial|top_?p\b|TopKTopP|min_p"),
    # --- attention: FlashAttention, FlashInfer, FlashMLA, cuDNN SDPA, paged/decode attention, Triton MLA ---
    ("attention", r"flash|fmha|attention|attn|sdpa|mla|paged|decode_grouped|_fwd_kernel_stage|_fwd_grouped_kernel|"
                  r"BatchPrefill|BatchDecode|SinglePrefill|SingleDecode|MergeStates|merge_state|"
                  r"reshape_and_cache|concat_and_cache|softmax_warp_forward.*causal|xformers|"
                  r"ck_tile::Fmha|aiter.*(fmha|pa_)|efficient_attention"),
    # --- GEMM: cuBLAS(Lt), nvjet, CUTLASS, CUTLASS-based (sm90/sm100), rocBLAS/hipBLASLt Cijk_, gemv ---
    ("gemm", r"gemm|gemv|nvjet|cublas|cutlass|Cijk_|Cij_|hipblaslt|rocblas|wgmma|matmul|_mm_|bmm|"
             r"splitKreduce|sm\d+_xmma|ampere_|volta_|turing_|hopper_|s\d+gemm|dot_kernel|"
             r"fp8_blockwise|w8a8|marlin|scaled_mm|mm_kernel|_mma_"),
    # --- normalisation: RMSNorm / LayerNorm, fused add+norm ---
    ("norm", r"norm|rms"),
    # --- dtype casts: PyTorch copy kernels that convert, explicit to/convert/quantize kernels ---
    ("cast", r"_to_copy|to_copy|float8_copy|bfloat16_copy|half_copy|float_copy|"
             r"convert|quant|(?<!no)(?<!With)cast"),  # not ..._nocast, not LoadWithCast
    # --- sampling: top-k/top-p, argmax, multinomial, sort, softmax over the vocabulary ---
    ("sampling", r"sampling|sample|topk|top_k|top_p|argmax|ArgMax|multinomial|gatherTopK|sbtopk|radix|"
                 r"bitonicSort|sort|softmax|SoftMax|cumsum|scan::"),
    # --- same-dtype copies, gathers, index, cat, scatter ---
    ("copy", r"direct_copy|copy_kernel|CatArrayBatchedCopy|cat_|gather|scatter|index_|indexSelect|"
             r"index_elementwise|take|put_|fill_kv|store_kv|kv_cache|memcpy_kernel|transpose|permute"),
    # --- reductions ---
    ("reduce", r"reduce_kernel|reduce|Reduce|sum_|mean|amax|max_kernel|min_kernel"),
    # --- elementwise: activations, arithmetic, rotary, fills ---
    ("elementwise", r"elementwise|Elementwise|silu|gelu|swiglu|act_and_mul|activation|rotary|rope|"
                    r"Functor|fill|arange|pow_|rsqrt|exp|_add|add_|mul|neg|where|masked|compare|"
                    r"triton_poi|triton_"),
]
_COMPILED = [(category, re.compile(pattern, re.IGNORECASE)) for category, pattern in _RULES]
# A PyTorch copy kernel whose template loads/stores with a cast converts dtypes (x.to(dtype), copy_ across
# dtypes). Other kernels with LoadWithCast (a comparison writing bool) stay in their own category.
_CAST_TEMPLATE = re.compile(r"(LoadWithCast|StoreWithCast)")
_COPY_TEMPLATE = re.compile(r"copy_kernel|direct_copy")


@lru_cache(maxsize=None)
def categorize(name: str, gpu_kind: str = "kernel") -> str:
    """The category of one GPU activity by its name (memcpy/memset activities are their own categories)."""
    if gpu_kind == "memcpy":
        return "memcpy"
    if gpu_kind == "memset":
        return "memset"
    if _CAST_TEMPLATE.search(name) and _COPY_TEMPLATE.search(name):
        return "cast"
    for category, pattern in _COMPILED:
        if pattern.search(name):
            return category
    return "other"


# CPU-only traces (no GPU activity): the leaf aten ops do the work, so they are categorised by op name.
_CPU_OP_RULES = [
    ("gemm", r"aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|dot|mv|addmv)$"),
    ("attention", r"scaled_dot_product|flash|attention|sdpa"),
    ("collective", r"c10d::|nccl|gloo|all_reduce|allreduce|all_gather|broadcast_|reduce_scatter"),
    ("norm", r"norm"),
    ("copy", r"aten::(index|index_select|index_put_|_index_put_impl_|gather|scatter_?|cat|stack|clone|contiguous|"
             r"embedding|take)$"),
    ("sampling", r"aten::(topk|sort|argmax|multinomial|softmax|_softmax|log_softmax|cumsum)$"),
    ("reduce", r"aten::(sum|mean|amax|max|min|prod|norm)$"),
    ("elementwise", r"aten::"),
]
_CPU_COMPILED = [(c, re.compile(p, re.IGNORECASE)) for c, p in _CPU_OP_RULES]


def categorize_cpu_op(name: str, input_types: list[str]) -> str:
    """Category of a leaf CPU op; a copy between two dtypes is a cast."""
    if name in ("aten::copy_", "aten::_to_copy", "aten::to"):
        dtypes = {t for t in input_types if t and t not in ("Scalar", "")}
        return "cast" if len(dtypes) > 1 else "copy"
    for category, pattern in _CPU_COMPILED:
        if pattern.search(name):
            return category
    return "other"
