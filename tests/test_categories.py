"""Kernel names from the libraries decode steps run (CUDA and ROCm) land in the right category."""

import pytest

from decodegap.ops.categories import CATEGORIES, NAME_HEAD, categorize, categorize_cpu_op, is_backward

NAMES = [
    # GEMM: cuBLAS(Lt), nvjet, CUTLASS, rocBLAS/hipBLASLt (Tensile Cijk_), Marlin, Inductor templates
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16>", "gemm"),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     "gemm"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GemmShape<128, 128, 64>>>",
     "gemm"),
    ("Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_LDSB1_AFC1_GRVW8_K1_MIWT4_4_WG32_8_1", "gemm"),
    ("void marlin::Marlin<256, 1, 8, 8, 4, 8>(int4 const*, int4 const*, int4*, int4 const*)", "gemm"),
    ("triton_tem_fused_mm_0", "gemm"),
    # attention: FlashAttention 2/3, FlashInfer, FlashMLA, paged attention, SGLang/vLLM Triton decode, cuDNN SDPA
    ("void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>, true>", "attention"),
    ("void flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>, 4, 3>", "attention"),
    ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, 4u>", "attention"),
    ("void flashinfer::mla::BatchMLAPagedAttentionKernel<flashinfer::mla::KernelTraits<true>>", "attention"),
    ("void flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8>, true>", "attention"),
    ("void vllm::paged_attention_v2_kernel<__nv_bfloat16, __nv_bfloat16, 128, 16, 128>", "attention"),
    ("_fwd_grouped_kernel_stage1", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64", "attention"),
    ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16>", "attention"),
    # collectives: NCCL, RCCL, custom all-reduce
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "collective"),
    ("ncclKernel_AllReduce_RING_LL_Sum_bfloat16(ncclWorkElem)", "collective"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals)", "collective"),
    ("void sglang::cross_device_reduce_2stage<__nv_bfloat16, 8>", "collective"),
    # MoE
    ("fused_moe_kernel", "moe"),
    ("void vllm::moe::topkGatingSoftmax<8, 256, 4, 16>(float const*, bool const*, float*, int, int*)", "moe"),
    ("void vllm::moe::moe_align_block_size_kernel<int>(int*, int*, int*, int*, int, int, int)", "moe"),
    # norms
    ("void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>", "norm"),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>", "norm"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norm"),
    # casts and copies
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::"
     "{lambda()#3}, std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>, "
     "TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, "
     "at::native::memory::StoreWithCast<1> >", "cast"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
     "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}>>", "copy"),
    ("void at::native::unrolled_elementwise_kernel<at::native::BinaryFunctor<long, long, bool>, "
     "at::native::memory::LoadWithCast<2>, at::native::memory::StoreWithCast<1> >", "elementwise"),
    ("void vllm::scaled_fp8_quant_kernel<c10::BFloat16>", "cast"),
    ("void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)",
     "copy"),
    # sampling, reductions, elementwise, Inductor pointwise
    ("void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u, (cub::BlockScanAlgorithm)0>", "sampling"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>", "sampling"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>",
     "reduce"),
    ("void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel<c10::BFloat16>>", "elementwise"),
    ("triton_poi_fused_add_mul_silu_0", "elementwise"),
    ("some_unknown_kernel_name", "other"),
]


@pytest.mark.parametrize("name, category", NAMES)
def test_kernel_categories(name, category):
    assert categorize(name) == category


def test_memcpy_and_memset_by_kind():
    assert categorize("Memcpy DtoD (Device -> Device)", "memcpy") == "memcpy"
    assert categorize("Memset (Device)", "memset") == "memset"


def test_every_category_is_documented():
    assert {c for _, c in NAMES} | {"memcpy", "memset"} == set(CATEGORIES)


def test_cpu_ops():
    assert categorize_cpu_op("aten::copy_", ["c10::BFloat16", "c10::Float8_e4m3fn"]) == "cast"
    assert categorize_cpu_op("aten::copy_", ["c10::BFloat16", "c10::BFloat16"]) == "copy"
    assert categorize_cpu_op("aten::mm", []) == "gemm"
    assert categorize_cpu_op("c10d::allreduce_", []) == "collective"


# Kernels of other projects' traces (HolisticTraceAnalysis' training trace on a V100, vLLM gpt-oss on an MI300X,
# PyTorch's own kernels) that a generic word used to capture: the library's rule must win.
CUTLASS_NO_PERMUTE = (
    "void cutlass::Kernel2<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::threadblock::MmaMultistage<"
    "cutlass::gemm::GemmShape<128, 128, 32>, cutlass::transform::threadblock::PredicatedTileAccessIterator<"
    "cutlass::MatrixShape<128, 32>, cutlass::bfloat16_t, cutlass::layout::RowMajor, 1, "
    "cutlass::transform::PitchLinearWarpRakedThreadMap<cutlass::PitchLinearShape<32, 128>, 128, "
    "cutlass::PitchLinearShape<4, 8>, 8>, cutlass::AlignedArray<cutlass::bfloat16_t, 8, 16>, false, "
    "cutlass::layout::NoPermute>, cutlass::arch::CacheOperation::Global>, cutlass::epilogue::threadblock::Epilogue<"
    "cutlass::gemm::GemmShape<128, 128, 32>>, cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8> > >"
    "(cutlass::gemm::kernel::GemmUniversal<>::Params)")
LIBRARY_NAMES = [
    ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float, float, float, "
     "cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, "
     "float*, float*, float const*, float const*, float)", "norm"),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128, true, 1, true>(cudnnTensorStruct, float const*, "
     "cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, float*, float, "
     "float)", "norm"),
    ("void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>(cudnn::bn_fw_tr_1C11_args<float>)", "norm"),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32<float, float>(long, long, "
     "float const*, float const*, float const*, float const*, float*, float*)", "norm"),
    (CUTLASS_NO_PERMUTE, "gemm"),
    ("void permute_pooled_embs_kernel<float>(float const*, long const*, long const*, long const*, float*, long, "
     "long, long)", "copy"),
    ("void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<at_cuda_detail::cub::DeviceRadixSortPolicy<long, "
     "at::cuda::cub::detail::OpaqueType<8>, unsigned long long>::Policy900, false, long, "
     "at::cuda::cub::detail::OpaqueType<8>, unsigned long long, int, int>(int*, int*, unsigned long long*, "
     "unsigned long long const*, long*, long const*, at::cuda::cub::detail::OpaqueType<8>*, "
     "at::cuda::cub::detail::OpaqueType<8> const*, int, int, int)", "reduce"),
    ("void (anonymous namespace)::softmax_warp_backward<float, float, float, 10, true, false>(float*, float const*, "
     "float const*, int, int, int, bool const*)", "reduce"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true, false>(float*, float const*, "
     "int, int, int, bool const*, int, bool)", "sampling"),
    ("_topk_forward", "moe"),
    ("_combined_routing_compute", "moe"),
    ("_combined_routing_memset", "moe"),
    ("_sum_bitmatrix_rows", "moe"),
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu", "moe"),
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, int, "
     "float const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, float, int, "
     "int, int)", "gemm"),
    ("void wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int, int, int, float const*, int, float*, "
     "float const*, kernel_grad_params, unsigned long long, int, float, int, int, int, int)", "gemm"),
    ("void rocprim::ROCPRIM_400200_NS::detail::trampoline_kernel<rocprim::ROCPRIM_400200_NS::detail::"
     "wrapped_scan_config<rocprim::ROCPRIM_400200_NS::default_config, long>>", "reduce"),
    # MoE kernels that keep their category next to the new rules
    ("void vllm::moe::topkGatingSoftmax<8, 256, 4, 16>(float const*, bool const*, float*, int, int*)", "moe"),
    ("void sglang::moe::moe_permute_kernel<__nv_bfloat16>(__nv_bfloat16 const*, int const*, __nv_bfloat16*)", "moe"),
]


@pytest.mark.parametrize("name, category", LIBRARY_NAMES)
def test_library_kernels_beat_generic_words(name, category):
    assert categorize(name) == category


BACKWARD = [
    "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float)",
    "void (anonymous namespace)::softmax_warp_backward<float, float, float, 10, true, false>(float*)",
    "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32<float, float>(long, long)",
    "void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int)",
    "void wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int, int, int)",
    "void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8>, true>",
    "autograd::engine::evaluate_function: TBackward0",
    "void at::native::(anonymous namespace)::max_pool_backward_nchw<float, float>(float const*, long const*)",
]
FORWARD = [
    "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128, true, 1, true>(cudnnTensorStruct)",
    "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true, false>(float*)",
    "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>, true>",
    "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT",
    NAMES[-3][0], NAMES[0][0],
]


@pytest.mark.parametrize("name", BACKWARD)
def test_backward_kernels_are_marked(name):
    assert is_backward(name)


@pytest.mark.parametrize("name", FORWARD)
def test_forward_kernels_are_not_marked(name):
    assert not is_backward(name)


def test_a_huge_templated_name_is_judged_by_its_head():
    # 200 kB and 10 MB names of repeated template arguments took minutes (a `.*` pattern rescanned the name
    # from every occurrence): the work is bounded by NAME_HEAD characters whatever the length.
    import time

    unit = "aiter::softmax_warp_forward<cute::tuple<cute::C<1>, cute::C<128>>, "
    for size in (200_000, 10_000_000):
        name = "void " + unit * (size // len(unit)) + ">"
        assert len(name) >= size * 0.99
        start = time.perf_counter()
        category, backward = categorize(name), is_backward(name)
        assert time.perf_counter() - start < 2.0
        assert category == categorize(name[:NAME_HEAD]) and backward is False


def test_ascii_names_read_lowercased_as_the_rules_read_them():
    # ASCII names take lowercased rules without IGNORECASE (~4x faster): the same category as the IGNORECASE rules
    # for every name here, every kernel name of the committed traces, and their case-swapped spellings.
    import glob
    import gzip
    import json
    import re

    from decodegap.ops import categories

    def by_ignorecase(name: str) -> str:
        name = name[:NAME_HEAD]
        if categories._CAST_TEMPLATE.search(name) and categories._COPY_TEMPLATE.search(name):
            return "cast"
        return next((c for c, pattern in categories._rules(False) if pattern.search(name)), "other")

    names = {n for n, _ in NAMES + LIBRARY_NAMES} | set(BACKWARD) | set(FORWARD)
    paths = glob.glob("tests/fixtures/traces/*.json.gz") + glob.glob("tests/fixtures/traces/*/*.json.gz")
    for path in [p for p in paths if "/corpus/" not in p]:  # the corpus's 383 names agree too (10 s to read)
        try:
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
                events = json.load(f)
        except (OSError, EOFError, ValueError):  # the damaged and cut fixtures
            continue
        events = events.get("traceEvents", []) if isinstance(events, dict) else events
        names |= {e["name"] for e in events if isinstance(e, dict) and isinstance(e.get("name"), str)
                  and e.get("cat") in ("kernel", "Kernel")}
    assert not any(pattern.flags & re.IGNORECASE for _, pattern in categories._rules(True)) and len(names) > 300
    for name in sorted(names):
        for spelling in (name, name.swapcase(), name.upper()):
            if spelling.isascii():
                assert categorize.__wrapped__(spelling) == by_ignorecase(spelling), spelling
