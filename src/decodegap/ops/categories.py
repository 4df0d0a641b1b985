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
    # --- a library's own kernels first: the generic words below (`sort`, `topk`, `permute`, `softmax`) would
    #     capture them. CUB/rocPRIM sort and scan primitives serve samplers, MoE routing and indexing alike ---
    ("reduce", r"cub::Device(Radix|Segmented|Merge)?Sort|cub::DeviceScan|cub::DeviceReduce|cub::DeviceSelect|"
               r"cub::DeviceHistogram|rocprim::|hipcub::"),
    # cuDNN batch norm (bn_fw_tr_1C11_*, bn_bw_1C11_*), LayerNorm backward (GammaBetaBackward, apex's
    # cuComputeGradGammaBeta)
    ("norm", r"cudnn::bn_|\bbn_(fw|bw)_|GammaBetaBackward|ComputeGradGammaBeta|layer_norm_grad|LayerNormBackward"),
    # softmax backward belongs to training, not to a sampler
    ("reduce", r"softmax_warp_backward|softmax_backward|SoftMaxBackward|softmax_bwd"),
    # triton_kernels' MoE path (vLLM/SGLang gpt-oss): the expert GEMM `matmul_ogs` (outer gather/scatter) and its
    # finalize, and the routing: top-k, bitmatrix sums, combined routing
    ("moe", r"matmul_ogs|^_finalize_matmul|^_topk_forward|^_combined_routing|^_sum_bitmatrix|^_routing_|bitmatrix"),
    # fbgemm's embedding-bag kernels permute pooled embeddings (recommender models), not MoE tokens
    ("copy", r"permute_pooled_embs|permute_indices_weights|permute_\d+D_sparse|bucketize_sparse_features"),
    # convolutions (training traces): cuDNN's data/weight gradient and Winograd engines run implicit GEMMs
    ("gemm", r"dgrad_engine|wgrad_alg|winograd|implicit_convolve|convolve_|conv2d_|_conv_kernel|scudnn"),
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
    # Permutation counts only with an MoE word beside it: CUTLASS's `cutlass::layout::NoPermute` template
    # argument sits in ordinary GEMM names.
    ("moe", r"fused_moe|moe_align|moe_sum|moe_|_moe|topk_gating|topkGating|grouped_topk|expert|"
            r"count_and_sort|(moe|expert|token)s?_?(un)?permute|(un)?permute_(moe|expert|token)|"
            r"gather_scatter|cutlass_moe|group_gemm|grouped_gemm|MoeGemm|moe::"),
    # --- names that would otherwise fall to a broader rule below (FlashInfer's norm and sampling kernels) ---
    ("norm", r"rms_?norm|layer_?norm|group_?norm|norm_kernel"),
    ("sampling", r"sampling|argmax|multinomial|top_?p\b|TopKTopP|min_p"),
    # --- attention: FlashAttention, FlashInfer, FlashMLA, cuDNN SDPA, paged/decode attention, Triton MLA ---
    ("attention", r"flash|fmha|attention|attn|sdpa|mla|paged|decode_grouped|_fwd_kernel_stage|_fwd_grouped_kernel|"
                  r"BatchPrefill|BatchDecode|SinglePrefill|SingleDecode|MergeStates|merge_state|"
                  r"reshape_and_cache|concat_and_cache|softmax_warp_forward[^()]{0,256}causal|xformers|"
                  r"ck_tile::Fmha|aiter\w{0,64}(fmha|pa_)|efficient_attention"),
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


@lru_cache(maxsize=None)
def _rules(ascii_name: bool) -> list[tuple[str, re.Pattern]]:
    """The rules compiled (on first use: compiling them is ~5 ms of a run's start), IGNORECASE; or, for a name of
    ASCII characters, lowercased, to read the name lowercased. Matching IGNORECASE folds the case of each character
    and forgoes re's literal scans (~4x slower on long template names), and for ASCII text a lowercased rule reads a
    lowercased name exactly as the rule reads the name (Unicode's extra folds, K to the Kelvin sign, need characters
    an ASCII name has none of). Lowercasing a rule's text changes only its letters while its escapes are lowercase
    ones (\\b, \\w, \\d); with another, every name takes the IGNORECASE rules."""
    if ascii_name and not any(re.search(r"\\[A-Z]", pattern) for _, pattern in _RULES):
        return [(category, re.compile(pattern.lower())) for category, pattern in _RULES]
    return [(category, re.compile(pattern, re.IGNORECASE)) for category, pattern in _RULES]


# A PyTorch copy kernel whose template loads/stores with a cast converts dtypes (x.to(dtype), copy_ across
# dtypes). Other kernels with LoadWithCast (a comparison writing bool) stay in their own category.
_CAST_TEMPLATE = re.compile(r"(LoadWithCast|StoreWithCast)")
_COPY_TEMPLATE = re.compile(r"copy_kernel|direct_copy")


# What a kernel is shows in the head of its name (the function and its first template arguments); a name of
# megabytes (generated templates) is judged by its head, so categorising is bounded whatever the input.
NAME_HEAD = 8192


@lru_cache(maxsize=4096)
def categorize(name: str, gpu_kind: str = "kernel") -> str:
    """The category of one GPU activity by its name (memcpy/memset activities are their own categories)."""
    if gpu_kind == "memcpy":
        return "memcpy"
    if gpu_kind == "memset":
        return "memset"
    name = name[:NAME_HEAD]
    if _CAST_TEMPLATE.search(name) and _COPY_TEMPLATE.search(name):
        return "cast"
    ascii_name = name.isascii()
    if ascii_name:
        name = name.lower()  # (IGNORECASE rules read an ASCII name alike in either case)
    for category, pattern in _rules(ascii_name):
        if pattern.search(name):
            return category
    return "other"


# Backward (gradient) kernels of training traces: autograd's names, cuDNN's dgrad/wgrad and bn_bw, FlashAttention's
# bwd, LayerNorm's GammaBeta pass. Decode steps run none of them.
_BACKWARD = re.compile(r"backward|Backward|_bwd|bwd_|\bbn_bw_|cudnn::bn_bw|dgrad|wgrad|GradInput|grad_input|"
                       r"grad_weight|GradWeight|GammaBeta|autograd::engine|Grad[A-Z]\w*Kernel")


@lru_cache(maxsize=4096)
def is_backward(name: str) -> bool:
    """True for a kernel (or CPU op) that computes gradients: training work, never part of a decode step."""
    return _BACKWARD.search(name[:NAME_HEAD]) is not None


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


@lru_cache(maxsize=None)
def _cpu_rules() -> list[tuple[str, re.Pattern]]:
    return [(c, re.compile(p, re.IGNORECASE)) for c, p in _CPU_OP_RULES]  # compiled for a CPU-only trace only


def categorize_cpu_op(name: str, input_types: list[str]) -> str:
    """Category of a leaf CPU op; a copy between two dtypes is a cast."""
    if name in ("aten::copy_", "aten::_to_copy", "aten::to"):
        dtypes = {t for t in input_types if t and t not in ("Scalar", "")}
        return "cast" if len(dtypes) > 1 else "copy"
    for category, pattern in _cpu_rules():
        if pattern.search(name):
            return category
    return "other"
