"""Fused Triton MLA decode over a paged FP8 (or BF16) latent cache: the pool is never cast.

Stage 1 (grid: head blocks x KV splits x batch): each program takes BLOCK_H heads of one sequence and one slice of
its KV and runs an online softmax over [BLOCK_N, 576] tiles read straight from the pages. Two kernels:
- heads-major (H <= 16, the TP8 case): scores = q . K^T with the heads as the mma M dimension, and out += p . V
  with V the same tile (read from HBM once). The 512 latent dims run as 4 chunks of 128: four independent mma
  chains for the scores instead of one 36 long that stalls on mma latency, and four output accumulators.
  FP8 tiles are widened to fp16 (a hardware cvt per two elements on sm_90) before they are staged in shared
  memory, so both dots read an fp16 tile with ldmatrix, as they do a BF16 cache.
- tokens-major (H > 16): scores^T = K . q^T with the tokens as M; V is read again (an L2 hit).
The per-tensor kv_scale is folded into the score scale and the output scale, which is exact: e4m3 -> fp16 is
lossless. Head blocks are the fastest-varying grid axis, so the programs that share a KV slice run side by side
and the second and later reads of a tile hit L2, not HBM.
Stage 2 (only when the KV is split): merge the per-split partial outputs by their log-sum-exp.
On Hopper (sm_90) the CUDA kernels of mla_decode_sm90.py replace stage 1 where they apply (cuda_path): FP8 caches
with <= 16 heads (mma.sync) and 17+ heads on FP8 or BF16 caches (wgmma); this merge combines their partials too.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from decodegap.kernels.mla_layout import LATENT_DIM, ROPE_DIM

_LOG2E = 1.4426950408889634
# Triton's CPU interpreter multiplies bf16 dot operands as their raw uint16 bits (triton 3.6-3.8), so under
# the interpreter the dots take float32 operands; on a GPU they are bf16 (tensor cores, fp32 accumulation).
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _widen(x, DOT_DTYPE: tl.constexpr, ASM_WIDEN: tl.constexpr):
    """Cast a loaded KV tile to the dot dtype. ASM_WIDEN (FP8 -> fp16 on a GPU): four e4m3 bytes -> two f16x2
    registers in an opaque asm block. A plain cast is moved by the compiler below the shared-memory staging of
    the dot operand, which then reads single bytes and repacks them (twice the instructions per token)."""
    if ASM_WIDEN:
        return tl.inline_asm_elementwise(
            asm="{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; "
                "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            constraints="=r,=r,r", args=[x.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False, pack=4)
    else:
        return x.to(DOT_DTYPE)


@triton.jit
def _slice_bounds(lens_ptr, pid_b, pid_s, num_splits, BLOCK_N: tl.constexpr):
    """This program's token range. Each sequence splits its own length, so short and long sequences in one
    batch stay balanced; an empty range (short sequence, many splits) is fine."""
    seq_len = tl.load(lens_ptr + pid_b)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = pid_s * split_len
    return start, tl.minimum(start + split_len, seq_len)


@triton.jit
def _tile_rows(kv_ptr, table_row, n0, end, stride_page, stride_slot, PAGE_SIZE: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """Row pointers of tokens n0 .. n0 + BLOCK_N through the block table, and which of them are live."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_n = offs_n < end
    page = tl.load(table_row + offs_n // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
    return kv_ptr + page * stride_page + (offs_n % PAGE_SIZE) * stride_slot, mask_n


@triton.jit
def _kv_cols(row, mask_n, col: tl.constexpr, offs, DOT_DTYPE: tl.constexpr, ASM_WIDEN: tl.constexpr):
    """Columns col + offs of a tile's rows, in the dot dtype. Masked rows are never read (they may belong to
    another sequence or hold garbage)."""
    return _widen(tl.load(row[:, None] + col + offs[None, :], mask=mask_n[:, None], other=0.0), DOT_DTYPE, ASM_WIDEN)


@triton.jit
def _q_cols(q_row, col: tl.constexpr, offs, mask_h, q_scale, DOT_DTYPE: tl.constexpr):
    """Columns of q times q_scale (a power of two: exact, and it keeps an fp16 q in range), in the dot dtype."""
    return (tl.load(q_row + col + offs[None, :], mask=mask_h[:, None], other=0.0).to(tl.float32)
            * q_scale).to(DOT_DTYPE)


@triton.jit
def _store_cols(rows, col: tl.constexpr, offs, acc, inv, mask_h):
    tl.store(rows + col + offs[None, :], (acc * inv[:, None]).to(rows.dtype.element_ty), mask=mask_h[:, None])


@triton.jit
def _store_chunks(rows, DC: tl.constexpr, offs_c, a0, a1, a2, a3, inv, mask_h):
    _store_cols(rows, 0 * DC, offs_c, a0, inv, mask_h)
    _store_cols(rows, 1 * DC, offs_c, a1, inv, mask_h)
    _store_cols(rows, 2 * DC, offs_c, a2, inv, mask_h)
    _store_cols(rows, 3 * DC, offs_c, a3, inv, mask_h)


@triton.jit
def _store_lse(part_lse_ptr, lse_ptr, pid_b, pid_s, offs_h, mask_h, m_i, l_i, num_heads, stride_pb, stride_ph,
               SPLIT: tl.constexpr, RETURN_LSE: tl.constexpr):
    """log2-sum-exp of the slice into the partials, or the natural-log lse of the whole sequence. An empty
    slice leaves l_i = 0: lse -inf, which the merge ignores."""
    has = l_i > 0
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    if SPLIT:
        tl.store(part_lse_ptr + pid_b * stride_pb + offs_h * stride_ph + pid_s, lse2, mask=mask_h)
    elif RETURN_LSE:
        tl.store(lse_ptr + pid_b * num_heads + offs_h, lse2 * 0.6931471805599453, mask=mask_h)  # ln 2


@triton.jit
def _mla_decode_heads_major(
    q_ptr, kv_ptr, table_ptr, lens_ptr,
    out_ptr, lse_ptr,  # final output / lse (used when not SPLIT)
    part_ptr, part_lse_ptr,  # [B, H, S, 512] fp32 / [B, H, S] fp32 (used when SPLIT)
    q_scale, s_scale, out_scale, num_heads, num_splits,
    stride_qb, stride_qh, stride_page, stride_slot, stride_tb,
    stride_ob, stride_oh, stride_pb, stride_ph,
    PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    DL: tl.constexpr, DR: tl.constexpr, SPLIT: tl.constexpr, RETURN_LSE: tl.constexpr,
    DOT_DTYPE: tl.constexpr, ASM_WIDEN: tl.constexpr,
):
    DC: tl.constexpr = DL // 4  # the latent dims in 4 chunks: 4 independent mma chains, 4 accumulators
    pid_h = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    start, end = _slice_bounds(lens_ptr, pid_b, pid_s, num_splits, BLOCK_N)
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    offs_c = tl.arange(0, DC)
    offs_r = tl.arange(0, DR)
    # s_scale (= sm_scale * kv_scale * log2(e) / q_scale) multiplies the fp32 scores.
    q_row = q_ptr + pid_b * stride_qb + offs_h[:, None] * stride_qh
    q0 = _q_cols(q_row, 0 * DC, offs_c, mask_h, q_scale, DOT_DTYPE)
    q1 = _q_cols(q_row, 1 * DC, offs_c, mask_h, q_scale, DOT_DTYPE)
    q2 = _q_cols(q_row, 2 * DC, offs_c, mask_h, q_scale, DOT_DTYPE)
    q3 = _q_cols(q_row, 3 * DC, offs_c, mask_h, q_scale, DOT_DTYPE)
    qr = _q_cols(q_row, DL, offs_r, mask_h, q_scale, DOT_DTYPE)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    a0 = tl.zeros([BLOCK_H, DC], dtype=tl.float32)
    a1 = tl.zeros([BLOCK_H, DC], dtype=tl.float32)
    a2 = tl.zeros([BLOCK_H, DC], dtype=tl.float32)
    a3 = tl.zeros([BLOCK_H, DC], dtype=tl.float32)
    table_row = table_ptr + pid_b * stride_tb
    for n0 in range(start, end, BLOCK_N):
        row, mask_n = _tile_rows(kv_ptr, table_row, n0, end, stride_page, stride_slot, PAGE_SIZE, BLOCK_N)
        k0 = _kv_cols(row, mask_n, 0 * DC, offs_c, DOT_DTYPE, ASM_WIDEN)
        k1 = _kv_cols(row, mask_n, 1 * DC, offs_c, DOT_DTYPE, ASM_WIDEN)
        k2 = _kv_cols(row, mask_n, 2 * DC, offs_c, DOT_DTYPE, ASM_WIDEN)
        k3 = _kv_cols(row, mask_n, 3 * DC, offs_c, DOT_DTYPE, ASM_WIDEN)
        kr = _kv_cols(row, mask_n, DL, offs_r, DOT_DTYPE, ASM_WIDEN)
        s = ((tl.dot(q0, tl.trans(k0)) + tl.dot(q1, tl.trans(k1)))
             + (tl.dot(q2, tl.trans(k2)) + tl.dot(q3, tl.trans(k3))))
        s = tl.where(mask_n[None, :], (s + tl.dot(qr, tl.trans(kr))) * s_scale, float("-inf"))  # [BLOCK_H, BLOCK_N]
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        p = p.to(DOT_DTYPE)
        a0 = tl.dot(p, k0, a0 * alpha[:, None])  # V is the latent part of the same tile
        a1 = tl.dot(p, k1, a1 * alpha[:, None])
        a2 = tl.dot(p, k2, a2 * alpha[:, None])
        a3 = tl.dot(p, k3, a3 * alpha[:, None])
        m_i = m_new

    inv = out_scale / tl.where(l_i > 0, l_i, 1.0)
    # (the partials are fp32 and the output bf16: two pointer types, so two calls)
    if SPLIT:
        _store_chunks(part_ptr + (pid_b * stride_pb + offs_h * stride_ph + pid_s)[:, None] * DL, DC, offs_c,
                      a0, a1, a2, a3, inv, mask_h)
    else:
        _store_chunks(out_ptr + pid_b * stride_ob + offs_h[:, None] * stride_oh, DC, offs_c, a0, a1, a2, a3, inv,
                      mask_h)
    _store_lse(part_lse_ptr, lse_ptr, pid_b, pid_s, offs_h, mask_h, m_i, l_i, num_heads, stride_pb, stride_ph,
               SPLIT, RETURN_LSE)


@triton.jit
def _mla_decode_tokens_major(
    q_ptr, kv_ptr, table_ptr, lens_ptr, out_ptr, lse_ptr, part_ptr, part_lse_ptr,
    q_scale, s_scale, out_scale, num_heads, num_splits,
    stride_qb, stride_qh, stride_page, stride_slot, stride_tb,
    stride_ob, stride_oh, stride_pb, stride_ph,
    PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    DL: tl.constexpr, DR: tl.constexpr, SPLIT: tl.constexpr, RETURN_LSE: tl.constexpr,
    DOT_DTYPE: tl.constexpr, ASM_WIDEN: tl.constexpr,
):
    """Arguments as _mla_decode_heads_major's. q is held transposed ([576, BLOCK_H]) so that the score dot takes the
    KV tile as its A operand (s^T = k . q^T, M = BLOCK_N) and the output dot as its B operand (acc += p . v)."""
    pid_h = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    start, end = _slice_bounds(lens_ptr, pid_b, pid_s, num_splits, BLOCK_N)
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    offs_l = tl.arange(0, DL)
    offs_r = tl.arange(0, DR)
    q_col = q_ptr + pid_b * stride_qb + offs_h[None, :] * stride_qh
    q_lat = (tl.load(q_col + offs_l[:, None], mask=mask_h[None, :], other=0.0).to(tl.float32) * q_scale).to(DOT_DTYPE)
    q_rope = (tl.load(q_col + DL + offs_r[:, None], mask=mask_h[None, :], other=0.0).to(tl.float32)
              * q_scale).to(DOT_DTYPE)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, DL], dtype=tl.float32)
    table_row = table_ptr + pid_b * stride_tb
    for n0 in range(start, end, BLOCK_N):
        row, mask_n = _tile_rows(kv_ptr, table_row, n0, end, stride_page, stride_slot, PAGE_SIZE, BLOCK_N)
        s = tl.dot(_kv_cols(row, mask_n, 0, offs_l, DOT_DTYPE, ASM_WIDEN), q_lat)
        s = tl.dot(_kv_cols(row, mask_n, DL, offs_r, DOT_DTYPE, ASM_WIDEN), q_rope, s)  # [BLOCK_N, BLOCK_H]
        s = tl.where(mask_n[:, None], s * s_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, 0)
        # V read again (an L2 hit): evict_first makes it distinct from the score's load, not merged by CSE
        v = _widen(tl.load(row[:, None] + offs_l[None, :], mask=mask_n[:, None], other=0.0,
                           eviction_policy="evict_first"), DOT_DTYPE, ASM_WIDEN)
        acc = tl.dot(tl.trans(p.to(DOT_DTYPE)), v, acc * alpha[:, None])
        m_i = m_new

    inv = out_scale / tl.where(l_i > 0, l_i, 1.0)
    if SPLIT:
        _store_cols(part_ptr + (pid_b * stride_pb + offs_h * stride_ph + pid_s)[:, None] * DL, 0, offs_l, acc, inv,
                    mask_h)
    else:
        _store_cols(out_ptr + pid_b * stride_ob + offs_h[:, None] * stride_oh, 0, offs_l, acc, inv, mask_h)
    _store_lse(part_lse_ptr, lse_ptr, pid_b, pid_s, offs_h, mask_h, m_i, l_i, num_heads, stride_pb, stride_ph,
               SPLIT, RETURN_LSE)


@triton.jit
def _mla_decode_merge(
    part_ptr, part_lse_ptr, out_ptr, lse_ptr, num_heads, num_splits, part_scale,
    stride_ob, stride_oh,
    DL: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, ONE_SHOT: tl.constexpr,
    RETURN_LSE: tl.constexpr, PDL: tl.constexpr = False,
):
    """One (head, sequence, BLOCK_D output columns) per program. ONE_SHOT (num_splits <= BLOCK_S): the split
    lse and the partial rows are loaded at once, one memory round trip; else BLOCK_S splits at a time, whose
    loads are independent (a loop over single splits waits one memory latency per split: most of a B=1 call).
    Partials are fp32 or fp16 (times part_scale). PDL: launched as the CUDA stage 1's programmatic dependent
    (sm_90), so it waits here until that grid has finished and its partials are visible."""
    if PDL:
        tl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=tl.int32, is_pure=False,
                                  pack=1)
    pid_h = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    pid_d = tl.program_id(2)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    base = (pid_b * num_heads + pid_h) * num_splits
    if ONE_SHOT:
        live = offs_s < num_splits
        lse_s = tl.load(part_lse_ptr + base + offs_s, mask=live, other=float("-inf"))
        rows = tl.load(part_ptr + (base + offs_s)[:, None] * DL + offs_d[None, :], mask=live[:, None], other=0.0)
        m_max = tl.max(lse_s, 0)
        m_ref = tl.where(m_max == float("-inf"), 0.0, m_max)  # all empty: keep weights at 0, not NaN
        w = tl.exp2(lse_s - m_ref)
        acc = tl.sum(w[:, None] * rows.to(tl.float32), 0)
        l_sum = tl.sum(w, 0)
    else:
        m = tl.full([BLOCK_S], float("-inf"), dtype=tl.float32)
        for s0 in range(0, num_splits, BLOCK_S):
            m = tl.maximum(m, tl.load(part_lse_ptr + base + s0 + offs_s, mask=s0 + offs_s < num_splits,
                                      other=float("-inf")))
        m_max = tl.max(m, 0)
        m_ref = tl.where(m_max == float("-inf"), 0.0, m_max)
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        l_s = tl.zeros([BLOCK_S], dtype=tl.float32)
        for s0 in range(0, num_splits, BLOCK_S):
            live = s0 + offs_s < num_splits
            w = tl.exp2(tl.load(part_lse_ptr + base + s0 + offs_s, mask=live, other=float("-inf")) - m_ref)
            rows = tl.load(part_ptr + (base + s0 + offs_s)[:, None] * DL + offs_d[None, :], mask=live[:, None],
                           other=0.0)
            acc += tl.sum(w[:, None] * rows.to(tl.float32), 0)
            l_s += w
        l_sum = tl.sum(l_s, 0)
    has = l_sum > 0
    o = acc * (part_scale / tl.where(has, l_sum, 1.0))
    tl.store(out_ptr + pid_b * stride_ob + pid_h * stride_oh + offs_d, o.to(tl.bfloat16))
    if RETURN_LSE:
        lse = tl.where(has, m_max + tl.log2(tl.where(has, l_sum, 1.0)), float("-inf"))
        tl.store(lse_ptr + pid_b * num_heads + pid_h, lse * 0.6931471805599453, mask=pid_d == 0)


@dataclass(frozen=True)
class Config:
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    heads_major: bool = True  # scores = q . K^T in 4 latent chunks (heads as M); False: K . q^T (tokens as M)
    maxnreg: int | None = None  # register cap per thread (ptxas): more programs per SM, maybe some spills

    def __post_init__(self) -> None:
        for name in ("block_h", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16 (a tensor-core tile side); got {value}")


def default_config(num_heads: int, kv_dtype: torch.dtype) -> Config:
    """Tile shapes per head count: the fastest in the H200 A/B (benchmarks/results/mla_decode_h200_2026-11-29.md).
    H <= 16: heads-major with 4 warps; FP8 capped at 168 registers so that 3 programs share an SM (B=32, ctx 4096:
    63.9 µs vs 69.2 µs uncapped with 2 per SM); BF16 fits 3 per SM uncapped (the cap only adds spills).
    H > 16: tokens-major, 64 heads per program (B=32, ctx 4096, H=128: 208 µs; heads-major 260-364 µs)."""
    if num_heads <= 16:
        return Config(16, 32, 4, 2, heads_major=True, maxnreg=168 if kv_dtype == torch.float8_e4m3fn else None)
    return Config(64, 32, 8, 2, heads_major=False)


def dot_dtype(kv_dtype: torch.dtype):
    """The tensor-core operand dtype: FP8 caches widen to fp16 (sm_90 converts e4m3x2 -> f16x2 in one
    instruction; e4m3 -> bf16 takes several), BF16 caches stay bf16. The CPU interpreter uses float32, because
    it multiplies bf16/fp16 dot operands as their raw bits (triton 3.6-3.8)."""
    if _INTERPRETED:
        return tl.float32
    return tl.float16 if kv_dtype == torch.float8_e4m3fn else tl.bfloat16


@functools.lru_cache(maxsize=8)
def _num_sms(device_index: int | None) -> int:
    if device_index is None:  # the CPU interpreter: pretend to be an H200 so splitting is exercised
        return 132
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# The fixed cost of one program, in KV tokens' worth of time: loading q and storing its [H, 512] partial.
_PROGRAM_OVERHEAD_TOKENS = 64


def pick_num_splits(batch: int, head_blocks: int, max_len: int, num_heads: int, num_sms: int, block_n: int,
                    programs_per_sm: int = 2, min_tiles: int = 2, partial_bytes: int = 4,
                    token_bytes: int = LATENT_DIM + ROPE_DIM, whole_tiles: bool = False) -> int:
    """The split count with the least modelled time: whole waves of programs times each program's slice, plus
    the partials that the merge writes and reads.

    A grid of P programs on S SMs that each hold `programs_per_sm` runs in ceil(P / slots) waves; a slice that
    leaves a wave part-empty wastes the idle slots (on the H200 at B=32, ctx 4096, H=16: 8 splits = 256 programs
    in one wave of 264 slots ran 68 µs, 13 splits = 1.6 waves 87 µs). Slices stay at least `min_tiles` tiles long.
    Uses only the table's span (max_pages * page_size), never the lengths' values: no device sync. The merge is
    counted in KV tokens' worth of bytes: `partial_bytes` per partial value (4 fp32, 2 fp16) against
    `token_bytes` per cached token (576 FP8, 1152 BF16). `whole_tiles`: a slice costs its length in whole
    `block_n` tiles, as the kernel rounds it (so split counts that only add empty slices lose).
    """
    slots = max(1, num_sms * programs_per_sm)
    most = max(1, min(256, max_len // (min_tiles * block_n)))
    # partials written then read: H x 512 x partial_bytes x 2 bytes per (sequence, split), in cached tokens
    partial_tokens = num_heads * LATENT_DIM * partial_bytes * 2 / token_bytes

    def cost(splits: int) -> float:
        programs = batch * head_blocks * splits
        waves = -(-programs // slots)
        merge = batch * partial_tokens * splits / slots if splits > 1 else 0.0
        # B=1 ctx 4096 at 32-token tiles: 34 splits = 32 of 128 tokens + 2 empty, 1 us slower than 32 (wgmma)
        slice_len = -(-max_len // (splits * block_n)) * block_n if whole_tiles else max_len / splits
        return waves * (slice_len + _PROGRAM_OVERHEAD_TOKENS) + merge

    return min(range(1, most + 1), key=lambda s: (cost(s), s))


_PROGRAMS_PER_SM: dict[tuple, int] = {}


def _programs_per_sm(kernel, device_index: int, num_warps: int) -> int:
    """How many programs of a compiled kernel fit on one SM at once: registers, shared memory or warps."""
    kernel._init_handles()
    props = torch.cuda.get_device_properties(device_index)
    regs_per_warp = -(-max(kernel.n_regs, 1) * 32 // 256) * 256  # allocated per warp in units of 256
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (regs_per_warp * num_warps)
    smem_sm = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    by_smem = smem_sm // (kernel.metadata.shared + 1024) if kernel.metadata.shared else 32
    by_warps = props.max_threads_per_multi_processor // (32 * num_warps)
    return max(1, min(by_regs, by_smem, by_warps, 32))


def _kernel_and_constants(cfg: Config, kv_dtype: torch.dtype, page_size: int, split: bool, return_lse: bool,
                          asm_widen: bool | None = None):
    """Stage 1's kernel for `cfg`, with its compile-time constants and launch options."""
    dtype = dot_dtype(kv_dtype)
    if asm_widen is None:
        # FP8 tiles widened before they are staged (heads-major: both dots read the fp16 tile); the interpreter
        # runs no inline asm, and in the tokens-major kernel the plain cast measured faster (208 vs 265 µs, H=128).
        asm_widen = cfg.heads_major and dtype == tl.float16
    consts = dict(PAGE_SIZE=page_size, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, DL=LATENT_DIM, DR=ROPE_DIM,
                  SPLIT=split, RETURN_LSE=return_lse, DOT_DTYPE=dtype, ASM_WIDEN=asm_widen)
    options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.maxnreg and not _INTERPRETED:
        options["maxnreg"] = cfg.maxnreg
    return (_mla_decode_heads_major if cfg.heads_major else _mla_decode_tokens_major), consts, options


def _score_scales(sm_scale: float, kv_scale: float, dtype) -> tuple[float, float]:
    """(q_scale, s_scale): the dots take q * q_scale and the fp32 scores are multiplied by s_scale (log2 units).
    fp16 dots: q * 2^e with 2^e ~ qk_scale is exact (a bf16 value has 8 significant bits, fp16 11) and keeps the
    scaled q (|q| * qk_scale ~ a score's scale) far inside fp16's range; the rest of qk_scale multiplies the
    fp32 scores. bf16 dots: q as is."""
    qk_scale = float(sm_scale) * float(kv_scale) * _LOG2E
    q_scale = 2.0 ** round(math.log2(qk_scale)) if dtype == tl.float16 else 1.0
    return q_scale, qk_scale / q_scale


def _launch(cfg: Config, q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
            out: torch.Tensor, lse: torch.Tensor, part: torch.Tensor, part_lse: torch.Tensor, sm_scale: float,
            kv_scale: float, splits: int, return_lse: bool, warmup: bool = False):
    """Run stage 1 (or only compile it, for `warmup`) on a grid of head blocks x splits x batch."""
    batch, num_heads, _ = q.shape
    kernel, consts, options = _kernel_and_constants(cfg, kv_cache.dtype, kv_cache.shape[1], splits > 1, return_lse)
    q_scale, s_scale = _score_scales(sm_scale, kv_scale, consts["DOT_DTYPE"])
    args = (q, kv_cache, block_table, seq_lens, out, lse, part, part_lse,
            q_scale, s_scale, float(kv_scale), num_heads, splits,
            q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0),
            out.stride(0), out.stride(1), num_heads * splits, splits)
    grid = (triton.cdiv(num_heads, cfg.block_h), splits, batch)
    if warmup:
        return kernel.warmup(*args, grid=grid, **consts, **options)
    return kernel[grid](*args, **consts, **options)


def compile_for_gpu(cfg: Config, kv_dtype: torch.dtype, *, split: bool = True, return_lse: bool = False,
                    asm_widen: bool | None = None, page_size: int = 64, arch: int = 90):
    """Compile stage 1 for an NVIDIA architecture without a GPU (triton's bundled ptxas), as a launch with aligned
    tensors would: for tests that catch what the interpreter cannot, and for benchmarks/inspect_sm90.py. Needs
    TRITON_INTERPRET unset when this module was imported."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource

    kernel, consts, options = _kernel_and_constants(cfg, kv_dtype, page_size, split, return_lse, asm_widen)
    pointers = dict(q_ptr="*bf16", kv_ptr="*fp8e4nv" if kv_dtype == torch.float8_e4m3fn else "*bf16",
                    table_ptr="*i32", lens_ptr="*i32", out_ptr="*bf16", lse_ptr="*fp32", part_ptr="*fp32",
                    part_lse_ptr="*fp32")
    floats = dict.fromkeys(("q_scale", "s_scale", "out_scale"), "fp32")
    sig = {name: pointers.get(name) or floats.get(name) or ("constexpr" if name in consts else "i32")
           for name in kernel.arg_names}
    aligned = [*pointers, "stride_qb", "stride_qh", "stride_page", "stride_slot", "stride_ob", "stride_oh",
               "stride_pb"]
    attrs = {(kernel.arg_names.index(n),): CUDABackend.parse_attr("D") for n in aligned}
    return triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", arch, 32), options=options)


def num_splits_for(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                   config: Config | None = None, return_lse: bool = False, backend: str = "auto",
                   cuda_variant: int | None = None, wgmma_variant: int | None = None) -> int:
    """The split count `mla_decode_triton` picks for these arguments: whole waves of programs, where a program's
    registers and shared memory (from its compiled kernel, once per config) say how many share an SM."""
    batch, num_heads, _ = q.shape
    path = cuda_path(q, kv_cache, config, backend)
    if path == "mma":
        return _cuda_splits(q, kv_cache, block_table, _cuda_variant(q, kv_cache, block_table, cuda_variant))
    if path == "wgmma":
        return _wgmma_splits(q, kv_cache, block_table, wgmma_variant)
    cfg = config or default_config(num_heads, kv_cache.dtype)
    per_sm = 2
    if q.is_cuda:
        key = (cfg, kv_cache.dtype, kv_cache.shape[1], return_lse, q.device.index)
        if key not in _PROGRAMS_PER_SM:
            tmp = torch.empty((batch, num_heads, LATENT_DIM), dtype=torch.float32, device=q.device)
            probe = _launch(cfg, q, kv_cache, block_table, block_table[:, 0], tmp.bfloat16(), tmp, tmp, tmp,
                            1.0, 1.0, 2, return_lse, warmup=True)
            _PROGRAMS_PER_SM[key] = _programs_per_sm(probe, q.device.index or 0, cfg.num_warps)
        per_sm = _PROGRAMS_PER_SM[key]
    return pick_num_splits(batch, triton.cdiv(num_heads, cfg.block_h), block_table.shape[1] * kv_cache.shape[1],
                           num_heads, _num_sms(q.device.index if q.is_cuda else None), cfg.block_n, per_sm)


def mla_decode_triton(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    kv_scale: float = 1.0,
    return_lse: bool = False,
    *,
    num_splits: int | None = None,
    config: Config | None = None,
    out: torch.Tensor | None = None,
    poison_workspace: bool = False,
    backend: str = "auto",
    cuda_variant: int | None = None,
    wgmma_variant: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The fused path, without the public entry's checks (call `mla_decode` unless you have checked the
    arguments). On Hopper (sm_90), unless a Triton `config` or backend="triton" is given: FP8 caches with <= 16
    heads run the mma.sync CUDA stage 1 and 17+ heads (FP8 or BF16) the wgmma kernel (mla_decode_sm90.py);
    everything else runs the Triton kernels. Keyword-only knobs for tests and tuning: a fixed split count or tile
    config, a preallocated output, NaN-poisoned partial buffers (to prove every partial is written before it is
    merged), the backend and the CUDA kernels' variants (cuda_variant: the <= 16-head kernel; wgmma_variant: the
    wgmma kernel, see mla_decode_sm90.WGMMA_VARIANTS)."""
    batch, num_heads, _ = q.shape
    if out is None:
        out = torch.empty((batch, num_heads, LATENT_DIM), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((batch, num_heads), dtype=torch.float32, device=q.device) if return_lse else out
    if batch == 0:
        return (out, lse) if return_lse else out
    q = q.contiguous()  # tiny; the kernel assumes unit stride in the last dim
    path = cuda_path(q, kv_cache, config, backend)
    if path == "mma":
        return _mla_decode_cuda(q, kv_cache, block_table, seq_lens, out, lse, sm_scale, kv_scale, return_lse,
                                num_splits, poison_workspace, _cuda_variant(q, kv_cache, block_table, cuda_variant))
    if path == "wgmma":
        return _mla_decode_wgmma(q, kv_cache, block_table, seq_lens, out, lse, sm_scale, kv_scale, return_lse,
                                 num_splits, poison_workspace, wgmma_variant)
    cfg = config or default_config(num_heads, kv_cache.dtype)
    if num_splits is None:
        num_splits = num_splits_for(q, kv_cache, block_table, cfg, return_lse)
    split = num_splits > 1
    if split:
        part, part_lse = _workspace(batch, num_heads, num_splits, q.device, poison_workspace)
    else:
        part = part_lse = out  # unused
    _launch(cfg, q, kv_cache, block_table, seq_lens, out, lse, part, part_lse, sm_scale, kv_scale, num_splits,
            return_lse)
    if split:
        _merge(part, part_lse, out, lse, return_lse)
    return (out, lse) if return_lse else out


# The merge after a CUDA stage 1 runs as its programmatic dependent launch (PDL, sm_90): the CUDA kernels signal
# griddepcontrol.launch_dependents as they start, so the merge's launch overlaps stage 1 instead of following it
# (the launch gap of a graph replay); the merge's griddepcontrol.wait keeps it after stage 1's writes.
# DECODEGAP_MLA_PDL=0 (or MERGE_PDL = False) launches it plainly.
MERGE_PDL = True


@functools.lru_cache(maxsize=None)
def _triton_has_pdl() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


@functools.lru_cache(maxsize=None)
def _pdl_device(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0) and _triton_has_pdl()


def merge_pdl(device: torch.device) -> bool:
    """Whether the merge after a CUDA stage 1 on `device` runs as its programmatic dependent launch."""
    if not MERGE_PDL or _INTERPRETED or device.type != "cuda" or os.environ.get("DECODEGAP_MLA_PDL", "") == "0":
        return False
    return _pdl_device(device.index if device.index is not None else torch.cuda.current_device())


def _merge(part: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, return_lse: bool,
           part_scale: float = 1.0, pdl: bool = False):
    batch, num_heads, num_splits, _ = part.shape
    # One warp per program, <= 2048 partial elements: the sum over splits stays within a warp (with 4 warps the
    # [16, 256] tile was summed through shared memory: 13 µs at B=32, 12 splits, L1 82% busy, DRAM 10%).
    block_s = min(256, triton.next_power_of_2(num_splits))
    block_d = max(16, min(LATENT_DIM, 2048 // block_s))
    _mla_decode_merge[(num_heads, batch, LATENT_DIM // block_d)](
        part, part_lse, out, lse, num_heads, num_splits, float(part_scale), out.stride(0), out.stride(1),
        DL=LATENT_DIM, BLOCK_S=block_s, BLOCK_D=block_d, ONE_SHOT=num_splits <= block_s,
        RETURN_LSE=return_lse, PDL=pdl, num_warps=1, **({"launch_pdl": True} if pdl else {}),
    )


def _workspace(batch: int, num_heads: int, num_splits: int, device, poison: bool,
               dtype: torch.dtype = torch.float32):
    make = torch.full if poison else (lambda shape, _v, **kw: torch.empty(shape, **kw))
    part = make((batch, num_heads, num_splits, LATENT_DIM), math.nan, dtype=dtype, device=device)
    part_lse = make((batch, num_heads, num_splits), math.nan, dtype=torch.float32, device=device)
    return part, part_lse


def _cuda_variant(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, variant: int | None) -> int:
    """The <= 16-head FP8 kernel variant to run: the given one, else the device's default for this problem size
    (mla_decode_sm90.default_variant; the table's span, never the lengths' values: no device sync)."""
    from decodegap.kernels import mla_decode_sm90 as sm90

    if variant is not None:
        return variant
    return sm90.default_variant(q.device.index if q.device.index is not None else torch.cuda.current_device(),
                                q.shape[0] * block_table.shape[1] * kv_cache.shape[1])


def _mla_decode_cuda(q, kv_cache, block_table, seq_lens, out, lse, sm_scale, kv_scale, return_lse, num_splits,
                     poison_workspace, variant):
    """The sm_90 CUDA stage 1 (FP8, <= 16 heads; mla_decode_sm90.py) and the Triton merge. It always writes
    partials, also for one split: the merge then computes the lse (one split's partials are 1/300 of its KV at
    16 heads and 4k tokens). The tokens-major kernel (variants 3, 4) combines up to TOK_CLUSTER_MAX_SPLITS splits
    itself, each sequence's splits one cluster merging through distributed shared memory (no partials, no merge
    kernel; where sm90.tok_cluster_combine says so); it can also combine up to TOK_INLINE_MAX_SPLITS splits (off by
    default): the last CTA of each sequence to finish (counted on per-call zeroed int32 counters) merges them."""
    from decodegap.kernels import mla_decode_sm90 as sm90

    batch, num_heads, _ = q.shape
    if num_splits is None:
        num_splits = _cuda_splits(q, kv_cache, block_table, variant)
    if variant in sm90.TOK_VARIANTS:
        device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
        if sm90.tok_cluster_combine(device_index, variant, num_splits, batch):
            sm90.launch_tok(q, kv_cache, block_table, seq_lens, None, None, out, lse if return_lse else None, None,
                            float(sm_scale) * float(kv_scale) * _LOG2E, float(kv_scale), num_splits, variant,
                            cluster=True)
            return (out, lse) if return_lse else out
    # fp16 partials of sum(p v) / sum(p) in cache units (|x| <= 448): half the traffic of fp32, within 2^-11;
    # the merge applies kv_scale.
    part, part_lse = _workspace(batch, num_heads, num_splits, q.device, poison_workspace, torch.float16)
    if variant in sm90.TOK_VARIANTS:
        info = sm90.kernel_info(device_index, variant)
        inline = num_splits <= min(sm90.TOK_INLINE_MAX_SPLITS, info.max_inline_splits)
        # per call: zeros from the stream-ordered allocator, so concurrent calls and graph replays never share them
        counters = torch.zeros(batch, dtype=torch.int32, device=q.device) if inline else None
        sm90.launch_tok(q, kv_cache, block_table, seq_lens, part, part_lse, out, lse if return_lse else None,
                        counters, float(sm_scale) * float(kv_scale) * _LOG2E, float(kv_scale), num_splits, variant)
        if not inline:
            _merge(part, part_lse, out, lse, return_lse, part_scale=float(kv_scale), pdl=merge_pdl(q.device))
        return (out, lse) if return_lse else out
    q_scale, s_scale = _score_scales(sm_scale, kv_scale, tl.float16)
    sm90.launch_stage1(q, kv_cache, block_table, seq_lens, part, part_lse, q_scale, s_scale, num_splits, variant)
    _merge(part, part_lse, out, lse, return_lse, part_scale=float(kv_scale), pdl=merge_pdl(q.device))
    return (out, lse) if return_lse else out


def _cuda_splits(q, kv_cache, block_table, variant) -> int:
    from decodegap.kernels import mla_decode_sm90 as sm90

    info = sm90.kernel_info(q.device.index if q.device.index is not None else torch.cuda.current_device(),
                            variant)
    span, num_sms = block_table.shape[1] * kv_cache.shape[1], _num_sms(q.device.index)
    # The tokens-major kernel on a problem of at most one tile per two SMs: slices of one tile (each CTA's start
    # then overlaps the others' instead of following its own first tile).
    one_tile = variant in sm90.TOK_VARIANTS and q.shape[0] * -(-span // info.block_n) <= num_sms // 2
    return pick_num_splits(q.shape[0], 1, span, q.shape[1], num_sms, info.block_n, info.ctas_per_sm,
                           min_tiles=1 if one_tile else 2)


def cuda_path(q: torch.Tensor, kv_cache: torch.Tensor, config: Config | None = None,
              backend: str = "auto") -> str | None:
    """Which CUDA kernel mla_decode_triton runs for these arguments: "mma" (FP8, <= 16 heads), "wgmma" (17+ heads,
    FP8 or BF16), or None (the Triton kernels). Backend "cuda" insists on one of the two; "auto" takes one where it
    applies (an sm_90 GPU where it builds) and no explicit Triton config is given."""
    if backend not in ("auto", "triton", "cuda"):
        raise ValueError(f"backend must be auto, triton or cuda; got {backend!r}")
    if backend == "triton" or (backend == "auto" and (config is not None or _INTERPRETED or not q.is_cuda)):
        return None
    from decodegap.kernels import mla_decode_sm90 as sm90

    if sm90.applies(q, kv_cache):
        return "mma"
    if sm90.applies_wgmma(q, kv_cache):
        return "wgmma"
    if backend == "cuda":
        raise ValueError("backend='cuda' needs an sm_90 GPU where the kernels build, 16-byte aligned rows, and an "
                         "FP8 cache (<= 16 heads) or 17+ heads (FP8 or BF16)")
    return None


def uses_cuda_kernel(q: torch.Tensor, kv_cache: torch.Tensor, config: Config | None = None,
                     backend: str = "auto") -> bool:
    """Whether mla_decode_triton runs one of the CUDA kernels (cuda_path) for these arguments."""
    return cuda_path(q, kv_cache, config, backend) is not None


def _wgmma_variant(q, kv_cache, variant: int | None) -> int:
    """The wgmma variant to run: the given one, else the default for the cache and head count; one that cannot read
    this cache (41 on pages TMA cannot copy) runs as the default that can."""
    from decodegap.kernels import mla_decode_sm90 as sm90

    if variant is None:
        variant = sm90.default_wgmma_variant(kv_cache.dtype, q.shape[1])
    if not sm90.wgmma_variant_runs(variant, kv_cache):
        variant = sm90.default_wgmma_variant(kv_cache.dtype, q.shape[1], tma_pages=False)
    return variant


def _wgmma_splits(q, kv_cache, block_table, variant: int | None = None) -> int:
    from decodegap.kernels import mla_decode_sm90 as sm90

    device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    variant = _wgmma_variant(q, kv_cache, variant)
    info = sm90.wgmma_info(device_index, variant)
    # Its partials: fp16 for an FP8 cache, fp32 for BF16 (whose tokens are twice the bytes), and its slices whole
    # 32-token tiles. Counted as fp32 on 576-byte tokens, B=1 ctx 4096 H=128 took 24 splits where 32 ran 1.0
    # (BF16) and 1.4-2.0 us (FP8) faster (benchmarks/results/mla_decode_h200_2026-12-02-blocks64.md).
    return pick_num_splits(q.shape[0], triton.cdiv(q.shape[1], 64), block_table.shape[1] * kv_cache.shape[1],
                           q.shape[1], _num_sms(q.device.index), info.block_n, info.ctas_per_sm,
                           partial_bytes=_wgmma_partial_dtype(kv_cache).itemsize,
                           token_bytes=kv_cache.shape[-1] * kv_cache.element_size(), whole_tiles=True)


def _wgmma_partial_dtype(kv_cache: torch.Tensor) -> torch.dtype:
    """The wgmma kernel's partials: fp16 in cache units for an FP8 cache (|x| <= 448), fp32 for BF16."""
    return torch.float16 if kv_cache.dtype == torch.float8_e4m3fn else torch.float32


def _mla_decode_wgmma(q, kv_cache, block_table, seq_lens, out, lse, sm_scale, kv_scale, return_lse, num_splits,
                      poison_workspace, variant=None):
    """The wgmma kernel (17+ heads, mla_decode_sm90_wgmma.cu): one split writes the output (and lse) itself;
    more write partials (fp16 in cache units for an FP8 cache, |x| <= 448; fp32 for BF16) for the Triton merge."""
    from decodegap.kernels import mla_decode_sm90 as sm90

    batch, num_heads, _ = q.shape
    fp8 = kv_cache.dtype == torch.float8_e4m3fn
    variant = _wgmma_variant(q, kv_cache, variant)
    if num_splits is None:
        num_splits = _wgmma_splits(q, kv_cache, block_table, variant)
    q_scale, s_scale = _score_scales(sm_scale, kv_scale, tl.float16 if fp8 else tl.bfloat16)
    if num_splits == 1 and variant not in sm90.TOKW_VARIANTS:  # variant 41 always writes partials
        sm90.launch_wgmma(q, kv_cache, block_table, seq_lens, None, None, out, lse if return_lse else None,
                          q_scale, s_scale, float(kv_scale), 1, variant)
        return (out, lse) if return_lse else out
    part, part_lse = _workspace(batch, num_heads, num_splits, q.device, poison_workspace,
                                _wgmma_partial_dtype(kv_cache))
    sm90.launch_wgmma(q, kv_cache, block_table, seq_lens, part, part_lse, out, None, q_scale, s_scale,
                      float(kv_scale), num_splits, variant)
    _merge(part, part_lse, out, lse, return_lse, part_scale=float(kv_scale), pdl=merge_pdl(q.device))
    return (out, lse) if return_lse else out
