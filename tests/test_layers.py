"""Layers of one forward (steps/layers.py) on kernel sequences built here, layer by layer, so the truth (how many
layers, of which kinds) is the builder's: dense layers before MoE layers whose experts all run (a training batch),
a last layer whose expert loop runs fewer times, GEMM tiles that change with an expert's token count, a layer's
halves, and the names Inductor gives the same per-layer work in the first layers and in the rest; and, end to end,
tracegen's dense + eager MoE forwards; and real H100 kernel sequences with their generator's truth
(tests/fixtures/kernel_sequences: an eager MoE over a static cache; Kimi Linear's three kinds of layer, and a forward
the capture window cut)."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from decodegap.pipeline import analyze_path
from decodegap.report.json import report_dict
from decodegap.steps.across_forwards import data_independent
from decodegap.steps.layers import count_layers
from decodegap.steps.repetition import name_classes, normalized_name
from tracegen import engine_forwards, write

PROLOGUE = ["void at::native::indexSelectLargeIndex<c10::BFloat16>", "void at::native::FillFunctor<long>",
            "void at::native::FillFunctor<long>"]
TAIL = ["void at::native::rsqrt_kernel_cuda", "void at::native::mean_kernel_cuda", "nvjet_sm90_tst_256x8_lm_head_TNT",
        "void at::native::reduce_kernel<ArgMaxOps<float>>"]
ADD = "void at::native::CUDAFunctor_add<c10::BFloat16>"
SILU = "void at::native::silu_kernel"


def _norm() -> list[str]:
    return ["void at::native::pow_tensor_scalar_kernel", "void at::native::mean_kernel_cuda",
            "void at::native::rsqrt_kernel_cuda", "void at::native::mul_kernel_cuda"]


def _attention() -> list[str]:
    return _norm() + ["nvjet_sm90_tst_64x8_qkv_TNT", "void at::native::rotary_cat_kernel",
                      "void pytorch_flash::flash_fwd_kernel", "nvjet_sm90_tst_64x8_o_proj_TNT",
                      "void at::native::CUDAFunctor_add<c10::BFloat16>"] + _norm()


def _dense() -> list[str]:
    return _attention() + ["nvjet_sm90_tst_128x8_up_TNT", "void at::native::silu_kernel",
                           "nvjet_sm90_tst_64x8_down_TNT", "void at::native::CUDAFunctor_add<c10::BFloat16>"]


def _moe(experts: int, tile: str = "4x1") -> list[str]:
    out = _attention() + ["nvjet_sm90_tst_64x8_router_TNT", "void at::native::softmax_warp_forward<float>",
                          "void at::native::sbtopk::gatherTopK<float>"]
    for _ in range(experts):  # one launch group per expert that got tokens (eager HF MoE)
        out += ["void at::native::index_elementwise_kernel<128, 4>", f"nvjet_sm90_tst_64x16_64x16_{tile}_v_bz_TNN",
                "void at::native::silu_kernel", f"nvjet_sm90_tst_16x64_64x16_{tile}_h_bz_TNT",
                "void at::native::indexFuncLargeIndex<c10::BFloat16>"]
    return out + ["void at::native::CUDAFunctor_add<c10::BFloat16>"]


def _count(layers: list[list[str]], tail: list[str] = TAIL):
    seq = PROLOGUE + [k for layer in layers for k in layer] + tail
    mapping, canonical = name_classes(sorted(set(seq)))
    index = {n: int(mapping[i]) for i, n in enumerate(sorted(set(seq)))}
    return count_layers(np.array([index[n] for n in seq]), canonical)


def _kinds(found) -> list[int]:
    return sorted(k.count for k in found.kinds) or [found.count]


def test_a_dense_layer_before_moe_layers_whose_experts_all_run_is_a_layer():
    # A training batch routes tokens to every expert: the expert loops repeat exactly, and the MoE layers' own count
    # (3, with far more work in common than the 4 layers have) leaves the dense layer before them out.
    found = _count([_dense()] + [_moe(8) for _ in range(3)])
    assert found.count == 4 and _kinds(found) == [1, 3]
    assert found.kind_of[0] != found.kind_of[1] and len(set(found.kind_of[1:])) == 1


def _cached(cache: list[str]) -> list[str]:
    # a Llama-like layer whose attention keeps its KV cache with `cache` (a sliding window's copy, a full cache's cat)
    layer = _llama()
    at = layer.index("void pytorch_flash::flash_fwd_kernel")
    return layer[:at] + cache + layer[at:]


FINAL = TAIL[:2] + ["nvjet_sm90_tst_256x8_lm_head_TNT", "void at::native::log_softmax_forward_kernel",
                    "void at::native::nll_loss_forward_kernel", "void at::native::FillFunctor<float>",
                    "void at::native::FillFunctor<float>"]


@pytest.mark.parametrize("stack", ["dense", "moe"])
def test_the_last_layer_ends_where_the_final_norm_begins(stack):
    # The final norm runs per-layer norm kernels once more (TAIL's rsqrt and mean): the last layer ends there, however
    # long the longest layer is (an expert loop that ran more), so the lm_head and the loss are no layer's.
    layers = [_llama()] * 4 if stack == "dense" else [_moe(8), _moe(8), _moe(8), _moe(7)]
    found = _count(layers, FINAL)
    assert found.count == 4
    assert found.end == len(PROLOGUE) + sum(len(x) for x in layers)


def test_a_one_off_layer_whose_own_kernels_run_nowhere_else_is_its_own_kind():
    # Gemma 3: five sliding-window layers, then one full-attention layer that runs their kernels (fewer of one) and a
    # cache copy no other kernel shares: that name alone tells its kind.
    cat, full = "void at::native::CatArrayBatchedCopy<4>", "void at::native::CatArrayBatchedCopy_vectorized<4>"
    found = _count([_cached([cat, cat]) for _ in range(5)] + [_cached([cat, full, full])], FINAL)
    assert found.count == 6 and found.kind_of == (0, 0, 0, 0, 0, 1)


def test_a_last_layer_kernel_the_tail_also_runs_tells_no_kind():
    # An arange after the last layer's attention that the forward's tail runs too is glue, not the layer's own.
    arange = "void elementwise_kernel_with_index<arange_cuda_out>"
    last = _llama()[:-1] + [arange, _llama()[-1]]
    found = _count([_llama() for _ in range(5)] + [last], FINAL + [arange, arange])
    assert found.count == 6 and _kinds(found) == [6]


def _hybrid_head(full: bool) -> list[str]:
    # Qwen3-Next: a gated-delta-net (linear attention) or a gated full-attention mixer, each between norms; the
    # norm runs 3 times in a linear head, 4 in a full one, so no head kernel runs once in every layer
    gate = "void at::native::sigmoid_kernel_cuda"
    if full:
        mixer = (["nvjet_sm90_tst_64x8_q_TNT", "nvjet_sm90_tst_64x8_k_TNT"] + _norm() + _norm() + _rotary()
                 + ["void pytorch_flash::flash_fwd_kernel", gate, "void at::native::mul_kernel_cuda"])
    else:
        mixer = (["nvjet_sm90_tst_64x8_qkvz_TNT", "void at::native::conv_depthwise2d_forward_kernel", gate,
                  "void at::native::exp_kernel_cuda", "void at::native::chunk_gated_delta_rule"] + _norm())
    return _norm() + mixer + ["nvjet_sm90_tst_64x8_o_proj_TNT", "void at::native::CUDAFunctor_add<c10::BFloat16>"]


def _moe_tail(experts: int) -> list[str]:
    out = _norm() + ["nvjet_sm90_tst_64x8_router_TNT", "void at::native::softmax_warp_forward<float>",
                     "void at::native::sbtopk::gatherTopK<float>"]
    for _ in range(experts):
        out += ["void at::native::index_elementwise_kernel<128, 4>", "nvjet_sm90_tst_64x16_64x16_4x1_v_bz_TNN",
                "void at::native::silu_kernel", "void at::native::indexFuncLargeIndex<c10::BFloat16>"]
    return out + ["nvjet_sm90_tst_64x8_shared_TNT", "void at::native::sigmoid_kernel_cuda",
                  "void at::native::CUDAFunctor_add<c10::BFloat16>"]


def test_a_hybrid_layer_begins_at_its_own_first_kernel():
    # Three linear-attention layers, then one full-attention layer, all with MoE tails: the kernels that count the
    # layers (the router's) run mid-layer; each layer begins at its input norm, so the full-attention mixer is its
    # own layer's, not the last linear layer's, whatever the expert loops ran (two decode steps routed differently).
    steps = [[4, 4, 4, 4], [3, 5, 2, 4]]
    forwards = [PROLOGUE + [k for i, e in enumerate(x) for k in _hybrid_head(i == 3) + _moe_tail(e)] + TAIL
                for x in steps]
    names = sorted({n for f in forwards for n in f})
    mapping, canonical = name_classes(names)
    seqs = [np.array([int(mapping[names.index(n)]) for n in f]) for f in forwards]
    for x, seq in zip(steps, seqs, strict=True):
        found = count_layers(seq, canonical, data_independent(seqs))
        assert found.count == 4 and found.kind_of == (0, 0, 0, 1)
        lengths = [len(_hybrid_head(i == 3) + _moe_tail(e)) for i, e in enumerate(x)]
        assert found.starts == tuple(len(PROLOGUE) + sum(lengths[:i]) for i in range(4))


def test_dense_layers_first_then_moe_layers():
    found = _count([_dense(), _dense()] + [_moe(8) for _ in range(5)])
    assert found.count == 7 and _kinds(found) == [2, 5]


@pytest.mark.parametrize("dense, moe, experts", [(3, 5, 8), (2, 6, 4), (1, 10, 16), (4, 4, 2)])
def test_dense_layers_then_moe_layers_in_any_proportion(dense, moe, experts):
    found = _count([_dense()] * dense + [_moe(experts) for _ in range(moe)])
    assert found.count == dense + moe and _kinds(found) == sorted([dense, moe])
    assert found.kind_of == (0,) * dense + (1,) * moe  # the last MoE layer read whole, not cut at a dense one's length


def _rotary() -> list[str]:
    return ["void at::native::mul_kernel_cuda", "void at::native::neg_kernel_cuda",
            "void at::native::CatArrayBatchedCopy", "void at::native::mul_kernel_cuda",
            "void at::native::CUDAFunctor_add<c10::BFloat16>"]


def _llama() -> list[str]:
    """A dense layer as eager HF runs it: two norms alike, rotary for q and k, the cache's cat, SDPA, a gated MLP."""
    attention = (_norm() + ["nvjet_sm90_tst_64x8_q_TNT", "nvjet_sm90_tst_64x8_k_TNT", "nvjet_sm90_tst_64x8_v_TNT"]
                 + _rotary() + _rotary() + ["void at::native::CatArrayBatchedCopy"] * 2
                 + ["void pytorch_flash::flash_fwd_kernel", "nvjet_sm90_tst_64x8_o_proj_TNT",
                    "void at::native::CUDAFunctor_add<c10::BFloat16>"])
    return attention + _norm() + ["nvjet_sm90_tst_128x8_gate_TNT", "void at::native::silu_kernel",
                                  "nvjet_sm90_tst_128x8_up_TNT", "void at::native::mul_kernel_cuda",
                                  "nvjet_sm90_tst_64x8_down_TNT", "void at::native::CUDAFunctor_add<c10::BFloat16>"]


@pytest.mark.parametrize("layers", [4, 16, 32])
def test_a_layers_attention_and_mlp_halves_are_not_two_layers(layers):
    # The norm before each half runs 2L times (+1, the final norm): its blocks are halves that share the norm only.
    found = _count([_llama()] * layers)
    assert found.count == layers and _kinds(found) == [layers]


def test_a_last_layer_whose_expert_loop_runs_fewer_times_is_still_a_layer():
    # One expert got no tokens in the last layer: its loop runs 7 times, the others' 8.
    found = _count([_moe(8), _moe(8), _moe(8), _moe(7)])
    assert found.count == 4 and _kinds(found) == [4]


@pytest.mark.parametrize("experts", [[8, 8, 8, 8], [8, 8, 7, 8, 8, 8], [6, 6, 6, 6, 6]])
def test_expert_loops_are_not_layers(experts):
    # One forward (or identical training iterations): nothing tells the per-expert launches from per-layer work but
    # the layers' structure. An expert idle in one layer leaves its loop one short there.
    found = _count([_moe(e) for e in experts])
    assert found.count == len(experts)


NONZERO = ["void cub::DeviceReduceSingleTileKernel<int>", "void cub::DeviceCompactInitKernel<int>",
           "void cub::DeviceSelectSweepKernel<int>", "void at::native::write_indices<long>"]


def _shared_expert_moe(experts: int) -> list[str]:
    """An eager Qwen2-MoE layer: attention, the router, a nonzero for the experts hit, then per expert that got
    tokens its own nonzero (torch.where), gather, SwiGLU and scatter-add, then the shared expert and its sigmoid
    gate, whose SiLU and GEMM tiles are the experts' own."""
    out = _attention() + ["nvjet_sm90_tst_64x8_router_TNT", "void at::native::softmax_warp_forward<float>",
                          "void at::native::sbtopk::gatherTopK<float>", "void at::native::scatter_fill<long>"]
    out += NONZERO
    for _ in range(experts):
        out += NONZERO + ["void at::native::index_elementwise_kernel<128, 4>", "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN",
                          SILU, "void at::native::mul_kernel<c10::BFloat16>", "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN",
                          "void at::native::mul_kernel<c10::BFloat16>", "void at::native::indexFuncSmallIndex<bf16>"]
    out += ["nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN", SILU, "void at::native::mul_kernel<c10::BFloat16>",
            "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN", "nvjet_sm90_tst_64x8_64x16_1x1_h_bz_TNT",
            "void at::native::sigmoid_kernel_cuda", "void at::native::mul_kernel<c10::BFloat16>", ADD]
    return out + [ADD]


@pytest.mark.parametrize("experts", [[8, 6, 7, 6], [5, 7, 6, 8, 7], [6, 8, 7, 8, 6, 7]])
@pytest.mark.parametrize("same", [True, False])
def test_an_expert_loop_launched_alike_in_every_forward_is_no_layers(experts, same):
    # A loop without a KV cache (each forward a prefill of the sequence so far) routes its many tokens to the same
    # number of experts in every forward (`same`: each layer as many; else the layers' shares move from forward to
    # forward): the loop's names run alike in every forward, and count the experts hit (27 layers of 3 kinds were
    # read for a 4-layer Qwen2-MoE on an H100). Every layer runs its input norm, which the final norm runs once more;
    # the loop's iterations run none, so their count is a loop inside the layers.
    moved = experts if same else experts[1:] + experts[:1]
    tail = _norm() + ["nvjet_sm90_tst_256x8_lm_head_TNT", "void at::native::reduce_kernel<ArgMaxOps<float>>"]
    _assert_read_right([(PROLOGUE, [_shared_expert_moe(e) for e in counts], tail) for counts in (experts, moved)],
                       ["moe"] * len(experts))


@pytest.mark.parametrize("seed", [261, 7])
def test_a_dense_mlps_own_gemms_tell_its_kind_from_a_moe_layer(tmp_path, seed):
    # Three dense layers, then one eager MoE layer whose expert loop varies per forward (tracegen's truth): only the
    # dense MLP's GEMMs, once per layer, tell the kinds apart; the MoE layer's router and top-k run once a forward.
    doc = engine_forwards(forwards=8, layers=4, batch=1, seed=seed, moe_from=3, experts=64, top_k=4, inductor=True)
    d = report_dict(analyze_path(write(doc, tmp_path / "dense_moe.json")))
    assert d["layers"] == 4 and sorted(k["count"] for k in d["layer_kinds"]) == [1, 3]


def test_the_gemm_tile_an_experts_token_count_picks_tells_no_kind():
    found = _count([_moe(8, "4x1"), _moe(8, "4x1"), _moe(8, "4x2"), _moe(8, "4x2")])
    assert found.count == 4 and _kinds(found) == [4]


@pytest.mark.parametrize("name, same_as", [
    ("triton_per_fused__to_copy__unsafe_view_add_embedding_mean_mul_pow_rsqrt_3",
     "triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_11"),
    ("triton_poi_fused__to_copy_add_clone_expand_mean_mul_pow_rsqrt_unsqueeze_view_4",
     "triton_poi_fused__to_copy__unsafe_view_add_clone_expand_mean_mul_pow_rsqrt_unsqueeze_view_19"),
])
def test_inductor_names_for_no_work_ops_are_the_same_kernel(name, same_as):
    assert normalized_name(name) == normalized_name(same_as)


@pytest.mark.parametrize("name, other", [
    ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_3", "triton_poi_fused__to_copy_add_mean_mul_pow_rsqrt_3"),
    ("triton_poi_fused_cat_2", "triton_poi_fused_mul_silu_2"),
    ("void at::native::embedding_backward_kernel", "void at::native::backward_kernel"),
])
def test_names_that_differ_in_work_stay_apart(name, other):
    assert normalized_name(name) != normalized_name(other)


def _grid():
    for layers in (4, 12, 30):
        for moe in (None, 0, 1, 3):
            for style in ("eager", "inductor", "piecewise", "sglang"):
                for alternate in (False, True):
                    yield pytest.param(layers, moe, style, alternate,
                                       id=f"{layers}L-{'dense' if moe is None else f'moe_from{moe}'}-{style}"
                                          + ("-alternating" if alternate else ""))


@pytest.mark.parametrize("layers, moe_from, style, alternate", list(_grid()))
def test_every_stack_and_loop_of_the_generator_is_read_right(tmp_path, layers, moe_from, style, alternate):
    """tracegen's forwards in every combination of depth, dense + eager MoE stack, attention kinds taking turns layer by
    layer (also in an MoE stack, as gpt-oss runs), compiler naming, piecewise graphs and engine annotations: the
    generator's layer count and kinds (dense or MoE, times the attention kind), and its 5 decode forwards."""
    kw = dict(forwards=5, layers=layers, batch=8, seed=layers * 7 + (moe_from or 0), alternate=alternate,
              inductor=style == "inductor", graph="piecewise" if style == "piecewise" else None,
              annotation="sglang" if style == "sglang" else None)
    if moe_from is not None:
        kw.update(moe_from=moe_from, experts=16, top_k=2)
    d = report_dict(analyze_path(write(engine_forwards(**kw), tmp_path / "forwards.json")))
    want = sorted(Counter((moe_from is not None and i >= moe_from, alternate and i % 2 == 1)
                          for i in range(layers)).values())
    assert d["steps"]["decode"]["count"] == 5 and d["layers"] == layers
    assert (sorted(k["count"] for k in d["layer_kinds"]) or [layers]) == want


@pytest.mark.parametrize("layers, nope_every, kw", [
    pytest.param(8, 4, {}, id="eager"),
    pytest.param(12, 3, {}, id="eager-every3rd"),
    pytest.param(8, 4, {"graph": "full", "sampling_in_graph": True}, id="full-graph"),
    pytest.param(12, 3, {"graph": "full", "sampling_in_graph": True}, id="full-graph-every3rd"),
    pytest.param(8, 4, {"inductor": True}, id="inductor"),
    pytest.param(16, 4, {"graph": "piecewise", "alternate": True}, id="piecewise-alternating"),
    pytest.param(12, 4, {"moe_from": 1, "experts": 16}, id="moe_from1"),
    pytest.param(12, 3, {"moe_from": 0, "experts": 16, "inductor": True}, id="moe_from0-inductor"),
])
def test_layers_that_skip_the_rotary_embedding_are_layers(tmp_path, layers, nope_every, kw):
    """NoPE layers (every 3rd or 4th: SmolLM3, Llama 4) run no rotary embedding: the rotary kernels run in only some
    layers, and their smaller count cuts blocks of one or two layers. Every layer counts, one kind with rotary and one
    without (times dense / MoE and the attention kind)."""
    kw = dict(forwards=6, layers=layers, batch=8, nope_every=nope_every, seed=layers) | kw
    d = report_dict(analyze_path(write(engine_forwards(**kw), tmp_path / "forwards.json")))
    moe_from, alternate = kw.get("moe_from"), kw.get("alternate", False)
    want = sorted(Counter((moe_from is not None and i >= moe_from, alternate and i % 2 == 1, (i + 1) % nope_every == 0)
                          for i in range(layers)).values())
    assert d["steps"]["decode"]["count"] == 6 and d["layers"] == layers
    assert sorted(k["count"] for k in d["layer_kinds"]) == want


VLLM_NORM = "void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>"
VLLM_TAIL = [VLLM_NORM, "nvjet_sm90_tst_256x8_lm_head_TNT", "void at::native::reduce_kernel<ArgMaxOps<float>>"]


def _vllm_layer(rope: bool) -> list[str]:
    """A dense layer as vLLM runs Llama 4's attention: fused norms; a rotary kernel, then q and k each normed, in a
    rotary layer only (a NoPE layer runs neither)."""
    return ([VLLM_NORM, "nvjet_sm90_tst_64x8_qkv_TNT"]
            + ["void vllm::rotary_embedding_kernel<c10::BFloat16, true>", "void vllm::rms_norm_kernel<float>",
               "void vllm::rms_norm_kernel<float>"] * rope
            + ["kernel_unified_attention_2d", "nvjet_sm90_tst_64x8_o_proj_TNT", VLLM_NORM,
               "nvjet_sm90_tst_128x8_gate_up_TNT", "void vllm::act_and_mul_kernel<c10::BFloat16, silu>",
               "nvjet_sm90_tst_64x8_down_TNT"])


@pytest.mark.parametrize("layers", [12, 16, 24, 48])
def test_nope_layers_among_rotary_layers_are_layers_of_their_own_kind(layers):
    # The rotary kernels run in 3 of 4 layers (Llama 4 Scout: 48): their count's blocks hold one layer or two, and
    # share more work than the layers do (the rotary besides what every layer runs); every layer still counts.
    kinds = ["nope" if i % 4 == 3 else "rope" for i in range(layers)]
    stack = [_vllm_layer(kind == "rope") for kind in kinds]
    _assert_read_right([(PROLOGUE, stack, VLLM_TAIL), (PROLOGUE, stack, VLLM_TAIL)], kinds)


# LFM2 as its eager decode forward runs (the H200 corpus trace, kernel for kernel): conv and attention layers in
# turn, RMSNorm as eight kernels, the rotary tables in the forward's prologue on the norms' copy kernels.
COPY, TO_BF16, MUL, ELEMENTWISE, ADD = ("void at::native::direct_copy_kernel_cuda", "void at::native::bfloat16_copy",
                                        "void at::native::mul_kernel<c10::BFloat16>", "void at::native::mul_kernel",
                                        "void at::native::CUDAFunctor_add<c10::BFloat16>")
GEMM = "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN"


def _rms_norm(weight: str = MUL) -> list[str]:
    return [COPY, "void at::native::pow_tensor_scalar_kernel", "void at::native::mean_kernel_cuda",
            "void at::native::add_scalar_kernel<float>", "void at::native::rsqrt_kernel_cuda",
            "void at::native::mul_kernel<float>", TO_BF16, weight]


def _lfm2_mlp() -> list[str]:
    return _rms_norm() + [GEMM, "void at::native::silu_kernel", GEMM, MUL, GEMM, ADD]


def _conv_layer() -> list[str]:
    return _rms_norm() + [GEMM, MUL, "void at::native::CatArrayBatchedCopy_alignedK", ELEMENTWISE,
                          "void at::native::conv_depthwise2d_forward_kernel", ELEMENTWISE, GEMM, ADD] + _lfm2_mlp()


def _rope_layer(padded: bool = False) -> list[str]:
    rope = [ELEMENTWISE, "void at::native::neg_kernel", "void at::native::CatArrayBatchedCopy", ELEMENTWISE, ADD]
    cache = ["void at::native::CatArrayBatchedCopy_vectorized"] * 2
    # left-padded batches attend through a mask (SDPA's memory-efficient kernel, the mask expanded and copied)
    attend = (["void at::native::expand_copy_kernel", "void at::native::where_kernel", "void at::native::FillFunctor",
               "void at::native::FillFunctor", "fmha_cutlassF_bf16_aligned_64x64_rf_sm80"] if padded
              else ["void pytorch_flash::flash_fwd_kernel"])
    return (_rms_norm() + [GEMM] + _rms_norm(ELEMENTWISE) + [GEMM] + _rms_norm(ELEMENTWISE) + [GEMM] + rope + rope
            + cache + attend + [GEMM, ADD] + _lfm2_mlp())


LFM2_PROLOGUE = ["void at::native::indexSelectSmallIndex", "void at::native::reduce_kernel<long>",
                 "Memcpy DtoH (Device -> Pinned)", COPY, COPY, "cutlass_80_simt_sgemm_128x32", "CatArrayBatchedCopy_v",
                 "void at::native::cos_kernel", "void at::native::mul_kernel<float>", "void at::native::sin_kernel",
                 "void at::native::mul_kernel<float>", TO_BF16, TO_BF16]
LFM2_TAIL = _rms_norm() + ["nvjet_sm90_tst_64x8_lm_head_TNT", "void at::native::arange_kernel",
                           "void at::native::reduce_kernel<ArgMaxOps<float>>"]


@pytest.mark.parametrize("pairs, padded", [(3, False), (8, False), (5, True)])
def test_conv_and_attention_layers_are_layers_not_pairs(pairs, padded):
    # The rotary kernels (CatArrayBatchedCopy, neg) run twice in each attention layer, as often as there are layers:
    # the names that interleave best (theirs) cut no partition, so the next set (the MLP's silu, once in every
    # layer) proposes the count; each of its blocks runs an MLP activation, so they are layers, not halves, however
    # unlike a conv layer and a (masked) attention layer run.
    layers = [layer for _ in range(pairs) for layer in (_conv_layer(), _rope_layer(padded))]
    prologue = LFM2_PROLOGUE if not padded else PROLOGUE  # (and one whose kernels no layer runs)
    seq = prologue + [k for layer in layers for k in layer] + LFM2_TAIL
    mapping, canonical = name_classes(sorted(set(seq)))
    index = {n: int(mapping[i]) for i, n in enumerate(sorted(set(seq)))}
    found = count_layers(np.array([index[n] for n in seq]), canonical)
    assert found.count == 2 * pairs and found.kind_of == (0, 1) * pairs
    assert found.starts == tuple(len(prologue) + sum(len(x) for x in layers[:i]) for i in range(2 * pairs))


def _gemma_norm(weight: str = MUL) -> list[str]:  # Gemma's RMSNorm scales by (1 + weight)
    return _rms_norm(weight)[:-1] + ["void at::native::add_scalar_kernel<1+w>", weight]


def _gemma_layer() -> list[str]:
    # Gemma 3: norms before and after the attention and the MLP, and q / k norms (whose weight multiply runs on a
    # strided view: another kernel), so the layer norms' weight multiply runs 4L + 1 times (the final norm too)
    rope = [ELEMENTWISE, "void at::native::neg_kernel", "void at::native::CatArrayBatchedCopy", ELEMENTWISE, ADD]
    attention = ([GEMM] + _gemma_norm(ELEMENTWISE) + [GEMM] + _gemma_norm(ELEMENTWISE) + [GEMM] + rope + rope
                 + ["void at::native::CatArrayBatchedCopy_vectorized"] * 2 + ["fmha_cutlassF_bf16_aligned_64x64", GEMM])
    mlp = [GEMM, "void at::native::gelu_kernel", GEMM, "void at::native::BinaryFunctor<MulFunctor>", GEMM]
    return (_gemma_norm() + attention + _gemma_norm() + [ADD] + _gemma_norm() + mlp + _gemma_norm() + [ADD])


@pytest.mark.parametrize("layers", [6, 26])
def test_a_stretch_between_norms_that_runs_no_matrix_product_is_no_layer(layers):
    # The layer norms' weight multiply runs 4L + 1 times: its blocks are quarters of a layer, two of them a norm and
    # a residual add alone; every layer projects.
    seq = LFM2_PROLOGUE + [k for _ in range(layers) for k in _gemma_layer()] + _gemma_norm() + LFM2_TAIL[8:]
    mapping, canonical = name_classes(sorted(set(seq)))
    index = {n: int(mapping[i]) for i, n in enumerate(sorted(set(seq)))}
    found = count_layers(np.array([index[n] for n in seq]), canonical)
    assert found.count == layers and _kinds(found) == [layers]


def _trained_moe() -> list[str]:
    # Eager Mixtral in training: the router finds the experts that got tokens (a nonzero: cub reduce, select), then
    # one iteration per expert: its nonzero, gather, MLP and index-add. The elementwise kernel that starts each
    # iteration is picked by alignment (vectorised 4, unrolled, vectorised 2, unrolled): two of its variants run
    # once per layer, at iterations 0 and 2. The loop's kernels run outside it too (the router's gather, a shared
    # expert), so no kernel runs once per iteration alone.
    nonzero = ["Memcpy DtoH (Device -> Pinned)", "void cub::DeviceReduceSingleTileKernel",
               "void cub::DeviceSelectSweepKernel", "void at::native::write_indices<long>"]
    gather = "void at::native::vectorized_gather_kernel<16, long>"
    out = _attention() + ["nvjet_sm90_tst_64x8_router_TNT", "void at::native::softmax_warp_forward<float>",
                          "void at::native::sbtopk::gatherTopK<float>", gather] + nonzero
    eq = "at::native::AUnaryFunctor<long, long, bool, CompareEqFunctor<long> >"
    unrolled = f"void at::native::unrolled_elementwise_kernel<{eq}, std::array<char*, 2ul>, OffsetCalculator>(int)"
    for variant in (f"void at::native::vectorized_elementwise_kernel<4, {eq}, std::array<char*, 2ul> >(int)", unrolled,
                    f"void at::native::vectorized_elementwise_kernel<2, {eq}, std::array<char*, 2ul> >(int)", unrolled):
        out += ([variant] + nonzero + ["void cub::DeviceCompactInitKernel", gather, "Memcpy DtoH (Device -> Pinned)",
                                       "nvjet_sm90_tst_64x16_64x16_4x1_v_bz_TNN", "void at::native::silu_kernel",
                                       "void at::native::mul_kernel_cuda", "Memcpy DtoH (Device -> Pinned)",
                                       "nvjet_sm90_tst_16x64_64x16_4x1_h_bz_TNT",
                                       "void at::native::index_elementwise_kernel<128, 4>",
                                       "void at::native::mul_kernel_cuda", "void at::native::bfloat16_copy_kernel",
                                       "void at::native::indexFuncLargeIndex<c10::BFloat16>"])
    shared = ["nvjet_sm90_tst_64x16_64x16_4x1_v_bz_TNN", "void at::native::silu_kernel",
              "nvjet_sm90_tst_16x64_64x16_4x1_h_bz_TNT", "void at::native::indexFuncLargeIndex<c10::BFloat16>"]
    return out + shared + ["void at::native::CUDAFunctor_add<c10::BFloat16>"]  # and a shared expert


def test_alignment_variants_of_one_elementwise_op_make_no_layers_of_an_expert_loop():
    # Were the variants apart, each iteration would run work of its own and the iterations pass for 16 layers.
    found = _count([_trained_moe() for _ in range(4)])
    assert found.count == 4 and _kinds(found) == [4]


def test_an_elementwise_ops_vectorised_and_unrolled_kernels_are_one_name():
    add = "at::native::CUDAFunctor_add<c10::BFloat16>"
    vectorized = f"void at::native::vectorized_elementwise_kernel<8, {add}, std::array<char*, 3ul> >(int, {add})"
    unrolled = (f"void at::native::unrolled_elementwise_kernel<{add}, std::array<char*, 3ul>, "
                f"TrivialOffsetCalculator<2, unsigned int>, LoadWithCast<2> >(int, {add})")
    strided = (f"void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<{add}>"
               f"(at::TensorIteratorBase&, {add} const&)::{{lambda(int)#1}}>(int, {add})")
    assert (normalized_name(vectorized) == normalized_name(unrolled) == normalized_name(strided)
            == f"void at::native::elementwise_kernel<{add}>")
    mul = vectorized.replace("CUDAFunctor_add", "MulFunctor")
    assert normalized_name(mul) != normalized_name(vectorized)
    assert normalized_name(strided.replace("CUDAFunctor_add", "MulFunctor")) != normalized_name(strided)


# Jamba: Mamba mixers (the torch path: the mixer runs its own SiLU and three norms) with an attention layer among
# them, and an MLP or an eager MoE after each mixer. No kernel runs once in every layer.
def _mamba() -> list[str]:
    return (["nvjet_sm90_tst_64x8_in_proj_TNT", "void at::native::conv_depthwise2d_forward_kernel", SILU,
             "nvjet_sm90_tst_64x8_x_proj_TNT"] + _norm() * 3
            + ["nvjet_sm90_tst_8x64_dt_proj_TNN", "void at::native::softplus_kernel",
               "void at::native::exp_kernel_cuda", "void at::native::mul_kernel_cuda", SILU,
               "void at::native::mul_kernel_cuda",
               "nvjet_sm90_tst_64x8_out_proj_TNT"])


def _jamba_attention() -> list[str]:
    return ["nvjet_sm90_tst_64x8_qkv_TNT", "void at::native::CatArrayBatchedCopy_vectorized<4>",
            "void pytorch_flash::flash_fwd_kernel", "nvjet_sm90_tst_64x8_o_proj_TNT"]


def _jamba_mlp() -> list[str]:
    return ["nvjet_sm90_tst_128x8_up_TNT", SILU, "nvjet_sm90_tst_64x8_down_TNT"]


def _jamba_experts(experts: int) -> list[str]:
    out = ["nvjet_sm90_tst_64x8_router_TNT", "void at::native::softmax_warp_forward<float>",
           "void at::native::sbtopk::gatherTopK<float>"]
    for _ in range(experts):
        out += ["void at::native::index_elementwise_kernel<128, 4>", "nvjet_sm90_tst_64x16_64x16_4x1_v_bz_TNN", SILU,
                "nvjet_sm90_tst_16x64_64x16_4x1_h_bz_TNT", "void at::native::indexFuncLargeIndex<c10::BFloat16>"]
    return out


def _jamba_layer(kind: str, experts: int) -> list[str]:
    mixer = _jamba_attention() if kind.startswith("attention") else _mamba()
    ff = _jamba_experts(experts) if kind.endswith("moe") else _jamba_mlp()
    return _norm() + mixer + [ADD] + _norm() + ff + [ADD]


JAMBA_TAIL = _norm() + ["nvjet_sm90_tst_256x8_lm_head_TNT", "void at::native::reduce_kernel<ArgMaxOps<float>>"]


@pytest.mark.parametrize("stack", [
    ["mamba mlp", "mamba moe", "attention mlp", "mamba moe"],
    ["mamba mlp", "mamba moe", "attention mlp", "mamba moe"] * 2,
    ["mamba mlp", "mamba moe", "mamba mlp", "attention moe", "mamba mlp", "mamba moe"],
    ["mamba mlp", "mamba moe", "attention mlp", "attention moe", "mamba mlp", "mamba moe"],  # two in one block
])
def test_a_hybrid_stacks_layers_each_run_one_mixer_of_their_kind(stack):
    # The Mamba kernels count the Mamba layers; the attention kernels run in some of their blocks and nowhere else:
    # such a block holds a Mamba layer and the attention layers, which begin at their input norms (a name that runs
    # twice per layer, the residual add, cuts halves: an attention half runs no MLP), and the last layer ends at the
    # final norm however many experts its loop ran (more than any earlier layer's here). Two decode steps, routed
    # apart.
    experts = [[2 + (i * 3 + s) % 4 for i in range(len(stack))] for s in range(2)]
    for e in experts:
        e[-1] = 7
    _assert_jamba_read_right(stack, experts)


def _assert_jamba_read_right(stack: list[str], experts: list[list[int]]) -> None:
    """One forward per expert-count list (each layer's loop runs that many experts), all read together: each reads
    exactly the stack's layers, where each begins and where the last ends (the final norm), and one kind per
    (mixer, MLP or MoE) kind of the stack."""
    _assert_read_right([(PROLOGUE, [_jamba_layer(kind, n) for kind, n in zip(stack, e, strict=True)], JAMBA_TAIL)
                        for e in experts], stack)


def _assert_read_right(forwards: list[tuple[list[str], list[list[str]], list[str]]], kinds: list[str]) -> None:
    """Forwards given as (prologue, layers, tail), all read together (what runs alike in each is per-layer work):
    each reads exactly its layers, where each begins and where the last ends (the final norm), and one kind of layer
    per label of `kinds` (one label per layer)."""
    runs = [prologue + [k for layer in layers for k in layer] + tail for prologue, layers, tail in forwards]
    names = sorted({n for f in runs for n in f})
    mapping, canonical = name_classes(names)
    index = {n: int(mapping[i]) for i, n in enumerate(names)}
    seqs = [np.array([index[n] for n in f]) for f in runs]
    stable = data_independent(seqs)
    labels = list(dict.fromkeys(kinds))
    for (prologue, layers, _), seq in zip(forwards, seqs, strict=True):
        found = count_layers(seq, canonical, stable)
        lengths = [len(layer) for layer in layers]
        assert found.count == len(layers)
        assert found.starts == tuple(len(prologue) + sum(lengths[:i]) for i in range(len(layers)))
        assert found.end == len(prologue) + sum(lengths)
        if len(labels) == 1:
            assert found.kind_of == ()
            continue
        first = {k: found.kind_of[kinds.index(k)] for k in labels}
        assert found.kind_of == tuple(first[k] for k in kinds) and len(set(first.values())) == len(labels)


def _lone_attention_stacks():
    for attention in range(8):
        for moe_on in (0, 1):
            for seed in range(6):
                for last in ("more", "fewer"):
                    moe = "odd" if moe_on else "even"
                    yield pytest.param(attention, moe_on, seed, last,
                                       id=f"attention{attention}-moe_on_{moe}-seed{seed}-{last}")


@pytest.mark.parametrize("attention, moe_on, seed, last", list(_lone_attention_stacks()))
def test_a_lone_attention_layer_anywhere_in_a_hybrid_stack_is_read_right(attention, moe_on, seed, last):
    # 8 Jamba layers: Mamba mixers and one attention layer at each place (first and last too), an MoE every other
    # layer (from layer 0 or 1), the others an MLP; each loop's expert count drawn per layer and forward, the last
    # MoE layer's more than any other's or fewer. Two or three forwards routed apart. An attention layer at either
    # end lies outside the Mamba kernels' blocks; a last one runs no Mamba kernel and is its own kind.
    rng = random.Random(seed * 100 + attention * 2 + moe_on)
    stack = [("attention" if i == attention else "mamba") + (" moe" if i % 2 == moe_on else " mlp") for i in range(8)]
    experts = [[rng.randint(2, 6) for _ in stack] for _ in range(2 + seed % 2)]
    for f, e in enumerate(experts):
        e[6 + moe_on] = 8 + f if last == "more" else 1
    _assert_jamba_read_right(stack, experts)


# Bamba as its eager decode forward runs (the H100 holdout trace, kernel for kernel): Mamba-2 mixers on the torch
# path (in_proj, the conv state rolled and convolved, the SSM step, a gated norm, out_proj), attention every 4th
# layer, a dense MLP in every layer. The Mamba kernels count 6 layers; the attention's own run in 2, the last one
# after the last Mamba layer, where its kernels follow its rotary and cache copies, not its input norm.
COPY_NC, TO_F32 = "void at::native::direct_copy_kernel_cuda<nocast>", "void at::native::mul_kernel<float>"
MUL_F, SILU_NC = "void at::native::vectorized_mul_kernel<float>", "void at::native::silu_kernel<c10::BFloat16>"
DTOD, EXP = "Memcpy DtoD (Device -> Device)", "void at::native::exp_kernel_cuda"
VARIES = "void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>"  # as often as a forward's inputs


def _bamba_mlp() -> list[str]:
    return _rms_norm() + [GEMM, SILU_NC, GEMM, "void at::native::mul_kernel<c10::BFloat16, 8>", GEMM, ADD]


def _mamba2_mixer() -> list[str]:
    # in_proj; the conv state rolled, convolved, activated; the SSM step; the gated norm; out_proj; the residual add
    conv = [EXP, "void at::native::neg_kernel<float>", "void at::native::CatArrayBatchedCopy<3>", COPY_NC,
            "void at::native::conv_depthwise2d_forward_kernel", SILU_NC, "void at::native::add_kernel<nocast>",
            "void at::native::softplus_kernel"]
    ssm = [COPY, TO_F32, EXP, COPY_NC, MUL, MUL, MUL_F, "void at::native::add_kernel<float>", DTOD, COPY_NC, TO_BF16,
           GEMM, MUL, ADD]
    gated_norm = [COPY, COPY, "void at::native::silu_kernel<float>", MUL_F] + _rms_norm()[1:]
    return [GEMM, COPY] + conv + ssm + gated_norm + [GEMM, ADD]


def _bamba_mamba() -> list[str]:
    return _rms_norm() + _mamba2_mixer() + _bamba_mlp()


def _bamba_attention() -> list[str]:
    rotary = [MUL, "void at::native::neg_kernel<c10::BFloat16>", "void at::native::CatArrayBatchedCopy<4>", MUL, ADD]
    cache = ["void at::native::CatArrayBatchedCopy<4>"] * 2 + ["void at::native::CatArrayBatchedCopy_vectorized<3>"] * 2
    return (_rms_norm() + [GEMM, GEMM, GEMM] + rotary + rotary + cache + ["void pytorch_flash::flash_fwd_kernel", GEMM,
                                                                          ADD] + _bamba_mlp())


def _bamba_prologue(varies: int) -> list[str]:
    return (["void at::native::indexSelectSmallIndex<c10::BFloat16>", "void at::native::unrolled_copy<long>"]
            + [VARIES] * varies + ["void at::native::reduce_kernel<long, sum>", "void at::native::compare_eq<long>",
                                   "Memcpy DtoH (Device -> Pinned)", COPY, COPY, "void gemmk1_kernel<float>",
                                   "void at::native::CatArrayBatchedCopy_vectorized<4u>", "void at::native::cos_kernel",
                                   "void at::native::mul_scalar<float>", "void at::native::sin_kernel",
                                   "void at::native::mul_scalar<float>", TO_BF16, TO_BF16])


def _generate_tail(varies: int) -> list[str]:
    # the final norm, the lm_head, then generate's own bookkeeping (stopping criteria, cache positions, argmax)
    arange, fill = "void elementwise_kernel_with_index<arange_cuda_out>", "void at::native::FillFunctor<bool>"
    return (_rms_norm() + ["nvjet_sm90_tst_64x8_64x16_4x1_v_bz_lm_head_TNT", arange, "void at::native::add<long>",
                           "void at::native::CatArrayBatchedCopy_alignedK_contig<8u>",
                           "void at::native::FillFunctor<long>",
                           COPY, arange, fill, "void at::native::compare<long>", "void at::native::reduce_kernel<or>",
                           DTOD, DTOD, "void at::native::FillFunctor<float>", "void at::native::where_kernel", DTOD,
                           "void at::native::reduce_kernel<ArgMaxOps<float>>", "void at::native::mul<long>", fill, fill,
                           "void at::native::bitwise_not_kernel", "void at::native::compare_eq<long>",
                           "Memcpy DtoH (Device -> Pinned)"] + [VARIES] * varies)


@pytest.mark.parametrize("layers, first", [(8, 3), (8, 0), (8, 1), (8, 2), (12, 3), (6, 3), (6, 2), (5, 3)])
def test_mamba_layers_count_a_hybrid_stack_whose_attention_layers_run_after_their_rotary(layers, first):
    # Attention every 4th layer from `first` (Bamba's: 3, the last layer one), two forwards whose inputs take a
    # different number of copies. The attention's kernels run in some of the Mamba kernels' blocks and, first or
    # last, outside them, where they lie among the layers' input norms (the embedding precedes the first; the output
    # head and sampling follow the final one). With one attention layer (6 and 5 layers), the SiLU the conv and the
    # MLPs share runs 2M + A times and cuts each Mamba layer into its mixer and MLP halves; the mixer's gated norm is
    # an activation only the mixer halves run, which must not pass those halves for layers (they had read 11 of 6).
    stack = ["attention" if i % 4 == first else "mamba" for i in range(layers)]
    kinds = [_bamba_attention() if kind == "attention" else _bamba_mamba() for kind in stack]
    _assert_read_right([(_bamba_prologue(v), kinds, _generate_tail(v)) for v in (1, 3)], stack)


# RecurrentGemma (Griffin) as its eager decode forward runs (the H100 holdout trace, kernel for kernel): two RG-LRU
# recurrent blocks to one local-attention block, norms that scale by (1 + weight), a GeLU MLP in every layer. The
# attention layer builds its own rotary tables and attends through a mask (SDPA's memory-efficient kernel).
GEMM_BIAS, MUL_NC = "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_bias_TNN", "void at::native::mul_kernel<c10::BFloat16, nocast>"
GELU, MUL_SCALAR = "void at::native::GeluCUDAKernelImpl", "void at::native::mul_scalar<c10::BFloat16>"
NOT, EQ = "void at::native::bitwise_not_kernel", "void at::native::compare_eq<long>"


def _griffin_norm() -> list[str]:
    return [COPY, "void at::native::pow_tensor_scalar_kernel", "void at::native::mean_kernel_cuda",
            "void at::native::add_scalar_kernel<float>", "void at::native::rsqrt_kernel_cuda", TO_F32, COPY,
            "void at::native::add_scalar_kernel<float>", MUL_F, TO_BF16]


def _griffin_mlp() -> list[str]:
    return _griffin_norm() + [GEMM_BIAS, GELU, GEMM_BIAS, MUL, GEMM_BIAS, ADD]


def _griffin_recurrent() -> list[str]:
    gate, sigmoid = "nvjet_sm90_tst_64x8_64x16_1x1_h_badd_NNT", "void at::native::sigmoid_kernel_cuda"
    conv = ["void at::native::CatArrayBatchedCopy<3>", MUL, "void at::native::reduce_kernel<sum>", ADD, EQ, DTOD]
    rg_lru = [gate, sigmoid, DTOD, gate, sigmoid, MUL_SCALAR, "void at::native::softplus_kernel", MUL, EXP, MUL_SCALAR,
              EXP, MUL, "void at::native::add_other<c10::BFloat16>", "void at::native::sqrt_kernel", NOT, MUL_NC,
              "void at::native::add_kernel<c10::BFloat16, strided>", MUL, NOT, MUL_NC, COPY, MUL_F, COPY,
              "void at::native::add_kernel<float>", TO_BF16, MUL]
    return _griffin_norm() + [GEMM_BIAS, GELU, GEMM_BIAS] + conv + rg_lru + [GEMM_BIAS, ADD] + _griffin_mlp()


def _griffin_attention() -> list[str]:
    proj = ["nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN"] + ["nvjet_sm90_tst_64x8_64x16_1x1_h_bz_TNT"] * 2
    tables = [COPY, COPY, "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32>",
              "void at::native::CatArrayBatchedCopy_v",
              "void at::native::cos_kernel", "void at::native::mul_scalar<float>", "void at::native::sin_kernel",
              "void at::native::mul_scalar<float>", TO_BF16, TO_BF16]
    neg, cat, catv = ("void at::native::neg_kernel<c10::BFloat16>", "void at::native::CatArrayBatchedCopy<4>",
                      "void at::native::CatArrayBatchedCopy_vectorized<4>")
    rotary = [MUL_NC, neg, cat, MUL_NC, ADD, MUL, neg, catv, MUL, ADD]
    cache = [cat, catv] + ["void at::native::CatArrayBatchedCopy_vectorized<3>"] * 2
    mask = ["void at::native::FillFunctor<c10::BFloat16>"] * 2 + ["void at::native::where_kernel<128, 4>"]
    return (_griffin_norm() + proj + tables + rotary + cache + mask + ["fmha_cutlassF_bf16_aligned_64x64_rf_sm80",
                                                                       GEMM_BIAS, ADD] + _griffin_mlp())


def _griffin_prologue() -> list[str]:
    arange, add, fill = ("void elementwise_kernel_with_index<arange_cuda_out>", "void at::native::add_self<long>",
                         "void at::native::FillFunctor<bool>")
    index, compare, both = ("void at::native::index_kernel<OpaqueType<1>>", "void at::native::compare<long>",
                            "void at::native::bitwise_and<bool>")
    return (["void at::native::indexSelectSmallIndex<c10::BFloat16>", "void at::native::unrolled_copy<long>", arange,
             add, index, arange, arange, arange, add, arange, add, fill, fill, add, compare, both, compare, both, both,
             "void at::native::direct_copy_kernel_cuda<long>", index, both, MUL_NC])  # the embedding's scale last


def _griffin_tail() -> list[str]:
    # the final norm, the lm_head and its logit soft-cap (tanh), then generate's bookkeeping
    arange, fill = "void elementwise_kernel_with_index<arange_cuda_out>", "void at::native::FillFunctor<bool>"
    return (_griffin_norm() + ["nvjet_sm90_tst_64x8_64x16_4x1_v_bz_lm_head_TNT", "void at::native::div_scalar",
                               "void at::native::tanh_kernel_cuda", MUL_SCALAR, arange, "void at::native::add<long>",
                               "void at::native::CatArrayBatchedCopy_alignedK_contig<8u>", COPY, arange, fill,
                               "void at::native::reduce_kernel<or>", DTOD, DTOD,
                               "void at::native::where_kernel<128, 2>",
                               "void at::native::reduce_kernel<ArgMaxOps<float>>", "void at::native::mul<long>", fill,
                               DTOD, DTOD, NOT, "void at::native::reduce_kernel<max>", EQ,
                               "Memcpy DtoH (Device -> Pinned)", DTOD])


@pytest.mark.parametrize("pattern", ["RRARRA", "RRARRARRA", "ARRARR", "RARRAR"])
def test_recurrent_blocks_count_a_griffin_stack_whose_attention_layer_is_last(pattern):
    # RecurrentGemma's 6 layers (RRA RRA: the last layer attends), deeper, and the attention layers shifted to the
    # front. The RG-LRU kernels count the recurrent layers; the attention's (its mask's, its rotary tables') run in
    # some of their blocks and, first or last, outside them, among the input norms.
    stack = ["attention" if kind == "A" else "recurrent" for kind in pattern]
    layers = [_griffin_attention() if kind == "attention" else _griffin_recurrent() for kind in stack]
    _assert_read_right([(_griffin_prologue(), layers, _griffin_tail())] * 2, stack)


# Zamba2 as its decode forward runs in a hand-written loop (the H100 holdout trace, kernel for kernel): Mamba-2 layers
# without an MLP; every third also runs, before its Mamba mixer, a shared transformer block on the hidden state and
# the embeddings (their concat, attention, a GeLU MLP with LoRA adapters, a projection added back).
def _zamba2_shared_block() -> list[str]:
    cat, gemm_nc = "void at::native::CatArrayBatchedCopy_vectorized<3>", "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN"
    attention = _rms_norm() + [gemm_nc] * 3 + [cat, cat, "void pytorch_flash::flash_fwd_kernel", gemm_nc]
    mlp = _rms_norm() + [gemm_nc] * 3 + [ADD, "void at::native::GeluCUDAKernelImpl<nocast>", MUL, gemm_nc]
    return [cat] + attention + mlp + [gemm_nc, ADD]


@pytest.mark.parametrize("pattern", ["MMHMMH", "MMHMMHMMH", "HMMHMM", "MHMMHM"])
def test_a_shared_block_some_mamba_layers_run_is_part_of_those_layers(pattern):
    # Zamba2's 6 layers (the shared block in layers 2 and 5), deeper, and shifted to the front. The attention and the
    # GeLU run in some of the Mamba kernels' blocks and nowhere else: a block with an MLP of its own inside those
    # layers, not layers of their own (a Mamba layer runs no MLP: split there, a part's only activation would be its
    # Mamba gated norm's); a hybrid layer begins at the shared block, after the layer before's residual add.
    stack = ["hybrid" if kind == "H" else "mamba" for kind in pattern]
    layers = [(_zamba2_shared_block() if kind == "hybrid" else []) + _rms_norm() + _mamba2_mixer() for kind in stack]
    prologue = ["void at::native::indexSelectSmallIndex<c10::BFloat16>", DTOD,
                "void elementwise_kernel_with_index<arange_cuda_out>", "void at::native::add_self<long>"]
    tail = _rms_norm() + ["nvjet_sm90_tst_64x8_64x16_4x1_v_bz_lm_head_TNT",
                          "void at::native::reduce_kernel<ArgMaxOps<float>>"]
    _assert_read_right([(prologue, layers, tail)] * 2, stack)


# dots.llm1 as its beam-search decode forward runs (the H100 holdout trace, kernel for kernel): a dense first layer,
# then MoE layers with a grouped-GEMM expert block (sigmoid router, top-k, a histogram and scan for the groups) and a
# shared expert, q/k norms; beam search's bookkeeping after the lm_head runs several of the routing kernels again.
TOPK, SCATTER, DIV_FLOOR = ("void at::native::sbtopk::gatherTopK<float, 2>", "void at::native::scatter_gather<4, long>",
                            "void at::native::div_floor_kernel<long>")
FILL_F, COPY_LONG = "void at::native::FillFunctor<float>", "void at::native::direct_copy_kernel_cuda<long>"
ROUTE_COPY = "void at::native::unrolled_copy<long>"  # as often as a forward's beams
ADD_F, MUL_AF, ARANGE = ("void at::native::add_kernel<float, strided>", "void at::native::mul_scalar<float>",
                         "void elementwise_kernel_with_index<arange_cuda_out>")
MASKED, GROUPED = ("void at::native::masked_fill_kernel<nocast>",
                   "_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9xINS_4gemm6kernel13Grouped")


def _dots1_attention() -> list[str]:
    rotary = [MUL, "void at::native::neg_kernel<c10::BFloat16>", "void at::native::CatArrayBatchedCopy<4>", MUL, ADD]
    cache = ["void at::native::CatArrayBatchedCopy_vectorized<3>"] * 2
    return (_rms_norm() + [GEMM] + _rms_norm() + [GEMM] + _rms_norm() + [GEMM] + rotary + rotary + cache
            + ["void pytorch_flash::flash_fwd_kernel", GEMM, ADD])


def _dots1_dense() -> list[str]:
    return _dots1_attention() + _rms_norm() + [GEMM, SILU, GEMM, "void at::native::mul_kernel<c10::BFloat16, 8>", GEMM,
                                               ADD]


def _dots1_moe(beams: int) -> list[str]:
    prepare = "void at::cuda::detail::prepare_grouped_gemm_data<cutlass::bfloat16_t>"
    router = [COPY, COPY, "void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64>", "void cublasLt::splitKreduce_kernel",
              "void at::native::sigmoid_kernel_cuda", ADD_F, TOPK, "void at::native::bitonicSortKVInPlace<float>",
              "void at::native::reduce_kernel<512, sum<float>>", TOPK, FILL_F, "void at::native::scatter_fill<4, long>"]
    route = ([ROUTE_COPY] * beams + [NOT, DTOD, "void at::native::masked_fill_kernel", TOPK, SCATTER, MUL_AF, DTOD,
                                     ARANGE, DTOD, DTOD, "void at::native::bitonicSortKVInPlace<long>", DIV_FLOOR,
                                     "void at::native::vectorized_gather_kernel<16, long>",
                                     "void at::native::index_kernel<OpaqueType<4>>", COPY_LONG,
                                     "void at::native::FillFunctor<int>", "void at::cuda::kernelHistogram1D<int>",
                                     "void cub::DeviceScanInitKernel", "void cub::DeviceScanKernel",
                                     "void at::native::compare_scalar_kernel<long>",
                                     "void at::native::clamp_scalar<long>"])
    experts = [MASKED, prepare, GROUPED, DTOD, MASKED, "void at::native::silu_kernel<c10::BFloat16>", MUL, prepare,
               GROUPED, DTOD, MASKED, TO_F32, ARANGE, "void at::native::index_put_kernel<OpaqueType<8>>",
               "void at::native::vectorized_gather_kernel<16, long>", "void at::native::reduce_kernel<128, sum<float>>"]
    shared = [TO_BF16, GEMM, SILU, GEMM, "void at::native::mul_kernel<c10::BFloat16, 8>", GEMM, ADD, ADD]
    return _dots1_attention() + _rms_norm() + router + route + experts + shared


def _beam_search_tail() -> list[str]:
    # the final norm, the lm_head, then beam search: log-softmax, top-k over the beams, their indices and scores
    topk, sort = "void at::native::sbtopk::gatherTopK<float, 1>", "void at::native::bitonicSortKVInPlace<-2, float>"
    rem, rem_v = "void at::native::remainder_kernel<long, nocast>", "void at::native::remainder_kernel<long>"
    scatter8 = "void at::native::scatter_gather<8, long>"
    add_long, fill_bool, and_bool, all_ = ("void at::native::add<long>", "void at::native::FillFunctor<bool>",
                                           "void at::native::bitwise_and<bool>", "void at::native::reduce_kernel<and>")
    add3, step = "void at::native::add_kernel<float>", [topk, sort, rem, scatter8, rem_v, SCATTER, rem, SCATTER, rem_v]
    return (_rms_norm() + ["nvjet_sm90_tst_64x8_64x16_4x1_v_bz_lm_head_TNT", ARANGE, add_long,
                           "void at::native::CatArrayBatchedCopy_alignedK_contig<8u>",
                           "void at::native::FillFunctor<long>",
                           "void at::native::CatArrayBatchedCopy_alignedK_contig<8u>", COPY,
                           "void at::native::cunn_SoftMaxForwardReg<LogSoftMax>", ADD_F, topk, sort, DIV_FLOOR, rem,
                           SCATTER, rem, scatter8, rem_v, ARANGE, "void at::native::mul<long>", add_long, COPY_LONG,
                           fill_bool, fill_bool, "void at::native::bitwise_or<bool>", COPY, MUL_AF, add3]
            + step[:5] + [SCATTER, rem, SCATTER, and_bool, "void at::native::mul_scalar<float, b>", all_,
                          "void at::native::and_scalar<bool>", COPY, MUL_AF, ADD_F, NOT, COPY, MUL_AF, ADD_F, NOT,
                          MUL_AF, add3, "void at::native::CatArrayBatchedCopy_vectorized<8u>"] + step
            + ["void at::native::indexSelectSmallIndex<c10::BFloat16, int>"] * 8
            + ["void at::native::mul_scalar<float, b>", "void at::native::reduce_kernel<MinOps<float>>", FILL_F,
               "void at::native::where_kernel", "void at::native::compare<float>", "void at::native::reduce_kernel<or>",
               and_bool, DTOD, all_, "void at::native::and_scalar<bool>", NOT, all_, NOT, and_bool, and_bool,
               "Memcpy DtoH (Device -> Pinned)"])


@pytest.mark.parametrize("moe", [3, 5])
def test_layers_that_begin_alike_and_end_unlike_begin_at_their_norm(moe):
    # dots.llm1's 4 layers (1 dense, 3 MoE; and 5 MoE): the kernels that count them (the MLP's gate * up, dense or
    # shared expert; the MoE routing's fill, floor division and copy, which beam search runs once more after the
    # lm_head) run late in each layer, where a dense layer and an MoE layer differ: the layers begin alike (norm,
    # attention), each at its input norm; the last one ends at the final norm, not at the routing kernels' run in
    # beam search's bookkeeping. Two forwards with a different number of beam copies.
    def forward(beams):
        prologue = (["void at::native::indexSelectSmallIndex<c10::BFloat16>"] + [ROUTE_COPY] * beams
                    + ["void at::native::reduce_kernel<long, sum>", "void at::native::compare_eq<long>",
                       "Memcpy DtoH (Device -> Pinned)", COPY, COPY, "void gemmk1_kernel<float>",
                       "void at::native::CatArrayBatchedCopy_vectorized<4u>", "void at::native::cos_kernel", MUL_AF,
                       "void at::native::sin_kernel", MUL_AF, TO_BF16, TO_BF16])
        return prologue, [_dots1_dense()] + [_dots1_moe(beams) for _ in range(moe)], _beam_search_tail()

    _assert_read_right([forward(1), forward(2)], ["dense"] + ["moe"] * moe)


# Phi-2 under torch.compile (Inductor), one decode forward of the real H100 holdout trace, kernel for kernel: parallel
# attention + MLP from one LayerNorm (fused with the residual add before it), GELU's tanh approximation decomposed
# and fused (add_mul_pow_tanh), and the attention mask recomputed inside layers 0, 4 and 8 only.
PHI_GEMM = "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_bias_TNN"
PHI_MASK = ("triton_poi_fused__scaled_dot_product_efficient_attention__to_copy_add_arange_bitwise_and_constant_pad_"
            "nd_expand_index_le_lt_scalar_tensor_slice_sub_unsqueeze_view_where_6")


def _phi_layer(i: int, mask_at: int = 0) -> list[str]:
    norm = {0: "triton_per_fused_embedding_native_layer_norm_0",
            1: "triton_per_fused_add_embedding_native_layer_norm_view_8",
            2: "triton_per_fused_add_embedding_native_layer_norm_view_9"}.get(
        i, f"triton_per_fused_add_native_layer_norm_view_{10 + i % 2}")
    rotary_tables = (["triton_poi_fused__to_copy_expand_unsqueeze_1",
                      "triton_poi_fused__to_copy_bmm_expand_unsqueeze_2",
                      "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_tn_align1>"] if i == 0 else [])
    return ([norm, PHI_GEMM] + rotary_tables
            + [PHI_GEMM, "triton_poi_fused__to_copy_add_bmm_cat_cos_mul_neg_sin_slice_transpose_unsqueeze_view_3",
               "triton_poi_fused_cat_4", PHI_GEMM, "triton_poi_fused_cat_transpose_view_5"]
            + ([PHI_MASK] if i % 4 == mask_at else [])
            + ["fmha_cutlassF_bf16_aligned_64x64_rf_sm80", PHI_GEMM, PHI_GEMM,
               "triton_poi_fused_add_mul_pow_tanh_view_7", PHI_GEMM])


PHI_PROLOGUE = ["void at::native::vectorized_elementwise_kernel<2, at::native::BinaryFunctor<long>>",
                "void at::native::vectorized_elementwise_kernel<2, at::native::CUDAFunctor_add<long>>",
                "void at::native::CatArrayBatchedCopy_alignedK_contig",
                "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<bool>>",
                "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<long>>"]
PHI_TAIL = ["triton_per_fused_add_native_layer_norm_view_12", "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_bias_TNT",
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>"]


@pytest.mark.parametrize("layers, mask_at", [(12, 0), (16, 0), (12, 2), (8, 1)])
def test_alike_layers_with_a_kernel_in_every_fourth_are_each_a_layer(layers, mask_at):
    # The mask kernel, in every 4th layer only, cut blocks of 4 layers that ran more work in common than the layers
    # themselves (3 layers were read for 12): alike layers, where no name but that kernel runs in some of them and
    # not in others, are the finer partition though they run no work of their own; and one kind, the mask's layers
    # no kind of their own (they had read 3 + 9).
    stack = [_phi_layer(i, mask_at) for i in range(layers)]
    seqs = [PHI_PROLOGUE + [k for layer in stack for k in layer] + PHI_TAIL] * 3  # decode forwards alike
    names = sorted({n for f in seqs for n in f})
    mapping, canonical = name_classes(names)
    index = {n: int(mapping[i]) for i, n in enumerate(names)}
    arrays = [np.array([index[n] for n in f]) for f in seqs]
    found = count_layers(arrays[0], canonical, data_independent(arrays))
    norms = [len(PHI_PROLOGUE) + sum(len(layer) for layer in stack[:i]) for i in range(layers)]
    assert found.count == layers
    assert found.kind_of == () and [k.count for k in found.kinds] == [layers]
    # A layer's input norm is fused with the residual add that ends the layer before it: each layer begins at that
    # kernel or at its first projection right after it, the same in every layer. (Where the last one ends is still
    # read wrong: the README's third holdout paragraph.)
    assert found.starts in (tuple(norms), tuple(n + 1 for n in norms))


# LFM2-MoE under torch.compile (Inductor), one decode forward of the real H100 holdout trace, kernel for kernel:
# short-conv and attention layers in turn, the first two with a dense MLP, the rest with experts (grouped GEMMs).
# Inductor fuses every norm into other kernels (the first with the embedding, the others with the residual add
# before them, after experts with their combine), so only the mixers' own kernels run once per layer.
LFM_GEMM, LFM_DTOD = "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN", "Memcpy DtoD (Device -> Device)"
LFM_NORM = "triton_per_fused__to_copy__unsafe_view_add_embedding_mean_mul_pow_rsqrt_8"
LFM_MASK = ("triton_poi_fused__scaled_dot_product_efficient_attention__to_copy__unsafe_view_add_arange_bitwise_and_"
            "bmm_cat_15")
LFM_ROTARY = "triton_poi_fused__to_copy__unsafe_view_add_bmm_cat_cos_mean_mul_pow_rsqrt_transpose_unsqueeze_view_3"
LFM_INDEX = "triton_poi_fused_clamp_index_view_23"


def _lfm2_conv() -> list[str]:
    return [LFM_GEMM, "triton_poi_fused__unsafe_view_cat_mul_split_transpose_6",
            "void at::native::conv_depthwise2d_forward_kernel_generic<c10::BFloat16, int>",
            "triton_poi_fused__unsafe_view_mul_slice_split_transpose_7", "triton_poi_fused_copy_copy__slice_8",
            LFM_GEMM]


def _lfm2_attention() -> list[str]:
    return [LFM_GEMM, LFM_GEMM, "triton_per_fused__to_copy__unsafe_view_add_bmm_cat_cos_mean_mul_neg_pow_rsqrt_sin_13",
            LFM_GEMM, LFM_MASK, "triton_poi_fused__unsafe_view_cat_transpose_view_16", LFM_MASK,
            "fmha_cutlassF_bf16_aligned_64x64_rf_sm80", LFM_GEMM]


def _lfm2_mlp() -> list[str]:  # ends with the residual add fused with the next norm
    return [LFM_NORM, LFM_GEMM, LFM_GEMM, "triton_poi_fused__unsafe_view_mul_silu_9", LFM_GEMM, LFM_NORM]


def _lfm2_experts() -> list[str]:  # the router, the grouped expert GEMMs, the combine fused with the add and next norm
    return [LFM_NORM, "nvjet_sm90_tst_64x8_64x16_1x1_h_bz_TNT",
            "triton_poi_fused__to_copy__unsafe_view_add_clone_expand_mean_mul_pow_rsqrt_unsqueeze_view_20",
            "triton_poi_fused_add_sigmoid_18", "void at::native::sbtopk::gatherTopK<c10::BFloat16>",
            "void at::native::bitonicSortKVInPlace<c10::BFloat16, long>",
            "triton_poi_fused_add_div_gather_mul_sigmoid_sum_22", LFM_INDEX, LFM_DTOD, LFM_GEMM, LFM_INDEX,
            "triton_poi_fused_mul_silu_split_squeeze_25", LFM_DTOD, LFM_GEMM,
            "triton_per_fused__to_copy__unsafe_view_add_div_gather_mean_mul_pow_rsqrt_sigmoid_squeeze_sum_view_26"]


def _lfm2_moe_forward(stack: list[str]) -> tuple[list[str], list[list[str]], list[str]]:
    prologue = [LFM_DTOD, LFM_DTOD, LFM_NORM, "triton_poi_fused__to_copy_unsqueeze_0",
                "triton_poi_fused__to_copy_bmm_expand_unsqueeze_2", LFM_ROTARY, LFM_MASK, LFM_ROTARY, LFM_ROTARY,
                LFM_MASK]
    layers = []
    for i, kind in enumerate(stack):
        mixer = _lfm2_conv() if kind.startswith("conv") else _lfm2_attention()
        if i == 0:  # Inductor runs the rotary tables' product inside the first layer
            mixer = mixer[:1] + ["void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_tn_align1>"] + mixer[1:]
        layers.append(mixer + (_lfm2_experts() if kind.endswith("moe") else _lfm2_mlp()))
    tail = ["nvjet_sm90_tst_64x8_64x16_4x1_v_bz_lm_head_TNT", "void elementwise_kernel_with_index<arange_cuda_out>",
            "void at::native::CatArrayBatchedCopy_alignedK_contig<8u>", LFM_DTOD, LFM_DTOD,
            "void at::native::reduce_kernel<ArgMaxOps<float>>", "Memcpy DtoH (Device -> Pinned)"]
    return prologue, layers, tail


@pytest.mark.parametrize("stack", [
    ["conv mlp", "attention mlp"] + ["conv moe", "attention moe"] * 2,  # the trace's
    ["conv mlp", "attention mlp"] + ["conv moe", "attention moe"] * 3,
    ["conv moe", "attention moe"] * 3,
    ["attention mlp", "conv mlp"] + ["attention moe", "conv moe"] * 2,
])
def test_two_mixers_in_turn_whose_norms_a_compiler_fused_are_each_a_layer(stack):
    # Only the mixers' kernels run once per layer: the conv's and the attention's count the pairs (3 for 6 layers,
    # kinds 1 + 2 were read). Each mixer is followed by the same MLP or experts before the other's: the pairs split
    # at each mixer, one layer per mixer, each of its kind (conv or attention, with an MLP or experts).
    prologue, layers, tail = _lfm2_moe_forward(stack)
    seq = prologue + [k for layer in layers for k in layer] + tail
    names = sorted(set(seq))
    mapping, canonical = name_classes(names)
    index = {n: int(mapping[i]) for i, n in enumerate(names)}
    arrays = [np.array([index[n] for n in seq])] * 2  # compiled and grouped: every decode forward runs alike
    found = count_layers(arrays[0], canonical, data_independent(arrays))
    assert found.count == len(stack)
    first = {k: found.kind_of[stack.index(k)] for k in stack}
    assert found.kind_of == tuple(first[k] for k in stack) and len(set(first.values())) == len(set(stack))
    starts = [len(prologue) + sum(len(layer) for layer in layers[:i]) for i in range(len(stack))]
    assert found.end == starts[-1] + len(layers[-1])
    # Each layer begins at its first kernel or, for the second layer of each pair, one later: its first projection is
    # still read as the layer before's, whose experts or MLP end in a projection too (the README says so).
    assert found.starts[0] == starts[0]
    assert all(s <= got <= s + 1 for s, got in zip(starts, found.starts, strict=True))


LFM_SILU = "triton_poi_fused__unsafe_view_mul_silu_8"
LFM_QNORM = "triton_per_fused__to_copy__unsafe_view_add_bmm_cat_cos_mean_mul_neg_pow_rsqrt_sin_slice_transpose_10"
LFM_KNORM = "triton_per_fused__scaled_dot_product_efficient_attention__to_copy__unsafe_view_add_arange_12"
LFM_KV = "triton_poi_fused__unsafe_view_cat_transpose_view_14"


def _lfm2_dense_layer(kind: str, first_attention: bool = False) -> list[str]:
    """A compiled dense LFM2 layer: its input norm (fused with the residual add before it), its mixer, the MLP's norm
    and a SwiGLU MLP. The first attention layer computes the rotary tables too: Inductor fuses that once-per-forward
    work into its k norm, which then runs as kernels of their own."""
    if kind == "conv":
        mixer = [LFM_GEMM, "triton_poi_fused__unsafe_view_cat_mul_split_transpose_4",
                 "triton_poi_fused_copy_copy__slice_5",
                 "void at::native::conv_depthwise2d_forward_kernel_generic<c10::BFloat16, int>",
                 "triton_poi_fused__unsafe_view_mul_slice_split_transpose_6", LFM_GEMM]
    else:
        knorm = (["triton_per_fused__to_copy__unsafe_view_mean_pow_view_11", LFM_MASK,
                  "triton_poi_fused__to_copy__unsafe_view_add_bmm_cat_cos_mean_mul_pow_rsqrt_transpose_13", LFM_KV]
                 + ["triton_poi_fused__to_copy__unsafe_view_add_bmm_cat_cos_mean_mul_pow_rsqrt_transpose_13"] * 3
                 if first_attention else [LFM_KNORM, LFM_KV])
        mixer = [LFM_GEMM, LFM_QNORM, LFM_GEMM, LFM_GEMM] + knorm + [
            LFM_MASK, LFM_MASK, "fmha_cutlassF_bf16_aligned_64x64_rf_sm80", LFM_GEMM]
    return [LFM_NORM] + mixer + [LFM_NORM, LFM_GEMM, LFM_GEMM, LFM_SILU, LFM_GEMM]


def _lfm2_dense_forward(stack: list[str]) -> tuple[list[str], list[list[str]], list[str]]:
    prologue = [LFM_DTOD, LFM_DTOD, "triton_poi_fused__to_copy_bmm_expand_unsqueeze_0", LFM_MASK, LFM_MASK,
                "triton_poi_fused__to_copy_unsqueeze_0", "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_tn>"]
    layers = [_lfm2_dense_layer(kind, kind == "attention" and kind not in stack[:i]) for i, kind in enumerate(stack)]
    tail = [LFM_NORM, "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "void elementwise_kernel_with_index<arange_cuda_out>",
            "void at::native::CatArrayBatchedCopy_alignedK_contig<8u>", LFM_DTOD, LFM_DTOD,
            "void at::native::reduce_kernel<ArgMaxOps<float>>", "Memcpy DtoH (Device -> Pinned)"]
    return prologue, layers, tail


@pytest.mark.parametrize("stack", [["conv", "attention"] * n for n in (3, 4, 5)])
def test_two_mixers_in_turn_with_the_longer_one_last_run_to_the_final_norm(stack):
    # A compiled dense LFM2: the conv's and the attention's kernels count the pairs (4 were read for 8 layers). Split
    # at both mixers, the last block, an attention layer longer than the median (conv) block, runs on to the final
    # norm, though the output head after it projects on a tile of its own: its MLP (and its activation) is inside.
    # Inductor also fuses the once-per-forward rotary tables into the first attention layer's k norm (kernels only it
    # runs): that layer is an attention layer all the same, not a kind of its own (1 + 3 + 4 were read).
    _assert_read_right([_lfm2_dense_forward(stack)] * 2, stack)  # compiled: every decode forward runs alike


G4_WEIGHT = "void at::native::BinaryFunctor<float, float, float, MulFunctor>"
G4_PLE_GATE = "nvjet_sm90_tst_64x8_1x1_TNT"
G4_PROLOGUE = ["void at::native::indexSelectSmallIndex", ELEMENTWISE, "void at::native::indexSelectSmallIndex",
               ELEMENTWISE, GEMM, "void at::native::mul_scalar<c10::BFloat16>", COPY,
               "void at::native::pow_tensor_scalar_kernel", "void at::native::mean_kernel_cuda",
               "void at::native::add_scalar_kernel<float>", "void at::native::rsqrt_kernel_cuda",
               "void at::native::mul_kernel<float>", COPY, TO_BF16, ADD, "void at::native::mul_scalar<c10::BFloat16>",
               "cutlass_80_simt_sgemm_128x32", "void at::native::cos_kernel", "void at::native::sin_kernel", TO_BF16]
G4_TAIL = ([COPY, "void at::native::pow_tensor_scalar_kernel", "void at::native::mean_kernel_cuda",
            "void at::native::add_scalar_kernel<float>", "void at::native::rsqrt_kernel_cuda",
            "void at::native::mul_kernel<float>", COPY, G4_WEIGHT, TO_BF16]  # the final norm
           + ["nvjet_sm90_tst_64x8_lm_head_TNT", "void at::native::div_kernel", "void at::native::tanh_kernel",
              "void at::native::mul_scalar<float>", "void at::native::reduce_kernel<ArgMaxOps<float>>"])


def _gemma4_norm(kind: str = "layer") -> list[str]:
    """Gemma 4's RMSNorm, eager: a layer norm's weight multiply runs on a kernel of its own, a q / k norm's on the
    normalising multiply's kernel; the v norm has no weight."""
    norm = [COPY, "void at::native::pow_tensor_scalar_kernel", "void at::native::mean_kernel_cuda",
            "void at::native::add_scalar_kernel<float>", "void at::native::rsqrt_kernel_cuda",
            "void at::native::mul_kernel<float>"]
    weight = {"layer": [COPY, G4_WEIGHT], "head": [COPY, "void at::native::mul_kernel<float>"], "v": []}[kind]
    return norm + weight + [TO_BF16]


def _gemma4_layer(full: bool) -> list[str]:
    """An eager Gemma 4 text layer as the H100 trace runs it: norms around the attention and the MLP, q / k / v
    norms, a GeGLU MLP, and then the per-layer input block: a gate projection (on a tile of its own), the same GeLU
    and multiply as the MLP's, a projection, its norm and residual add, and the layer's scalar. Sliding layers run
    the memory-efficient kernel on a windowed cache, full ones flash attention."""
    rope = [ELEMENTWISE, "void at::native::neg_kernel", "void at::native::CatArrayBatchedCopy", ELEMENTWISE, ADD]
    cache = (["void at::native::CatArrayBatchedCopy_vectorized"] * 2 + ["void pytorch_flash::flash_fwd_kernel"] if full
             else ["void at::native::CatArrayBatchedCopy"] * 2 + ["void at::native::direct_copy_kernel<strided>"] * 2
             + ["void at::native::FillFunctor<c10::BFloat16>"] * 2
             + ["void at::native::where_kernel", "fmha_cutlassF_bf16_aligned_64x64_rf_sm80"])
    attention = ([GEMM] + _gemma4_norm("head") + rope + [GEMM, GEMM] + _gemma4_norm("head") + rope + _gemma4_norm("v")
                 + cache + [GEMM])
    mlp = [GEMM, GELU, GEMM, MUL_NC, GEMM]
    per_layer_input = [G4_PLE_GATE, GELU, MUL_NC, GEMM] + _gemma4_norm() + [ADD, ELEMENTWISE]
    return (_gemma4_norm() + attention + _gemma4_norm() + [ADD] + _gemma4_norm() + mlp + _gemma4_norm() + [ADD]
            + per_layer_input)


@pytest.mark.parametrize("layers", [6, 8, 12])
def test_a_layer_whose_per_layer_input_gate_runs_the_mlps_activation_is_one_layer(layers):
    # Gemma 4's per-layer input gate runs the MLP's GeLU and multiply again: the activation counts 2L blocks, each
    # running it and a projection (16 layers of 3 kinds were read for 8). Its blocks run unlike (the MLP's end and
    # the gate; the rest of the layer), so they are parts of layers: the gate's own projection tile counts them.
    # 5 sliding : 1 full attention, the last layer full.
    kinds = ["full" if i % 6 == 5 or i == layers - 1 else "sliding" for i in range(layers)]
    stack = [_gemma4_layer(kind == "full") for kind in kinds]
    _assert_read_right([(G4_PROLOGUE, stack, G4_TAIL), (G4_PROLOGUE, stack, G4_TAIL)], kinds)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("pattern", [["conv", "conv", "attention"], ["conv", "attention", "conv"],
                                     ["conv", "conv", "attention", "conv"]])
def test_two_mixers_in_turn_with_attention_every_third_or_fourth_layer_are_each_a_layer(pattern, n):
    # A compiled LFM2 as released (attention every third or fourth layer): the attention kernels count groups of 3 or
    # 4 layers (3 were read for 9), the MLP's SiLU counts the layers, but most of their work is their mixer's, which
    # runs in only some of them. Each layer runs one mixer or the other, its first kernel at the same place: the two
    # mixers' kernels take turns, and count as work every layer runs.
    stack = pattern * n
    prologue, layers, tail = _lfm2_dense_forward(stack)
    _assert_read_right([(prologue, layers, tail), (prologue, layers, tail)], stack)


# Gated-delta-net hybrids with a dense MLP (Qwen3.5, OLMo Hybrid): three linear-attention layers to one attention
# layer. The delta net's torch path runs many kernels an attention layer never runs, the MLP is small, and at decode
# cuBLAS picks one tile for every projection (one GEMM name), so the layers of the two kinds share little and no
# kernel runs once in every layer: a split by the attention kernels is still the layers, each kind's alike.
GEMV = "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN"


def _gated_delta_net() -> list[str]:
    l2norm = ["void at::native::pow_tensor_scalar_kernel", "void at::native::sum_kernel_cuda",
              "void at::native::clamp_min_kernel", "void at::native::rsqrt_kernel_cuda", "void at::native::mul_kernel"]
    return ([GEMV, GEMV, "void at::native::conv_depthwise2d_forward_kernel", SILU, "void at::native::sigmoid_kernel",
             "void at::native::softplus_kernel", "void at::native::neg_kernel", "void at::native::exp_kernel_cuda"]
            + l2norm + l2norm
            + ["void at::native::direct_copy_kernel<float>"] * 5  # q, k, v, g, beta to fp32
            + ["void at::native::transpose_copy_kernel"] * 3
            + ["void at::native::mul_kernel", "void at::native::exp_kernel_cuda", "void at::native::mul_kernel",
               "void at::native::mul_kernel", "void at::native::sum_kernel_cuda", "void at::native::sub_kernel",
               "void at::native::mul_kernel", "void at::native::mul_kernel", "void at::native::add_kernel",
               "void at::native::mul_kernel", "void at::native::sum_kernel_cuda", "void at::native::copy_state_kernel",
               "void at::native::transpose_copy_kernel", "void at::native::bfloat16_copy_kernel"]
            + _norm() + ["void at::native::sigmoid_kernel", "void at::native::mul_kernel", GEMV])


def _gated_attention() -> list[str]:
    return ([GEMV, GEMV] + _norm() + _norm() + ["void at::native::rotary_cat_kernel",
                                                 "void pytorch_flash::flash_fwd_kernel",
                                                 "void at::native::sigmoid_kernel", "void at::native::mul_kernel",
                                                 GEMV])


def _gdn_layer(kind: str) -> list[str]:
    mixer = _gated_attention() if kind == "attention" else _gated_delta_net()
    return _norm() + mixer + [ADD] + _norm() + [GEMV, SILU, GEMV] + [ADD]


@pytest.mark.parametrize("layers", [8, 12])
def test_a_gated_delta_net_hybrid_with_a_dense_mlp_counts_every_layer(layers):
    # Every 4th layer attention: the attention kernels, run in every 4-layer block, count those blocks (2 for 8) and
    # explain nearly all the work; the delta-net kernels count its layers, and the attention kernels cut their blocks.
    stack = ["attention" if i % 4 == 3 else "gdn" for i in range(layers)]
    _assert_read_right([(PROLOGUE, [_gdn_layer(kind) for kind in stack], JAMBA_TAIL)] * 2, stack)


def test_a_compiled_gated_delta_net_hybrid_counts_every_layer_though_the_seams_fuse_apart():
    # Inductor fuses a layer's last kernels with the next layer's first: a delta-net layer before an attention layer
    # runs its own variant of two fused kernels (its out-projection's epilogue and the next norm), so no name but the
    # mixers' runs in every layer of a kind; those layers are still of their kind.
    def fused(i: int, kind: str) -> list[str]:
        seam = i + 1 < 8 and (i + 1) % 4 == 3  # the next layer is attention
        tail = ["triton_poi_fused_add_mul_sigmoid_12", "triton_per_fused_add_mean_pow_rsqrt_13"] if not seam else [
            "triton_poi_fused_add_mul_sigmoid_view_31", "triton_per_fused_add_mean_mul_pow_rsqrt_32"]
        if kind == "attention":
            mixer = ["nvjet_sm90_tst_64x8_q_gate_TNT", "nvjet_sm90_tst_64x8_kv_TNT",
                     "triton_per_fused_mean_mul_pow_rsqrt_rotary_7", "triton_poi_fused_cat_rotary_8",
                     "void pytorch_flash::flash_fwd_kernel", "triton_poi_fused_mul_sigmoid_9",
                     "nvjet_sm90_tst_64x8_o_proj_TNT", "triton_per_fused_add_mean_pow_rsqrt_10"]
        else:
            mixer = ["nvjet_sm90_tst_64x8_qkvz_TNT", "nvjet_sm90_tst_8x64_ba_TNN", "triton_poi_fused_conv_silu_1",
                     "triton_per_fused_l2norm_pow_sum_2", "triton_poi_fused_exp_neg_softplus_3",
                     "triton_per_fused_delta_rule_mul_sum_4", "triton_per_fused_delta_rule_add_sub_5",
                     "triton_per_fused_gated_norm_sigmoid_6", "nvjet_sm90_tst_64x8_out_proj_TNT"]
        mlp = ["nvjet_sm90_tst_128x8_up_TNT", "triton_poi_fused_mul_silu_11", "nvjet_sm90_tst_64x8_down_TNT"]
        return mixer + mlp + tail

    stack = ["attention" if i % 4 == 3 else "gdn" for i in range(8)]
    prologue = ["triton_poi_fused_embedding_0", "triton_per_fused_add_mean_pow_rsqrt_13"]
    tail = ["triton_per_fused_mean_pow_rsqrt_40", "nvjet_sm90_tst_256x8_lm_head_TNT",
            "void at::native::reduce_kernel<ArgMaxOps<float>>"]
    layers = [fused(i, kind) for i, kind in enumerate(stack)]
    runs = prologue + [k for layer in layers for k in layer] + tail
    names = sorted(set(runs))
    mapping, canonical = name_classes(names)
    index = {n: int(mapping[i]) for i, n in enumerate(names)}
    found = count_layers(np.array([index[n] for n in runs]), canonical)
    assert found.count == 8



def test_glue_that_runs_once_more_before_the_layers_adds_no_layer():
    # Three decode forwards of an eager Qwen3-MoE over a static cache (kernel names of a real H100 trace, with the
    # generator's truth): the cache's position bookkeeping (an add and a fill on int64) runs once before the layers and
    # once in each layer. Its count, one more than the layers and explaining more than the MoE routing's, put a block
    # of glue before the first layer that runs no MLP activation; it is no layer, and the routing's count stands.
    doc, forwards = _kernel_sequences("qwen3_moe_static_decode")
    for found in _each_forwards_layers(doc, forwards):
        assert found.count == doc["truth"]["layers"] == 4
        assert _kinds(found) == doc["truth"]["layer_kinds"] == [4]


# Eager layers as transformers runs them at decode (RMSNorm in float32, one GEMM tile for every projection), to read
# stacks whose layers differ: a dense first layer before groups of sliding / full-attention MoE layers, and layers that
# route twice on the same router kernels (over attention heads, then over experts).
_GEMM = "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN"
_EXPERT_GEMM = "nvjet_sm90_tst_16x64_64x16_4x1_h_bz_TNT"
_MUL = "void at::native::elementwise_kernel<MulFunctor nocast>"
_ROPE = ["void at::native::BinaryFunctor<mul>", "void at::native::neg_kernel", "void at::native::CatArrayBatchedCopy",
         "void at::native::BinaryFunctor<mul>", ADD]
_EMBED = ["void at::native::indexSelectSmallIndex", "void at::native::arange_kernel", "void at::native::cos_kernel",
          "void at::native::sin_kernel"]


def _fp32_norm() -> list[str]:
    return ["void at::native::direct_copy_kernel_cuda", "void at::native::pow_tensor_scalar_kernel",
            "void at::native::mean_kernel_cuda", "void at::native::CUDAFunctorOnSelf_add<float>",
            "void at::native::rsqrt_kernel_cuda", "void at::native::mul_kernel<float>",
            "void at::native::bfloat16_copy_kernel_cuda", "void at::native::BinaryFunctor<bf16, MulFunctor>"]


def _windowed_attention(full: bool) -> list[str]:
    kernel = "void pytorch_flash::flash_fwd_kernel" if full else "fmha_cutlassF_bf16_aligned_64x64_rf_sm80"
    return (_fp32_norm() + [_GEMM] * 3 + _ROPE + _ROPE + ["void at::native::CatArrayBatchedCopy_vectorized"] * 2
            + [kernel, _GEMM, ADD])


def _gated_mlp() -> list[str]:
    return _fp32_norm() + [_GEMM, SILU, _GEMM, _MUL, _GEMM, ADD]


def _fp32_shared_expert_moe(experts: int) -> list[str]:
    out = _fp32_norm() + [_GEMM, "void at::native::softmax_warp_forward<float>", "void at::native::sbtopk::gatherTopK",
                          "void at::native::scatter_gather_elementwise_kernel",
                          "void at::native::index_elementwise_kernel<128, 4>"]
    for _ in range(experts):
        out += ["void at::native::nonzero_kernel", "void at::native::index_elementwise_kernel<128, 4>", _EXPERT_GEMM,
                SILU, _EXPERT_GEMM, _MUL, _EXPERT_GEMM, "void at::native::indexFuncLargeIndex<c10::BFloat16>"]
    return out + [_GEMM, SILU, _GEMM, _MUL, _GEMM, ADD, ADD]  # the shared expert, the combine


def _read_each(forwards: list[list[str]]) -> list:
    """Each forward's layers, told the names that run alike in every forward."""
    names = sorted({n for f in forwards for n in f})
    mapping, canonical = name_classes(names)
    index = {n: int(mapping[i]) for i, n in enumerate(names)}
    seqs = [np.array([index[n] for n in f]) for f in forwards]
    stable = data_independent(seqs)
    return [count_layers(s, canonical, stable) for s in seqs]


def _starts(prologue: list[str], layers: list[list[str]]) -> tuple[int, ...]:
    return tuple(len(prologue) + sum(len(x) for x in layers[:i]) for i in range(len(layers)))


@pytest.mark.parametrize("embedding_norm", [False, True])
def test_a_dense_first_layer_before_sliding_and_full_moe_groups_begins_at_its_input_norm(embedding_norm):
    # 8 layers: a dense first layer, then MoE ones; every 4th attends fully on another kernel. The full-attention
    # kernel counts groups of 4 layers, aligned by the add that ends the layer before, which layer 0 lacks: it began
    # at layer 1. With an embedding norm on the same kernels before it (BLOOM's), layer 0 still begins at its own norm.
    prologue = _EMBED + (_fp32_norm() if embedding_norm else [])
    forwards, truths = [], []
    for seed in (1, 2, 3):
        rnd = random.Random(seed)
        layers = [_windowed_attention(full=i % 4 == 3)
                  + (_gated_mlp() if i == 0 else _fp32_shared_expert_moe(rnd.randint(2, 6))) for i in range(8)]
        forwards.append(prologue + [k for layer in layers for k in layer] + _fp32_norm() + TAIL[2:])
        truths.append(_starts(prologue, layers))
    for found, starts in zip(_read_each(forwards), truths, strict=True):
        assert found.count == 8
        assert found.starts == starts
        groups = {}
        for layer, kind in enumerate(found.kind_of):
            groups.setdefault(kind, []).append(layer)
        assert sorted(groups.values()) == [[0], [1, 2, 4, 5, 6], [3, 7]]


@pytest.mark.parametrize("dense", [1, 2])
@pytest.mark.parametrize("groups", [2, 3])
def test_dense_first_layers_before_whole_groups_count_their_layers_not_their_halves(dense, groups):
    # Dense first layers, then groups of four MoE layers whose last attends fully. The norm's kernels run before
    # every mixer and every MLP and once more at the final norm (2L + 1 times): the halves of layers that cuts there
    # make, every other one running an MLP activation, were read as 2L + 1 layers with two groups; they stand only
    # where no other count is a partition (the mixers count the layers here). With two dense layers the MoE layers
    # were read alone: the blocks before them are layers too, paired like theirs.
    forwards, truths = [], []
    for seed in (1, 2, 3):
        rnd = random.Random(seed)
        layers = [_windowed_attention(full=False) + _gated_mlp() for _ in range(dense)]
        layers += [_windowed_attention(full=i % 4 == 3) + _fp32_shared_expert_moe(rnd.randint(2, 6))
                   for i in range(4 * groups)]
        forwards.append(_EMBED + [k for layer in layers for k in layer] + _fp32_norm() + TAIL[2:])
        truths.append(_starts(_EMBED, layers))
    for found, starts in zip(_read_each(forwards), truths, strict=True):
        assert found.count == dense + 4 * groups
        assert found.starts == starts
        groups_read = {}
        for layer, kind in enumerate(found.kind_of):
            groups_read.setdefault(kind, []).append(layer)
        moe = range(dense, dense + 4 * groups)
        assert sorted(groups_read.values()) == sorted([list(range(dense)), [i for i in moe if (i - dense) % 4 != 3],
                                                       [i for i in moe if (i - dense) % 4 == 3]])


def test_halves_of_layers_stand_where_no_other_count_partitions():
    # A dense first layer that attends fully, then five sliding-window MoE layers: no name but the norm's counts every
    # layer, so the halves it cuts (2L + 1 runs) are the reading, paired into layers.
    forwards, truths = [], []
    for seed in (1, 2, 3):
        rnd = random.Random(seed)
        layers = [_windowed_attention(full=True) + _gated_mlp()]
        layers += [_windowed_attention(full=False) + _fp32_shared_expert_moe(rnd.randint(2, 6)) for _ in range(5)]
        forwards.append(_EMBED + [k for layer in layers for k in layer] + _fp32_norm() + TAIL[2:])
        truths.append(_starts(_EMBED, layers))
    for found, starts in zip(_read_each(forwards), truths, strict=True):
        assert (found.count, found.starts, _kinds(found)) == (6, starts, [1, 5])

_ROUTER = ["void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x1_tn_align8>",
           "void at::native::direct_copy_kernel_cuda", "void at::native::sbtopk::gatherTopK<float>",
           "void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float>", "void at::native::radixSortKVInPlace",
           "void at::native::FillFunctor<c10::BFloat16>", "void at::native::reduce_kernel<long sum>", "Memcpy DtoH",
           "void at::native::index_kernel<OpaqueType<2>>", "void at::native::vectorized_gather_kernel<16, long>"]
_COMBINE = ["void at::native::BinaryFunctor<bf16, MulFunctor>", "void at::native::indexFuncSmallIndex<bf16>", ADD]


def _routed(experts: int) -> list[str]:  # one GEMM per expert that got tokens, then their sum
    return [_GEMM] * experts + ["void at::native::sum_kernel<bf16>"]


def _routed_heads_layer(rnd: random.Random, dense: bool) -> list[str]:
    attention = (_fp32_norm() + _ROUTER + _routed(rnd.randint(1, 2)) + _ROPE
                 + ["fmha_cutlassF_bf16_aligned_64x64_rf_sm80"] + _routed(rnd.randint(1, 2)) + _COMBINE)
    if dense:
        return attention + _gated_mlp()
    return attention + _fp32_norm() + _ROUTER + _routed(rnd.randint(1, 2)) + [SILU, _MUL] + _routed(
        rnd.randint(1, 2)) + _COMBINE


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dense_every_other", [False, True])
def test_layers_that_route_twice_on_one_router_begin_at_their_own_norm(seed, dense_every_other):
    # JetMoE's layers route over attention heads as they begin and over experts after the attention, on the same
    # router kernels; two decodes leave the expert launches' counts looking alike. A layer's start sought where its
    # head begins like layer 0's must lie past the router the layer before runs in its tail, and a dense layer's tail
    # (every other layer here) runs none: the next layer's own router is not its.
    rnd = random.Random(seed)
    forwards, truths = [], []
    for _ in range(2):
        layers = [_routed_heads_layer(rnd, dense_every_other and i % 2 == 1) for i in range(4)]
        forwards.append(_EMBED + [k for layer in layers for k in layer] + _fp32_norm() + TAIL[2:])
        truths.append(_starts(_EMBED, layers))
    for found, starts in zip(_read_each(forwards), truths, strict=True):
        assert found.count == 4
        assert found.starts == starts

def _kernel_sequences(name: str) -> tuple[dict, list[np.ndarray]]:
    """A real trace's kernel sequences with their generator's truth (tests/fixtures/kernel_sequences), and its
    forwards as arrays."""
    doc = json.loads((Path(__file__).parent / "fixtures" / "kernel_sequences" / f"{name}.json").read_text())
    return doc, [np.array(f) for f in doc["forwards"]]


def _each_forwards_layers(doc: dict, forwards: list[np.ndarray]) -> list:
    """Each forward's layers, told the names that run alike in every forward."""
    stable = data_independent(forwards)
    return [count_layers(seq, doc["names"], stable) for seq in forwards]


def test_three_kinds_of_layer_are_counted_where_each_layer_begins():
    # Two decode forwards of an eager Kimi Linear (kernel names of a real H100 trace, with the generator's truth): a
    # dense first layer, five linear-attention MoE layers and two MLA MoE layers (the 4th and the 8th). The names
    # that run once in each layer run at another place in each kind, so blocks cut at them hold parts of two layers
    # and the names that run in every layer run 1 to 3 times a block: the count explained less than the two halves of
    # the stack, and the forward read 2 layers. Cut where each layer begins, every name runs a fixed number of times in
    # each layer of a kind.
    doc, forwards = _kernel_sequences("kimi_linear_decode")
    for found in _each_forwards_layers(doc, forwards):
        assert found.count == doc["truth"]["layers"] == 8
        assert _kinds(found) == sorted(doc["truth"]["layer_kinds"]) == [1, 2, 5]
        groups = {}
        for layer, kind in enumerate(found.kind_of):
            groups.setdefault(kind, []).append(layer)
        assert sorted(groups.values()) == [[0], [1, 2, 4, 5, 6], [3, 7]]  # the generator's layer_kind_detail


def test_a_dense_first_layer_before_groups_of_sliding_and_full_attention_moe_layers_is_a_layer():
    # Three decode forwards of an eager EXAONE-MoE (kernel names of a real H100 trace, with the generator's truth): a
    # dense first layer, then seven MoE layers, three sliding-window attention layers to one full (the 4th and the
    # 8th, on another attention kernel). The full-attention kernel counts groups of four layers; aligned by what the
    # groups run alike, they began at the residual add that ends the layer before, which the first layer lacks, so
    # the dense layer passed for glue before the layers: 7 were read.
    doc, forwards = _kernel_sequences("exaone_moe_decode")
    for found in _each_forwards_layers(doc, forwards):
        assert found.count == doc["truth"]["layers"] == 8
        groups = {}
        for layer, kind in enumerate(found.kind_of):
            groups.setdefault(kind, []).append(layer)
        assert sorted(groups.values()) == [[0], [1, 2, 4, 5, 6], [3, 7]]
        assert doc["truth"]["kind_layers"][0] == [0]  # the generator's dense layer


def test_a_layer_ends_after_its_routers_run_as_often_as_in_every_known_tail():
    # The two decode forwards a cut file kept of an eager JetMoE (kernel names of a real H100 trace, with the
    # generator's truth): each layer routes its tokens twice on the same kernels, over attention heads as it begins
    # and over experts after the attention. Two forwards leave some data-dependent launches looking alike, so one
    # layer's head (its attention experts) ends unlike layer 0's, and its seam was sought by what begins like layer
    # 0's head: the MoE router of the layer before matched further and began it, leaving that layer without its MLP
    # (two kinds were read). The layer before runs its router in its tail as often as every known tail does.
    doc, forwards = _kernel_sequences("jetmoe_cut_two_decodes")
    for found in _each_forwards_layers(doc, forwards):
        assert found.count == doc["truth"]["layers"] == 4
        assert _kinds(found) == doc["truth"]["layer_kinds"] == [4]


def test_a_sparse_last_layer_longer_than_a_typical_block_is_a_layer():
    # The decoder's first forward of Switch Transformers (kernel names of a real H100 trace, with the generator's
    # truth): dense and top-1 MoE layers in turn, so the last is sparse and runs longer than a typical block. Its
    # dispatch kernels run once in each sparse layer: in layer 1's block and, past the last block's typical end, in
    # layer 3's. Counted as run outside the layers, they were no per-layer work of the 4 layers, which then explained
    # less than pairs of layers did: the forward read 2 layers.
    doc, forwards = _kernel_sequences("switch_decoder_first_forward")
    found = count_layers(forwards[0], doc["names"])
    assert found.count == doc["truth"]["layers"] == 4
    assert found.kind_of == (0, 1, 2, 1)  # layer 0 with the position bias, 1 and 3 sparse, 2 dense
    assert sorted(Counter(found.kind_of).values()) == doc["truth"]["layer_kinds"] == [1, 1, 2]


def test_a_forward_cut_inside_that_passes_for_as_many_layers_is_cut():
    # The window of the same capture closed inside a forward (a layer-4 hook stopped the profiler): its layers 0-3
    # and part of 4 read 8 "layers" of other blocks, as many as the whole forwards. It runs only their kernels and
    # fewer of the names that counted their layers, so it is cut; neither whole forward is.
    from decodegap.steps.anchors import _cut_short
    from decodegap.steps.across_forwards import data_dependent

    doc, forwards = _kernel_sequences("kimi_linear_decode")
    cut = np.array(doc["cut_forward"])
    varying = data_dependent(forwards)
    whole = count_layers(forwards[0], doc["names"], varying=varying)
    assert whole.count == 8
    assert count_layers(cut, doc["names"], varying=varying).count == 8  # what the count alone could not tell
    assert _cut_short(8, cut, 8, set(whole.backers), forwards)
    assert not _cut_short(8, forwards[1], 8, set(whole.backers), forwards[:1])


def test_a_compiled_layer_at_the_seam_before_another_kind_is_of_its_kind():
    # Three decode forwards of a torch.compile'd Qwen3.5 (kernel names of a real H100 trace, with the generator's
    # truth): 6 gated-delta-net layers and 2 full-attention ones (the 4th and the 8th). Inductor fuses the end of the
    # delta-net layer before the last attention layer into that layer's start, so it lacks one fused kernel its kind
    # runs and read as a kind of its own (5 + 2 + 1).
    doc, forwards = _kernel_sequences("qwen3_5_compiled_decode")
    for found in _each_forwards_layers(doc, forwards):
        assert found.count == doc["truth"]["layers"] == 8
        assert _kinds(found) == sorted(doc["truth"]["layer_kinds"]) == [2, 6]
        assert [i for i, k in enumerate(found.kind_of) if k != found.kind_of[0]] == [3, 7]  # layer_kind_detail


def test_a_forward_runs_the_names_that_counted_another_forwards_layers_once_per_layer():
    # The same capture: the second whole forward runs the names that counted the first one's 8 layers 8 times each;
    # the forward the window cut (layers 0-3 and part of 4) runs them fewer times; a reading one layer short is no
    # match either.
    from dataclasses import replace

    from decodegap.steps.across_forwards import data_dependent, runs_once_per_layer

    doc, forwards = _kernel_sequences("kimi_linear_decode")
    whole = count_layers(forwards[0], doc["names"], varying=data_dependent(forwards))
    assert whole.count == 8 and runs_once_per_layer(forwards[1], whole)
    assert not runs_once_per_layer(np.array(doc["cut_forward"]), whole)
    assert not runs_once_per_layer(forwards[1], replace(whole, count=7, backer_runs=7))


def test_single_mixer_blocks_are_layers_each():
    # Five decode forwards of an eager Nemotron-H (kernel names of a real H100 trace, with the generator's truth):
    # ten blocks, each one norm, one mixer or MLP and one residual add, in the pattern Mamba, MLP, Mamba, attention,
    # MLP, twice. No name runs once per block (the Mamba mixer's gated norm runs the input norm's kernels again), so
    # the attention kernel counted the pattern's two repeats as layers, each holding two Mamba blocks and two MLPs.
    # The blocks begin with the input norm and project in and out; two mixers in a row pair with no MLP.
    from decodegap.steps.across_forwards import runs_once_per_layer

    doc, forwards = _kernel_sequences("nemotron_h_decode")
    for i, found in enumerate(_each_forwards_layers(doc, forwards)):
        assert found.count == doc["truth"]["layers"] == 10
        # the names that counted the pattern's repeats stay the reading's: the other forwards run them as often
        assert found.backers and runs_once_per_layer(forwards[i - 1], found)
        assert _kinds(found) == sorted(doc["truth"]["layer_kinds"]) == [2, 4, 4]
        groups = {}
        for layer, kind in enumerate(found.kind_of):
            groups.setdefault(kind, []).append(layer)
        assert sorted(groups.values()) == [[0, 2, 5, 7], [1, 4, 6, 9], [3, 8]]  # the generator's layer_kind_detail


def test_blocks_that_take_turns_as_mixer_and_mlp_pair_into_layers():
    # Built here: four pre-norm layers of attention then MLP (eight blocks, each begun by the input norm and
    # projecting in and out) read as two layers of two attention and two MLP blocks each. The blocks' kinds take
    # turns, so they pair: four layers, not eight. With a second mixer in a row (attention, then a conv mixer) the
    # blocks are layers each.
    from decodegap.steps.layer_bounds import Layers
    from decodegap.steps.residual_blocks import residual_blocks

    names = ["copy", "pow", "mean", "rsqrt", "mul", "gemm_nvjet", "attn_flash", "silu", "add", "conv", "lm"]
    n = {k: i for i, k in enumerate(names)}
    norm = [n["copy"], n["pow"], n["mean"], n["rsqrt"], n["mul"]]
    attention = norm + [n["gemm_nvjet"], n["attn_flash"], n["gemm_nvjet"], n["add"]]
    conv = norm + [n["gemm_nvjet"], n["conv"], n["gemm_nvjet"], n["add"]]
    mlp = norm + [n["gemm_nvjet"], n["silu"], n["gemm_nvjet"], n["add"]]

    def read(blocks: list[list[int]]) -> tuple[int, tuple[int, ...]]:
        seq = np.array([k for b in blocks for k in b] + norm + [n["lm"]])
        counts = np.bincount(seq)
        positions = {i: np.flatnonzero(seq == i) for i in np.flatnonzero(counts >= 2).tolist()}
        half = sum(len(b) for b in blocks[:len(blocks) // 2])
        end = sum(len(b) for b in blocks)
        found = Layers(2, "pairs of layers", starts=(0, half), end=end, last=end - 1)
        got = residual_blocks(found, seq, positions, names, np.flatnonzero(seq == n["gemm_nvjet"]),
                              np.flatnonzero(seq == n["silu"]))
        return got.count, got.starts

    assert read([attention, mlp] * 4) == (4, (0, 18, 36, 54))
    assert read([attention, mlp, attention, conv, mlp] * 2)[0] == 10
    assert read([attention, mlp, conv, mlp] * 2)[0] == 4  # pairs: a mixer, then its MLP
    assert read([attention, conv] * 4)[0] == 8  # two mixers taking turns, no MLP: each block a layer


def test_names_an_expert_loop_ran_by_chance_tell_no_kind_where_another_phase_runs_them_elsewhere():
    # A real capture cut after its second forward (an eager Qwen3-MoE over a static cache: 4 MoE layers of one kind,
    # with the generator's truth) keeps one decode and the prefill. With one decode nothing tells the names an expert
    # loop ran by chance (an index kernel where an expert got one token, in layers 1-3) from a kind's: the decode
    # alone reads 1 + 3. The prefill, read as as many layers, runs that kernel in other layers: it tells no kind.
    from decodegap.steps.across_forwards import kinds_agreed

    doc, (decode, prefill) = _kernel_sequences("qwen3_moe_prefill_one_decode")
    alone = count_layers(decode, doc["names"])
    assert alone.count == 4 and _kinds(alone) == [1, 3]
    untelling = kinds_agreed(alone, decode, [prefill], doc["names"])
    agreed = count_layers(decode, doc["names"], untelling=untelling)
    assert agreed.count == doc["truth"]["layers"] == 4
    assert _kinds(agreed) == doc["truth"]["layer_kinds"] == [4]
    assert agreed.starts == alone.starts  # the kinds change, not the layers


def test_a_kinds_own_block_read_a_layer_apart_in_another_phase_still_tells_the_kind():
    # A real Zamba 1 capture cut after its second forward (the generator's truth: 9 layers, the shared attention block
    # in every third): the decode alone reads 6 + 3, its shared block's kernels in layers 2, 5 and 8. The prefill,
    # read as as many layers, takes that block as the end of the layer before it (1, 4, 7): a layer apart, the same
    # kind. Compared a layer apart, those names run in the same layers; the ones that do not (a fill the prefill runs
    # in every layer) tell no kind.
    from decodegap.steps.across_forwards import data_dependent, kinds_agreed

    doc, (decode, prefill) = _kernel_sequences("zamba_prefill_one_decode")
    alone = count_layers(decode, doc["names"])
    assert alone.count == doc["truth"]["layers"] == 9 and _kinds(alone) == doc["truth"]["layer_kinds"] == [3, 6]
    untelling = kinds_agreed(alone, decode, [prefill], doc["names"], data_dependent([decode, prefill]))
    assert not any("fmha" in doc["names"][n] or "CatArray" in doc["names"][n] for n in untelling)
    assert _kinds(count_layers(decode, doc["names"], untelling=untelling)) == [3, 6]


@pytest.mark.parametrize("fixture", ["qwen3_5_compiled_prefill_one_decode", "lfm2_moe_compiled_prefill_one_decode",
                                     "minimax_prefill_one_decode", "qwen3_moe_prefill_one_decode",
                                     "zamba_prefill_one_decode"])
def test_one_decode_is_read_beside_its_prefill(fixture):
    # Captures cut after their second forward keep one decode and the prefill (real H100 kernel sequences, with the
    # generator's truth). A torch.compile'd hybrid's prefill, fused otherwise, runs few of the names that counted the
    # decode's layers: that tells nothing against them, and the decode's count stands (read again without the names
    # whose counts differ between the phases, Qwen3.5 read 2 layers and LFM2-MoE 3; LFM2-MoE's names count a mixer
    # split's conv layers, once in each of those, as its prefill runs them). An eager MoE's do not stand: MiniMax's
    # decode alone reads its expert loop's index kernel as 30 layers, which its prefill never runs, and the prefill
    # reads 8 on its own, so the count is read again without them. Qwen3-MoE's count stands, its kinds told by the
    # prefill. Zamba's Mamba prefill reads 18 alone; without the names whose counts differ it reads 9, as the decode
    # does with every name, whose reading (the better bounds: its shared block's kernels in every third layer) stands.
    from decodegap.steps.across_forwards import layers_beside_other_phases

    doc, (decode, prefill) = _kernel_sequences(fixture)
    found = layers_beside_other_phases(decode, [prefill], doc["names"])
    assert found.count == doc["truth"]["layers"]
    assert _kinds(found) == sorted(doc["truth"]["layer_kinds"])


def test_one_forward_that_reads_no_layers_alone_is_read_without_the_names_that_vary():
    # Built here: four dense layers, each begun by 15 copy kernels that the glue before the layers also runs, once in
    # the decode and twice in the prefill, so neither forward reads layers alone (the copies run 5 and 6 times). Two
    # forwards that read none bear out no count: without the copies, whose counts differ, the decode reads 4.
    from decodegap.steps.across_forwards import layers_beside_other_phases

    copies = [f"copy_kernel_{i}" for i in range(15)]
    norm = ["pow", "mean", "rsqrt", "mul"]
    layer = copies + norm + ["gemm_nvjet_q", "attn_flash", "gemm_nvjet_o", "add"] + norm + [
        "gemm_nvjet_gate", "silu", "gemm_nvjet_down", "add"]
    names = sorted(set(layer) | {"embedding", "lm_head_gemm", "argmax"})
    n = {k: i for i, k in enumerate(names)}

    def forward(glue: int) -> np.ndarray:
        seq = ["embedding"] + copies * glue + layer * 4 + norm + ["lm_head_gemm", "argmax"]
        return np.array([n[k] for k in seq])

    decode, prefill = forward(1), forward(2)
    assert count_layers(decode, names).count is None and count_layers(prefill, names).count is None
    assert layers_beside_other_phases(decode, [prefill], names).count == 4


def test_layers_with_one_input_norm_each_are_counted_before_the_final_norm():
    # Four decode forwards of an eager Cohere2-MoE (kernel names of a real H100 trace, with the generator's truth and
    # the config's layer types): each layer runs one input norm for its attention and MLP in parallel, so the norm's
    # kernels run 9 times for 8 layers, the last at the final norm; no other name counts every layer (a dense first
    # layer, NoPE full-attention layers on another kernel than the sliding ones), and the full-attention kernel read 2
    # layers of 4. The blocks before the final norm are the layers, and though layers of three kinds share little,
    # they explain clearly more of the forward than the 2.
    doc, forwards = _kernel_sequences("cohere2_moe_decode")
    for found in _each_forwards_layers(doc, forwards):
        assert found.count == doc["truth"]["layers"] == 8
        assert _kinds(found) == doc["truth"]["layer_kinds"] == [1, 1, 6]
        groups = {}
        for layer, kind in enumerate(found.kind_of):
            groups.setdefault(kind, []).append(layer)
        assert sorted(groups.values()) == [[0], [1, 2, 3, 5, 6, 7], [4]]


def _halves_stack(dense: int, moe: int, full_every: int, seed: int) -> list[str]:
    # A decode forward whose projections all run on one GEMM tile and whose sliding and full attention run on two
    # kernels: no name runs once in every layer; the input norm's kernels run before each mixer and each MLP, and at
    # the final norm. Dense layers first, then MoE layers routing to 2-6 experts; full attention every `full_every`.
    rnd = random.Random(seed)
    gemm, norm = "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN", ["copy_fp32", "pow", "mean", "add_eps", "rsqrt", "mul",
                                                              "copy_bf16", "mul_weight"]
    out = ["embedding", "rotary_cos", "rotary_sin"]
    for i in range(dense + moe):
        full = (i + 1) % full_every == 0
        out += norm + [gemm] * 3 + ["rope_mul", "rope_cat", "rope_mul", ADD] * 2 + ["cache_cat"] * 2
        out += ["void pytorch_flash::flash_fwd_kernel" if full else "fmha_cutlassF_sliding", gemm, ADD] + norm
        if i < dense:
            out += [gemm, SILU, gemm, "mul_gate", gemm, ADD]
            continue
        out += [gemm, "softmax_router", "gatherTopK", "scatter_gather", "index_select"]
        for _ in range(rnd.randint(2, 6)):
            out += ["nonzero", "index_select", "nvjet_expert_TNT", SILU, "nvjet_expert_TNT", "mul_gate",
                    "nvjet_expert_TNT", "index_add"]
        out += [gemm, SILU, gemm, "mul_gate", gemm, ADD, ADD]
    return out + norm + ["nvjet_sm90_tst_256x8_lm_head_TNT", "argmax"]


@pytest.mark.parametrize("dense,moe,full_every,paired", [(1, 5, 6, True), (1, 7, 8, True), (3, 7, 3, True),
                                                         (2, 4, 6, True), (2, 6, 8, True), (0, 6, 6, False)])
def test_halves_of_layers_are_paired_into_layers_where_no_other_count_has_as_many(dense, moe, full_every, paired):
    # Built here (_halves_stack): the norm's names run 2L + 1 times, and no name runs once in every layer. Their
    # blocks are halves of layers, a mixer's and an MLP's, and the last holds the final norm: each layer is a mixer's
    # half and the MLP half after it (L layers, not 2L + 1; with the attention kernels' counts beside them, 3 dense
    # layers before MoE ones with full attention every 3rd read 3 layers). Kinds: dense, MoE sliding, MoE full.
    forwards = [_halves_stack(dense, moe, full_every, seed) for seed in (1, 2, 3)]
    names = sorted({k for f in forwards for k in f})
    index = {k: i for i, k in enumerate(names)}
    arrays = [np.array([index[k] for k in f]) for f in forwards]
    stable = data_independent(arrays)
    kinds: dict[tuple[bool, bool], list[int]] = {}
    for i in range(dense + moe):
        kinds.setdefault((i < dense, (i + 1) % full_every == 0), []).append(i)
    for seq in arrays:
        found = count_layers(seq, names, stable)
        assert found.count == dense + moe
        groups: dict[int, list[int]] = {}
        for layer, kind in enumerate(found.kind_of or (0,) * found.count):
            groups.setdefault(kind, []).append(layer)
        assert sorted(groups.values()) == sorted(kinds.values())
        # Where the MoE layers' router counts every layer (no dense one), the halves stand aside.
        assert (found.backer_runs == 2 * found.count + 1 and "before each of" in found.evidence) == paired


@pytest.mark.parametrize("forwards", [1, 2])
def test_a_last_moe_layer_longer_than_the_dense_ones_is_no_half_layer(tmp_path, forwards):
    """4 layers of one sequence (batch 1), attention kinds taking turns, 3 dense layers before an MoE one: the last
    MoE layer's experts run its activation past a dense layer's length. Its layer still runs an MLP activation, so the
    per-layer count is no layers' halves and no split of it into two kinds of mixer reads fewer layers: 4 layers
    (the generator's), as many kinds as it builds."""
    moe_from = 3
    kw = dict(forwards=forwards, layers=4, batch=1, alternate=True, moe_from=moe_from, annotation="sglang",
              graph="piecewise", phases=("decode", "prefill"), seed=26)
    d = report_dict(analyze_path(write(engine_forwards(**kw), tmp_path / "forwards.json")))
    assert d["layers"] == 4
    want = sorted(Counter((i >= moe_from, i % 2 == 1) for i in range(4)).values())
    assert sorted(k["count"] for k in d["layer_kinds"]) == want
