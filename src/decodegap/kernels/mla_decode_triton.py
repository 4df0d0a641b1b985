"""Fused Triton MLA decode over a paged FP8 (or BF16) latent cache: the pool is never cast.

Stage 1 (grid: head blocks x KV splits x batch): each program takes BLOCK_H heads of one sequence and one slice
of its KV, stages each [BLOCK_N, 576] tile (FP8 or BF16) in shared memory, widens FP8 to fp16 (one hardware cvt per two
elements on sm_90; bf16 would need e4m3 -> f16 -> f32 -> bf16) or keeps BF16 as is, and
runs both dots (scores = k . q over 576 dims, out += p . v over the first 512) with an online softmax. The per-tensor
kv_scale is folded into the score scale and the final output scale, which is exact: e4m3 -> fp16 is lossless.
Head blocks are the fastest-varying grid axis, so the programs that share a KV slice run side by side and
the second and later reads of a tile hit L2, not HBM.
Stage 2 (only when the KV is split): merge the per-split partial outputs by their log-sum-exp.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from decodegap.kernels.mla_decode import LATENT_DIM, ROPE_DIM

_LOG2E = 1.4426950408889634
# Triton's CPU interpreter multiplies bf16 dot operands as their raw uint16 bits (triton 3.6-3.8), so under
# the interpreter the dots take float32 operands; on a GPU they are bf16 (tensor cores, fp32 accumulation).
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _split_kernel(
    q_ptr, kv_ptr, table_ptr, lens_ptr,
    out_ptr, lse_ptr,  # final output / lse (used when not SPLIT)
    part_ptr, part_lse_ptr,  # [B, H, S, 512] fp32 / [B, H, S] fp32 (used when SPLIT)
    q_scale, s_scale, out_scale, num_heads, num_splits,
    stride_qb, stride_qh, stride_page, stride_slot, stride_tb,
    stride_ob, stride_oh, stride_pb, stride_ph,
    PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    DL: tl.constexpr, DR: tl.constexpr, SPLIT: tl.constexpr, RETURN_LSE: tl.constexpr,
    DOT_DTYPE: tl.constexpr, KT: tl.constexpr, REUSE_V: tl.constexpr,
    BLOCK_DV: tl.constexpr, V_WIDE: tl.constexpr,
):
    # Axis 0 = (head block, output slice) with the slice fastest: the DL // BLOCK_DV programs that share one
    # head block and KV slice (each computes the same scores, then its own columns of p . v) run side by side,
    # so the siblings' K/V reads hit L2.
    pid_v = tl.program_id(0) % (DL // BLOCK_DV)
    pid_h = tl.program_id(0) // (DL // BLOCK_DV)
    pid_s = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)

    seq_len = tl.load(lens_ptr + pid_b)
    # Each sequence splits its own length, so short and long sequences in one batch stay balanced.
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = pid_s * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    offs_l = tl.arange(0, DL)
    offs_r = tl.arange(0, DR)
    offs_v = pid_v * BLOCK_DV + tl.arange(0, BLOCK_DV)  # this program's output (V) columns
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    table_row = table_ptr + pid_b * stride_tb
    # q is pre-multiplied by q_scale (a power of two: exact, and it keeps an fp16 q in range) before the cast
    # to the dot dtype; s_scale (= sm_scale * kv_scale * log2(e) / q_scale) is applied to the fp32 scores.
    if KT:
        q_row = q_ptr + pid_b * stride_qb + offs_h[:, None] * stride_qh
        q_lat = (tl.load(q_row + offs_l[None, :], mask=mask_h[:, None], other=0.0).to(tl.float32)
                 * q_scale).to(DOT_DTYPE)
        q_rope = (tl.load(q_row + DL + offs_r[None, :], mask=mask_h[:, None], other=0.0).to(tl.float32)
                  * q_scale).to(DOT_DTYPE)
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            page = tl.load(table_row + offs_n // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
            row = kv_ptr + page * stride_page + (offs_n % PAGE_SIZE) * stride_slot
            if REUSE_V:
                # One [BLOCK_N, 576] read per tile: the latent part is both K (transposed into the score dot)
                # and V (the output dot). Masked rows are never read (another sequence's, or garbage).
                k_lat = tl.load(row[:, None] + offs_l[None, :], mask=mask_n[:, None], other=0.0).to(DOT_DTYPE)
                k_rope = tl.load(row[:, None] + DL + offs_r[None, :], mask=mask_n[:, None], other=0.0).to(DOT_DTYPE)
                s = tl.dot(q_lat, tl.trans(k_lat))
                s = tl.dot(q_rope, tl.trans(k_rope), s)  # [BLOCK_H, BLOCK_N]
            else:
                # K^T gathered directly as [576, BLOCK_N] tiles; V loaded again as [BLOCK_N, 512].
                kt_lat = tl.load(row[None, :] + offs_l[:, None], mask=mask_n[None, :], other=0.0).to(DOT_DTYPE)
                kt_rope = tl.load(row[None, :] + DL + offs_r[:, None], mask=mask_n[None, :], other=0.0).to(DOT_DTYPE)
                s = tl.dot(q_lat, kt_lat)
                s = tl.dot(q_rope, kt_rope, s)  # [BLOCK_H, BLOCK_N]
            s = tl.where(mask_n[None, :], s * s_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if REUSE_V:
                v = k_lat
            else:
                v = tl.load(row[:, None] + offs_v[None, :], mask=mask_n[:, None], other=0.0).to(DOT_DTYPE)
                if V_WIDE:
                    # The select keeps Triton from sinking the e4m3 -> f16 cvt below the shared-memory read of
                    # the dot operand (a select is not hoisted through): V is then staged as fp16 and read
                    # transposed with ldmatrix.trans instead of single-byte ld.shared.
                    v = tl.where(mask_n[:, None], v, 0.0)
            acc = tl.dot(p.to(DOT_DTYPE), v, acc * alpha[:, None])
            m_i = m_new
    else:
        # q is held transposed ([576, BLOCK_H]) so that the score dot takes the KV tile as its A operand
        # (s^T = k . q^T, M = BLOCK_N) and the output dot as its B operand (acc += p . v).
        q_col = q_ptr + pid_b * stride_qb + offs_h[None, :] * stride_qh
        q_lat = (tl.load(q_col + offs_l[:, None], mask=mask_h[None, :], other=0.0).to(tl.float32)
                 * q_scale).to(DOT_DTYPE)
        q_rope = (tl.load(q_col + DL + offs_r[:, None], mask=mask_h[None, :], other=0.0).to(tl.float32)
                  * q_scale).to(DOT_DTYPE)
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            page = tl.load(table_row + offs_n // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
            row = kv_ptr + page * stride_page + (offs_n % PAGE_SIZE) * stride_slot
            # Masked rows are never read (they may belong to another sequence or hold garbage).
            k_lat = tl.load(row[:, None] + offs_l[None, :], mask=mask_n[:, None], other=0.0).to(DOT_DTYPE)
            k_rope = tl.load(row[:, None] + DL + offs_r[None, :], mask=mask_n[:, None], other=0.0).to(DOT_DTYPE)
            s = tl.dot(k_lat, q_lat)
            s = tl.dot(k_rope, q_rope, s)  # [BLOCK_N, BLOCK_H]
            s = tl.where(mask_n[:, None], s * s_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[None, :])
            l_i = l_i * alpha + tl.sum(p, 0)
            if REUSE_V:
                v = k_lat
            else:
                v = tl.load(row[:, None] + offs_v[None, :], mask=mask_n[:, None], other=0.0,
                            eviction_policy="evict_first").to(DOT_DTYPE)  # distinct from k_lat: not merged by CSE
                if V_WIDE:
                    v = tl.where(mask_n[:, None], v, 0.0)  # as above: V staged as fp16
            acc = tl.dot(tl.trans(p.to(DOT_DTYPE)), v, acc * alpha[:, None])
            m_i = m_new

    # An empty slice (short sequence, many splits) leaves l_i = 0: output 0 with lse -inf, which the merge ignores.
    has = l_i > 0
    o = acc * (out_scale / tl.where(has, l_i, 1.0))[:, None]
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    # Every output slice saw the same scores, so m_i / l_i / lse agree across slices: slice 0 stores them.
    if SPLIT:
        p_off = pid_b * stride_pb + offs_h * stride_ph + pid_s
        tl.store(part_ptr + p_off[:, None] * DL + offs_v[None, :], o, mask=mask_h[:, None])
        tl.store(part_lse_ptr + p_off, lse2, mask=mask_h & (pid_v == 0))
    else:
        o_ptr = out_ptr + pid_b * stride_ob + offs_h[:, None] * stride_oh + offs_v[None, :]
        tl.store(o_ptr, o.to(tl.bfloat16), mask=mask_h[:, None])
        if RETURN_LSE:
            tl.store(lse_ptr + pid_b * num_heads + offs_h, lse2 * 0.6931471805599453, mask=mask_h & (pid_v == 0))


@triton.jit
def _merge_kernel(
    part_ptr, part_lse_ptr, out_ptr, lse_ptr, num_heads, num_splits,
    stride_ob, stride_oh,
    DL: tl.constexpr, RETURN_LSE: tl.constexpr,
):
    pid_h = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, DL)
    base = (pid_b * num_heads + pid_h) * num_splits
    m = float("-inf")
    l = 0.0
    acc = tl.zeros([DL], dtype=tl.float32)
    for s in range(num_splits):
        lse_s = tl.load(part_lse_ptr + base + s)
        m_new = tl.maximum(m, lse_s)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # all empty so far: keep weights at 0, not NaN
        alpha = tl.exp2(m - m_ref)
        w = tl.exp2(lse_s - m_ref)
        acc = acc * alpha + w * tl.load(part_ptr + (base + s) * DL + offs)
        l = l * alpha + w
        m = m_new
    has = l > 0
    o = acc / tl.where(has, l, 1.0)
    tl.store(out_ptr + pid_b * stride_ob + pid_h * stride_oh + offs, o.to(tl.bfloat16))
    if RETURN_LSE:
        lse = tl.where(has, m + tl.log2(tl.where(has, l, 1.0)), float("-inf"))
        tl.store(lse_ptr + pid_b * num_heads + pid_h, lse * 0.6931471805599453)


@dataclass(frozen=True)
class Config:
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    kt: bool = False  # score dot as q . K^T instead of K . q^T
    reuse_v: bool = False  # read each KV tile once: its latent part is both K and V (else V is loaded again)
    widen: str = "auto"  # FP8 caches: "auto" = fp16 dots (hardware e4m3 -> f16 cvt), "bf16" = bf16 dots
    block_dv: int = 512  # output columns per program: 256 splits p . v (and the accumulator) over 2 programs
    v_wide: bool = False  # widen V to the dot dtype before it is staged in shared memory (16-bit ldmatrix.trans)

    def __post_init__(self) -> None:
        if self.block_dv not in (128, 256, 512):
            raise ValueError(f"block_dv must be 128, 256 or 512; got {self.block_dv}")
        if self.reuse_v and self.block_dv != 512:
            raise ValueError("reuse_v needs block_dv = 512 (V is the whole latent part of the K tile)")


def default_config(num_heads: int, kv_dtype: torch.dtype) -> Config:
    """Tile shapes per head count and cache dtype: the fastest in the H200 sweep at B=32, ctx 4096
    (benchmarks/results/mla_decode_h200_2026-11-29.md). Reusing the K tile as V wins for BF16 caches (83 vs 94 µs)
    but not for FP8 (104 vs 92 µs): with two consumers the 8-bit tile is not staged by cp.async and spills.
    Neither `v_wide` (92.6 vs 91.9 µs) nor `block_dv=256` (110-151 µs) beat these in the third pass's A/B: the
    FP8 loop is bound by instructions per token, which those do not cut (block_dv doubles the score work)."""
    if kv_dtype == torch.float8_e4m3fn:
        return Config(16, 32, 4, 2, kt=True) if num_heads <= 16 else Config(64, 32, 8, 2)
    return Config(16, 32, 4, 2, kt=True, reuse_v=True) if num_heads <= 16 else Config(64, 32, 8, 2)


def dot_dtype(kv_dtype: torch.dtype, cfg: Config):
    """The tensor-core operand dtype: FP8 caches widen to fp16 (sm_90 converts e4m3x2 -> f16x2 in one
    instruction; e4m3 -> bf16 takes several), BF16 caches stay bf16. The CPU interpreter uses float32, because
    it multiplies bf16/fp16 dot operands as their raw bits (triton 3.6-3.8)."""
    if _INTERPRETED:
        return tl.float32
    if kv_dtype == torch.float8_e4m3fn and cfg.widen != "bf16":
        return tl.float16
    return tl.bfloat16


@functools.lru_cache(maxsize=8)
def _num_sms(device_index: int | None) -> int:
    if device_index is None:  # the CPU interpreter: pretend to be an H200 so splitting is exercised
        return 132
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def pick_num_splits(batch: int, head_blocks: int, max_len: int, num_heads: int, num_sms: int, block_n: int) -> int:
    """Enough (batch, head block, split) programs to cover the SMs ~3 times, but slices long enough that the
    fp32 partials (H x 512 x 4 bytes written and read per split) stay small next to the KV slice they replace.

    Uses only the table's span (max_pages * page_size), never the lengths' values: no device sync.
    """
    programs = batch * head_blocks
    want = triton.cdiv(3 * num_sms, programs)
    min_tokens = max(2 * block_n, min(1024, 8 * num_heads))
    most = max(1, max_len // min_tokens)
    return max(1, min(want, most, 256))


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
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The Triton path, without the public entry's checks (call `mla_decode` unless you have checked the
    arguments). Keyword-only knobs for tests and tuning: a fixed split count or tile config, a preallocated
    output, and NaN-poisoned partial buffers (to prove every partial is written before it is merged)."""
    batch, num_heads, _ = q.shape
    page_size = kv_cache.shape[1]
    if out is None:
        out = torch.empty((batch, num_heads, LATENT_DIM), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((batch, num_heads), dtype=torch.float32, device=q.device) if return_lse else out
    if batch == 0:
        return (out, lse) if return_lse else out
    q = q.contiguous()  # tiny; the kernel assumes unit stride in the last dim
    cfg = config or default_config(num_heads, kv_cache.dtype)
    head_blocks = triton.cdiv(num_heads, cfg.block_h)
    max_len = block_table.shape[1] * page_size
    if num_splits is None:
        num_sms = _num_sms(q.device.index if q.is_cuda else None)
        # Output slices are programs too: they fill the SMs as splits would, without the partials' traffic.
        num_splits = pick_num_splits(batch, head_blocks * (LATENT_DIM // cfg.block_dv), max_len, num_heads,
                                     num_sms, cfg.block_n)
    split = num_splits > 1
    dtype = dot_dtype(kv_cache.dtype, cfg)
    qk_scale = float(sm_scale) * float(kv_scale) * _LOG2E
    # fp16 dots: q * 2^e with 2^e ~ qk_scale is exact (a bf16 value has 8 significant bits, fp16 11) and keeps the
    # scaled q (|q| * qk_scale ~ a score's scale) far inside fp16's range; the rest of qk_scale multiplies the
    # fp32 scores. bf16 dots: q as is.
    q_scale = 2.0 ** round(math.log2(qk_scale)) if dtype == tl.float16 else 1.0
    if split:
        make = torch.full if poison_workspace else (lambda shape, _v, **kw: torch.empty(shape, **kw))
        part = make((batch, num_heads, num_splits, LATENT_DIM), math.nan, dtype=torch.float32, device=q.device)
        part_lse = make((batch, num_heads, num_splits), math.nan, dtype=torch.float32, device=q.device)
    else:
        part = part_lse = out  # unused
    _split_kernel[(head_blocks * (LATENT_DIM // cfg.block_dv), num_splits, batch)](
        q, kv_cache, block_table, seq_lens,
        out, lse, part, part_lse,
        q_scale, qk_scale / q_scale, float(kv_scale), num_heads, num_splits,
        q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0),
        out.stride(0), out.stride(1), num_heads * num_splits, num_splits,
        PAGE_SIZE=page_size, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, DL=LATENT_DIM, DR=ROPE_DIM,
        SPLIT=split, RETURN_LSE=return_lse, DOT_DTYPE=dtype, KT=cfg.kt, REUSE_V=cfg.reuse_v,
        BLOCK_DV=cfg.block_dv, V_WIDE=cfg.v_wide, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if split:
        _merge_kernel[(num_heads, batch)](
            part, part_lse, out, lse, num_heads, num_splits, out.stride(0), out.stride(1),
            DL=LATENT_DIM, RETURN_LSE=return_lse, num_warps=4,
        )
    return (out, lse) if return_lse else out
