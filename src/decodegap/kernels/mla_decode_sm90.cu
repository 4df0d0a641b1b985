// Split-KV stage 1 of the MLA decode over a paged FP8 (e4m3) latent cache, for 1..16 heads (the TP8 case), sm_89+.
// Built at first use by mla_decode_sm90.py (nvcc -arch=sm_XY, a plain shared library called through ctypes).
//
// One CTA = 4 warps = one (sequence, KV split) and all (<= 16) heads, mma.sync m16n8k16 in fp16 (on sm_90 an
// e4m3 mma.sync is emulated by ptxas as cvt to f16 + two HMMA.16816, so fp8 operands would gain nothing).
// Per tile of BN tokens:
//  - cp.async copies the raw 8-bit rows (found through the block table, any page size; the page ids are loaded
//    one iteration early) into shared memory; rows are padded to 592 bytes so that the fragment reads below are
//    conflict-free.
//  - Warp w owns latent dims [128w, 128w + 128) and rope dims [512 + 16w, +16). Each thread reads its 36 bytes
//    of a token row straight into B-fragment order (the contraction dim is permuted, the same way for q, so a
//    4-byte word is one k-pair for b0 and one for b1), widens them with one cvt per two elements and runs the
//    scores' mma (q, widened to fp16 once, stays in registers).
//  - The 4 warps' partial scores (each over its dims) are summed through shared memory; every warp runs the
//    same online softmax (the reference max moves only when a score exceeds it by 2^8: rare rescales) and
//    accumulates out[16 heads, its 128 latent dims] in fp32 registers.
//  - P.V takes V, whose fragments pair two tokens at one dim, from the same tile: two 16-byte reads of
//    consecutive rows, PRMT to pair their bytes, one cvt per pair (VPRMT); or (variant 1) from the score
//    fragments transposed by movmatrix, which holds them in 64 more registers.
//  - Pipelined (the default): one barrier per tile; iteration i computes tile i's partial scores and finishes
//    tile i - 1 (reduction, softmax, P.V), two independent streams for the scheduler.
// Output: per-split partials [B, H, S, 512] fp16 (sum(p v) / sum(p) in cache units, |x| <= 448; the merge
// multiplies by kv_scale) and their log2-sum-exp [B, H, S] fp32, the layout the Triton merge kernel reads.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "mla_decode_sm90_common.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kRowBytes = 592;  // 576 + 16: consecutive rows start 20 banks apart

struct Args {
  const uint16_t* q;  // bf16 [B, H, 576]
  const uint8_t* kv;  // e4m3 [pages, page_size, 576]
  const int* table;   // [B, max_pages]
  const int* lens;    // [B]
  __half* part;       // [B, H, S, 512]: sum(p v) / sum(p) in cache units
  float* part_lse;    // [B, H, S]
  long long stride_qb, stride_qh, stride_page, stride_slot, stride_tb;
  int num_heads, num_splits, page_size, page_shift;  // page_shift: log2(page_size), or -1
  float q_scale, s_scale;
};

__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
  return r;
}

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int NT, int STAGES, int MIN_CTAS, bool PIPE, bool VPRMT>
__global__ void __launch_bounds__(kThreads, MIN_CTAS) mla_decode_fp8_sm90(const Args a) {
  constexpr int BN = NT * 8;  // tokens per tile: NT score n-tiles of 8, NT/2 P.V k-blocks of 16
  constexpr int kTile = BN * kRowBytes;
  constexpr int kRowThreads = kThreads / BN;  // threads that copy one row
  constexpr int kChunks = 576 / 16;
  static_assert(NT % 2 == 0 && kThreads % BN == 0, "tile shape");
  static_assert(VPRMT || !PIPE, "the pipelined loop holds no V fragments: it needs VPRMT");
  extern __shared__ __align__(16) uint8_t smem[];
  float4* red = reinterpret_cast<float4*>(smem + STAGES * kTile);  // [warp][n-tile][lane] partial scores

  pdl_launch_dependents();  // the merge (if any) may launch now: it waits for this grid's end
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int split = blockIdx.x;
  const long long b = blockIdx.y;
  const int seq_len = a.lens[b];
  const int split_len = ((seq_len + a.num_splits - 1) / a.num_splits + BN - 1) / BN * BN;
  const int start = split * split_len;
  const int end = min(start + split_len, seq_len);
  const int ntiles = end > start ? (end - start + BN - 1) / BN : 0;

  // q as fp16 A-fragments, 8 latent k-steps + 1 rope step: a0/a2 row g, a1/a3 row g + 8.
  // Step s holds dims 128w + 32c + 4s + {0,1} (a0, a1) and + {2,3} (a2, a3); rope: 512 + 16w + 4c + ...
  uint32_t qf[9][4];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int h = g + 8 * half;
    const bool live = h < a.num_heads;
    const uint16_t* qrow = a.q + b * a.stride_qb + (long long)(live ? h : 0) * a.stride_qh;
#pragma unroll
    for (int s = 0; s < 9; ++s) {
      const int d = s < 8 ? 128 * w + 32 * c + 4 * s : 512 + 16 * w + 4 * c;
      const uint2 raw = live ? *reinterpret_cast<const uint2*>(qrow + d) : make_uint2(0u, 0u);
      qf[s][half] = bf16x2_to_f16x2(raw.x, a.q_scale);
      qf[s][2 + half] = bf16x2_to_f16x2(raw.y, a.q_scale);
    }
  }

  // Copies: thread tid copies row tid / kRowThreads of every tile. Its page id is loaded one iteration before
  // the copy is issued, so the block-table load's latency is not on the loop's critical path.
  const int* trow = a.table + b * a.stride_tb;
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int my_row = tid / kRowThreads, sub = tid % kRowThreads;
  auto page_of = [&](int t) -> int {  // -1: past the slice's end (zero-filled, never read from HBM)
    const int n = start + t * BN + my_row;
    if (t >= ntiles || n >= end) return -1;
    return trow[a.page_shift >= 0 ? n >> a.page_shift : n / a.page_size];
  };
  auto issue = [&](int t, int stage, int page) {
    const int n = start + t * BN + my_row;
    const uint8_t* src = a.kv;
    if (page >= 0) {
      const int slot = a.page_shift >= 0 ? n & (a.page_size - 1) : n % a.page_size;
      src = a.kv + (long long)page * a.stride_page + (long long)slot * a.stride_slot;
    }
    const uint32_t dst = smem_base + stage * kTile + my_row * kRowBytes;
#pragma unroll
    for (int m = 0; m < (kChunks + kRowThreads - 1) / kRowThreads; ++m) {
      const int ch = sub + kRowThreads * m;
      if (ch < kChunks) cp_async16(dst + 16 * ch, src + 16 * ch, page >= 0 ? 16 : 0);  // dead rows: zeros
    }
  };

  float acc[8][2][4];  // out[h][d], d = 128w + 32c + 4s + 2e + {0,1}: rows g (0,1) and g + 8 (2,3)
#pragma unroll
  for (int s = 0; s < 8; ++s)
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[s][e][i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  // Partial scores of one tile over this warp's dims -> red; with vf, also the P.V B-fragments (the widened
  // score fragments transposed by movmatrix).
  auto scores = [&](const uint8_t* tile, float4* red_buf, uint32_t (*vf)[8][2]) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const uint8_t* row = tile + (8 * j + g) * kRowBytes;
      const uint4 k0 = *reinterpret_cast<const uint4*>(row + 128 * w + 32 * c);
      const uint4 k1 = *reinterpret_cast<const uint4*>(row + 128 * w + 32 * c + 16);
      const uint32_t kr = *reinterpret_cast<const uint32_t*>(row + 512 + 16 * w + 4 * c);
      const uint32_t kw[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w};
      float s2[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};  // two independent mma chains
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        uint32_t b0, b1;
        e4m3x4_to_f16x2x2(kw[s], b0, b1);
        mma16816(s2[s & 1], qf[s], b0, b1);
        if (vf != nullptr) {
          vf[j][s][0] = transpose8x8(b0);
          vf[j][s][1] = transpose8x8(b1);
        }
      }
      uint32_t r0, r1;
      e4m3x4_to_f16x2x2(kr, r0, r1);
      mma16816(s2[1], qf[8], r0, r1);
      red_buf[(w * NT + j) * 32 + lane] = make_float4(s2[0][0] + s2[1][0], s2[0][1] + s2[1][1],
                                                      s2[0][2] + s2[1][2], s2[0][3] + s2[1][3]);
    }
  };
  // The tile's full scores (the 4 warps' partials summed), online softmax -> P (fp32, in sc).
  // Log2 domain, on raw dot products (s_scale > 0 is applied inside the exp). C-fragment: sc[j][f] = (row g,
  // token 8j + 2c + f), sc[j][2 + f] = row g + 8. The reference max m_run moves only when a score exceeds it by
  // more than 8 (so p <= 256, far inside fp16): the [16, 128] accumulators are rescaled a few times per slice
  // instead of every tile, which is exact since the sum l uses the same reference.
  auto softmax = [&](int t_idx, const float4* red_buf, float (&sc)[NT][4]) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      float4 t = red_buf[j * 32 + lane];
#pragma unroll
      for (int ww = 1; ww < 4; ++ww) {
        const float4 u = red_buf[(ww * NT + j) * 32 + lane];
        t.x += u.x; t.y += u.y; t.z += u.z; t.w += u.w;
      }
      sc[j][0] = t.x; sc[j][1] = t.y; sc[j][2] = t.z; sc[j][3] = t.w;
    }
    const int tok0 = start + t_idx * BN;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int f = 0; f < 2; ++f) {
        const bool live = tok0 + 8 * j + 2 * c + f < end;
        sc[j][f] = live ? sc[j][f] : -INFINITY;
        sc[j][2 + f] = live ? sc[j][2 + f] : -INFINITY;
        mx[0] = fmaxf(mx[0], sc[j][f]);
        mx[1] = fmaxf(mx[1], sc[j][2 + f]);
      }
    bool grow = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2)) * a.s_scale;
      grow |= mx[r] > m_run[r] + 8.f;  // also the first live score (m_run = -inf)
    }
    if (__any_sync(0xffffffffu, grow)) {
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_new = fmaxf(m_run[r], mx[r]);
        alpha[r] = m_new == -INFINITY ? 1.f : fast_exp2(m_run[r] - m_new);  // -inf - finite: 0
        m_run[r] = m_new;
        l_run[r] *= alpha[r];
      }
#pragma unroll
      for (int s = 0; s < 8; ++s)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          acc[s][e][0] *= alpha[0]; acc[s][e][1] *= alpha[0];
          acc[s][e][2] *= alpha[1]; acc[s][e][3] *= alpha[1];
        }
    }
    // No live score yet: weights stay 0 (exp2(-inf)), not NaN.
    const float neg_m0 = m_run[0] == -INFINITY ? 0.f : -m_run[0];
    const float neg_m1 = m_run[1] == -INFINITY ? 0.f : -m_run[1];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int f = 0; f < 2; ++f) {
        sc[j][f] = fast_exp2(fmaf(sc[j][f], a.s_scale, neg_m0));
        sc[j][2 + f] = fast_exp2(fmaf(sc[j][2 + f], a.s_scale, neg_m1));
        l_run[0] += sc[j][f];
        l_run[1] += sc[j][2 + f];
      }
  };
  // out += P . V: k-block t = tokens 16t .. 16t + 15 = n-tiles 2t (k 0-7) and 2t + 1 (k 8-15). VPRMT: V is
  // widened again from the tile in shared memory; else it comes from vf.
  auto pv = [&](const float (&sc)[NT][4], uint32_t (*vf)[8][2], const uint8_t* tile) {
    if constexpr (VPRMT) {
      // V's B-fragment pairs two tokens at one dim: thread (g, c) reads 16 bytes (dims 128w + 16g + i,
      // i = 0..15: n-tile i's column g) of rows 2c, 2c + 1 (b0) and 2c + 8, 2c + 9 (b1) of the k-block, pairs
      // the bytes of two rows with PRMT and widens each pair with one cvt: no movmatrix.
#pragma unroll
      for (int t = 0; t < NT / 2; ++t) {
        const uint32_t pa[4] = {pack_f16x2(sc[2 * t][0], sc[2 * t][1]), pack_f16x2(sc[2 * t][2], sc[2 * t][3]),
                                pack_f16x2(sc[2 * t + 1][0], sc[2 * t + 1][1]),
                                pack_f16x2(sc[2 * t + 1][2], sc[2 * t + 1][3])};
        uint32_t bv[2][16];  // [b0/b1][n-tile]
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const uint8_t* r0 = tile + (16 * t + 8 * k + 2 * c) * kRowBytes + 128 * w + 16 * g;
          const uint4 x = *reinterpret_cast<const uint4*>(r0);
          const uint4 y = *reinterpret_cast<const uint4*>(r0 + kRowBytes);
          const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
          for (int q4 = 0; q4 < 4; ++q4) {
            e4m3x4_to_f16x2x2(__byte_perm(xs[q4], ys[q4], 0x5140), bv[k][4 * q4], bv[k][4 * q4 + 1]);
            e4m3x4_to_f16x2x2(__byte_perm(xs[q4], ys[q4], 0x7362), bv[k][4 * q4 + 2], bv[k][4 * q4 + 3]);
          }
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) mma16816(acc[i >> 1][i & 1], pa, bv[0][i], bv[1][i]);
      }
    } else {
#pragma unroll
      for (int t = 0; t < NT / 2; ++t) {  // V from the movmatrix'ed score fragments (vf)
        const uint32_t pa[4] = {pack_f16x2(sc[2 * t][0], sc[2 * t][1]), pack_f16x2(sc[2 * t][2], sc[2 * t][3]),
                                pack_f16x2(sc[2 * t + 1][0], sc[2 * t + 1][1]),
                                pack_f16x2(sc[2 * t + 1][2], sc[2 * t + 1][3])};
#pragma unroll
        for (int s = 0; s < 8; ++s)
#pragma unroll
          for (int e = 0; e < 2; ++e) mma16816(acc[s][e], pa, vf[2 * t][s][e], vf[2 * t + 1][s][e]);
      }
    }
  };

  if constexpr (!PIPE) {
    // Per tile: scores -> barrier -> softmax -> P.V, V kept from the score fragments (NT x 16 registers).
    {
      int pages[STAGES - 1];
#pragma unroll
      for (int st = 0; st < STAGES - 1; ++st) pages[st] = page_of(st);  // all loads in flight together
#pragma unroll
      for (int st = 0; st < STAGES - 1; ++st) {
        if (st < ntiles) issue(st, st, pages[st]);
        cp_async_commit();
      }
    }
    int page_next = page_of(STAGES - 1);
    for (int it = 0; it < ntiles; ++it) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();  // tile `it` landed for every thread; every warp is done with iteration it - 1
      {
        const int next = it + STAGES - 1;
        if (next < ntiles) issue(next, next % STAGES, page_next);
        cp_async_commit();
        page_next = page_of(next + 1);
      }
      const uint8_t* tile = smem + (it % STAGES) * kTile;
      float sc[NT][4];
      if constexpr (VPRMT) {  // V widened again from the tile (still resident): no fragments held
        scores(tile, red, nullptr);
        __syncthreads();  // every warp's partial scores are in
        softmax(it, red, sc);
        pv(sc, nullptr, tile);
      } else {
        uint32_t vf[NT][8][2];
        scores(tile, red, vf);
        __syncthreads();
        softmax(it, red, sc);
        pv(sc, vf, tile);
      }
    }
  } else {
    // One barrier per tile: iteration it computes tile it's partial scores and finishes tile it - 1 (its
    // reduction, softmax and P.V, V widened again from shared memory), two independent streams of work for the
    // scheduler. Tiles it - 1 and it stay resident, so copies run STAGES - 2 tiles ahead.
    auto red_of = [&](int t) { return red + (t & 1) * (4 * NT * 32); };
    {
      int pages[STAGES - 2];
#pragma unroll
      for (int st = 0; st < STAGES - 2; ++st) pages[st] = page_of(st);
#pragma unroll
      for (int st = 0; st < STAGES - 2; ++st) {
        if (st < ntiles) issue(st, st, pages[st]);
        cp_async_commit();
      }
    }
    int page_next = page_of(STAGES - 2);
    auto begin = [&](int it) {
      cp_async_wait<STAGES - 3>();
      __syncthreads();  // tile it landed; tile it - 1's partial scores are in; tile it - 2 is free
      const int next = it + STAGES - 2;
      if (next < ntiles) issue(next, next % STAGES, page_next);
      cp_async_commit();
      page_next = page_of(next + 1);
    };
    if (ntiles > 0) {
      begin(0);
      scores(smem, red_of(0), nullptr);
    }
    for (int it = 1; it < ntiles; ++it) {
      begin(it);
      float sc[NT][4];
      softmax(it - 1, red_of(it - 1), sc);
      scores(smem + (it % STAGES) * kTile, red_of(it), nullptr);
      pv(sc, nullptr, smem + ((it - 1) % STAGES) * kTile);
    }
    if (ntiles > 0) {
      __syncthreads();
      float sc[NT][4];
      softmax(ntiles - 1, red_of(ntiles - 1), sc);
      pv(sc, nullptr, smem + ((ntiles - 1) % STAGES) * kTile);
    }
  }
  cp_async_wait<0>();

  const long long S = a.num_splits;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float l = l_run[half];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int h = g + 8 * half;
    if (h >= a.num_heads) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const long long slot = (b * a.num_heads + h) * S + split;
    uint4* dst = reinterpret_cast<uint4*>(a.part + slot * 512 + 128 * w + 32 * c);
    if constexpr (VPRMT) {  // n-tile i = 2s + e holds dims 128w + 32c + i (f = 0) and + 16 + i (f = 1)
#pragma unroll
      for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int q8 = 0; q8 < 2; ++q8) {
          uint32_t u[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int i = 8 * q8 + 2 * k;
            u[k] = pack_f16x2(acc[i >> 1][0][2 * half + f] * inv, acc[i >> 1][1][2 * half + f] * inv);
          }
          dst[2 * f + q8] = make_uint4(u[0], u[1], u[2], u[3]);
        }
    } else {
#pragma unroll
      for (int s = 0; s < 8; s += 2) {  // n-tile (s, e) holds dims 128w + 32c + 4s + 2e + {0, 1}
        uint4 v;
        v.x = pack_f16x2(acc[s][0][2 * half] * inv, acc[s][0][2 * half + 1] * inv);
        v.y = pack_f16x2(acc[s][1][2 * half] * inv, acc[s][1][2 * half + 1] * inv);
        v.z = pack_f16x2(acc[s + 1][0][2 * half] * inv, acc[s + 1][0][2 * half + 1] * inv);
        v.w = pack_f16x2(acc[s + 1][1][2 * half] * inv, acc[s + 1][1][2 * half + 1] * inv);
        dst[s / 2] = v;
      }
    }
    if (w == 0 && c == 0) a.part_lse[slot] = l > 0.f ? m_run[half] + log2f(l) : -INFINITY;
  }
}

template <int NT, int STAGES, bool PIPE>
constexpr int smem_bytes() {
  return STAGES * NT * 8 * kRowBytes + (PIPE ? 2 : 1) * 4 * NT * 32 * 16;
}

template <int NT, int STAGES, int MIN_CTAS, bool PIPE, bool VPRMT>
int prepare(int* regs, int* per_sm) {
  auto kernel = mla_decode_fp8_sm90<NT, STAGES, MIN_CTAS, PIPE, VPRMT>;
  constexpr int smem = smem_bytes<NT, STAGES, PIPE>();
  return prepare_kernel(kernel, kThreads, smem, regs, per_sm);
}

template <int NT, int STAGES, int MIN_CTAS, bool PIPE, bool VPRMT>
int launch(const Args& a, int batch, cudaStream_t stream) {
  constexpr int smem = smem_bytes<NT, STAGES, PIPE>();
  mla_decode_fp8_sm90<NT, STAGES, MIN_CTAS, PIPE, VPRMT><<<dim3(a.num_splits, batch), kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

// The kept variants (n-tiles of 8 tokens, stages, CTAs per SM, pipelined, V paired by PRMT); the notes in
// benchmarks/results/mla_decode_h200_2026-12-01.md have these and the ones measured and dropped.
//  0 (default): 32-token tiles, 3 stages, 3 CTAs per SM, pipelined, V by PRMT.
//  1: 32-token tiles, 4 stages, 2 CTAs per SM, V by movmatrix from the score fragments (241 registers).
//  2: as 0 without the pipelining (two barriers per tile, copies two tiles ahead).
#define DG_VARIANTS(X) X(0, 4, 3, 3, true, true) X(1, 4, 4, 2, false, false) X(2, 4, 3, 3, false, true)

// Returns a cudaError_t (cudaErrorInvalidValue for an unknown variant).
extern "C" int dg_mla_fp8_prepare(int variant, int* regs, int* per_sm, int* block_n) {
#define DG_PREPARE(V, NT, ST, CTAS, PIPE, PRMT) \
  if (variant == V) { *block_n = NT * 8; return prepare<NT, ST, CTAS, PIPE, PRMT>(regs, per_sm); }
  DG_VARIANTS(DG_PREPARE)
  return cudaErrorInvalidValue;
}

extern "C" int dg_mla_fp8_launch(int variant, const void* q, const void* kv, const void* table, const void* lens,
                                 void* part, void* part_lse, long long stride_qb, long long stride_qh,
                                 long long stride_page, long long stride_slot, long long stride_tb, int num_heads,
                                 int num_splits, int batch, int page_size, float q_scale, float s_scale,
                                 void* stream) {
  Args a{static_cast<const uint16_t*>(q), static_cast<const uint8_t*>(kv), static_cast<const int*>(table),
         static_cast<const int*>(lens), static_cast<__half*>(part), static_cast<float*>(part_lse),
         stride_qb, stride_qh, stride_page, stride_slot, stride_tb, num_heads, num_splits, page_size,
         (page_size & (page_size - 1)) == 0 ? __builtin_ctz(page_size) : -1, q_scale, s_scale};
  cudaStream_t st = static_cast<cudaStream_t>(stream);
#define DG_LAUNCH(V, NT, ST, CTAS, PIPE, PRMT) \
  if (variant == V) return launch<NT, ST, CTAS, PIPE, PRMT>(a, batch, st);
  DG_VARIANTS(DG_LAUNCH)
  return cudaErrorInvalidValue;
}
