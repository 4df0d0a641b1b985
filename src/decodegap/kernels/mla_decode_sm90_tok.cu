// MLA decode for few heads (1..16, an engine's tensor-parallel rank) over a paged FP8 (e4m3) latent cache on Hopper:
// warpgroup MMA with the 64 tokens of a KV tile as the M dimension, so the few heads waste no tensor work. Built at
// first use by mla_decode_sm90.py (nvcc -gencode arch=compute_90a,code=sm_90a, a shared library called through
// ctypes).
//
// One CTA = one warpgroup (128 threads) = one (sequence, KV split), all heads; 2 CTAs per SM. Per 64-token tile:
//  - The raw 8-bit rows (through the block table) land in a stage laid out as wgmma reads it: latent dims as 4
//    chunks [64 tokens][128 B] with the 128-byte swizzle, the 64 rope dims as [64 tokens][64 B] with the 64-byte
//    swizzle. TMA (pages of 16, 32 or a multiple of 64 slots): warp 0 issues 5 tensor copies per page run (3D
//    tensor maps over [pages][slots][576 B]), completing on the stage's mbarrier; rows past the slice's end are
//    zeroed in shared memory after they land. Other page sizes: cp.async, 16 bytes a thread, dead rows
//    zero-filled. Two stages: tile t + 1 loads while t computes.
//  - Scores^T [64 tokens, 32] = K [64, 576] . Q2^T with FP8 wgmma straight from that stage (m64n32k32 e4m3, 18
//    k-steps): K is never widened. Q2 holds q as two e4m3 parts, rows 0-15 hi = e4m3(q * sigma) and rows 16-31
//    lo = e4m3((q * sigma - hi) * 16) (sigma a power of two per CTA): hi + lo / 16 keeps q's 8 significant bits
//    (bf16) for all but tiny elements, so a score is q . k to about bf16 precision with fp32 accumulation.
//  - Online softmax per head in the log2 domain with a lazy reference max (it moves only when a score exceeds it
//    by 8, so p <= 256): one CTA-wide vote per tile (__syncthreads_or), the exact max exchange only when it moves.
//    P^T [16 heads, 64 tokens] goes to shared memory as fp16 (the B operand of the next product).
//  - Out^T [512 dims, 16 heads] += V^T [512, 64] . P^T: 8 M-tiles x 4 k-steps of m64n16k16 f16 wgmma with V^T
//    from registers: each thread reads 16 bytes of 4 token rows (one 16-byte unit of its warp's 128-dim chunk),
//    pairs two tokens' bytes with PRMT and widens each pair with one cvt (e4m3 -> f16 is exact). Thread (warp w,
//    g, c) owns output dims 128 w + 16 g + (0..15) of heads 2c, 2c + 1, 8 + 2c, 9 + 2c.
// Output: per-split partials [B, H, S, 512] fp16 (sum(p v) / sum(p) in cache units, |x| <= 448) and their
// log2-sum-exp [B, H, S] fp32 (the layout the Triton merge kernel reads); with `counters`, the last CTA of each
// sequence to finish (an atomic count per sequence, reset by that CTA) combines the splits itself and writes the
// bf16 output (times out_scale) and the natural-log lse: no second launch.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "mla_decode_sm90_common.cuh"

// Benchmark-only probes of the many-head kernel (benchmarks/mla_wgmma_limits.py builds the file with
// -DDG_TOK_PROBE=N; the library mla_decode_sm90.py builds has 0): 1 = its producer publishes each stage unfilled
// (the consumers alone); 2 = the consumers release each stage unread (the producer alone); 3 = the consumers skip
// the softmax (P.V of a stale P); 4 = they skip P.V; 5 = they skip the score products (the softmax of zeros);
// 6 = the softmax without its proxy fence (P^T's stores not ordered before the P.V that reads them); 7 = without the
// warpgroup's vote on a moved reference max; 8 = without the consumers' barrier a tile (P.V of the other's P^T
// half as it stands).
#ifndef DG_TOK_PROBE
#define DG_TOK_PROBE 0
#endif

namespace {

constexpr int kTokProbe = DG_TOK_PROBE;

constexpr int kThreads = 128;
constexpr int kBN = 64;                            // tokens per KV tile (the wgmma M)
constexpr int kLatChunk = kBN * 128;               // one 128-dim chunk of a tile: 8,192
constexpr int kRope = 4 * kLatChunk;               // the rope part of a tile, [64][64 B]: at 32,768
constexpr int kStageBytes = kRope + kBN * 64;      // 36,864
constexpr int kQRows = 32;                         // q hi (heads 0-15) and lo (16-31)
constexpr int kQChunk = kQRows * 128;              // 4,096
constexpr int kQRope = 4 * kQChunk;                // 16,384
constexpr int kQBytes = kQRope + kQRows * 64;      // 18,432
constexpr int kPBytes = 16 * 128;                  // P^T [16 heads][64 tokens] fp16: 2,048
constexpr int kMaxInlineSplits = 32;               // the in-kernel combine's weight table
constexpr int kMaxClusterSplits = 8;               // the cluster combine: splits per cluster (the portable maximum)
constexpr int kCPad = 516;                         // its fp32 partial's row stride per head (bank spread)
static_assert(16 * kCPad * 4 <= kStageBytes, "the cluster combine's partial fits in stage 0");
static_assert(16 * (2 + kMaxClusterSplits) * 4 <= 16 * kMaxInlineSplits * 4, "its weights fit in kW");

struct Args {
  CUtensorMap tm_lat;   // [pages][page_size][576 B] u8, box [128 B][box_rows][1], 128-byte swizzle (TMA only)
  CUtensorMap tm_rope;  // the same tensor, box [64 B][box_rows][1], 64-byte swizzle
  const uint16_t* q;  // bf16 [B, H, 576]
  const uint8_t* kv;  // e4m3 [pages, page_size, 576]
  const int* table;   // [B, max_pages]
  const int* lens;    // [B]
  __half* part;       // [B, H, S, 512]
  float* part_lse;    // [B, H, S] log2 units
  uint16_t* out;      // bf16 [B, H, 512] (strides below): written by the combine
  float* lse;         // [B, H] natural log, or null
  int* counters;      // [B] zeros, or null (then no combine: the Triton merge runs after)
  long long stride_qb, stride_qh, stride_page, stride_slot, stride_tb, stride_ob, stride_oh;
  int num_heads, num_splits, page_size, page_shift;  // page_shift: log2(page_size), or -1
  int box_rows;  // TMA: rows per tensor copy (min(page_size, 64))
  int span;      // the table's span (max_pages x page_size): the length the first page ids are guessed for
  float qk_scale, out_scale;  // qk_scale = sm_scale * kv_scale * log2(e)
};

template <int STAGES>
struct Layout {
  static constexpr int kStage = 0;
  static constexpr int kQ = STAGES * kStageBytes;
  static constexpr int kP = kQ + kQBytes;
  static constexpr int kRed = kP + kPBytes;                 // [4 warps][16 heads] floats (max / sum exchange)
  static constexpr int kW = kRed + 4 * 16 * 4;              // the combine's weights [16][kMaxInlineSplits]
  static constexpr int kFlag = kW + 16 * kMaxInlineSplits * 4;
  static constexpr int kBar = kFlag + 16;                   // the stages' full mbarriers (TMA)
  static constexpr int kAlloc = kBar + 8 * STAGES + 1024;   // + slack to align the base to 1024
};

// wgmma shared-memory matrix descriptor (K-major; swizzle: 1 = 128 B, 2 = 64 B; addresses 18 bits, >> 4).
template <int SWIZZLE>
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (static_cast<uint64_t>(SWIZZLE) << 62);
}

// Distributed shared memory loads (mapa_u32 and cluster_sync are in the common header).
__device__ __forceinline__ float ld_dsmem_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float4 ld_dsmem_f32x4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// Two floats -> two e4m3 (x0 in the low byte), round to nearest, saturated to +-448.
__device__ __forceinline__ uint32_t f32x2_to_e4m3x2(float x0, float x1) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(x1), "f"(x0));
  return r;
}
__device__ __forceinline__ float2 e4m3x2_to_f32x2(uint32_t x) {
  uint32_t h;
  asm("{ .reg .b16 l; cvt.u16.u32 l, %1; cvt.rn.f16x2.e4m3x2 %0, l; }" : "=r"(h) : "r"(x));
  return __half22float2(*reinterpret_cast<__half2*>(&h));
}

// One 16-byte unit of q (8 bf16) times sigma as two e4m3 parts of 8 bytes each: hi = e4m3(x), lo = e4m3((x - hi)
// * 16).
__device__ __forceinline__ void q_hi_lo(uint4 v, float sigma, uint32_t (&hi)[2], uint32_t (&lo)[2]) {
  const uint32_t wds[4] = {v.x, v.y, v.z, v.w};
  hi[0] = hi[1] = lo[0] = lo[1] = 0u;
#pragma unroll
  for (int e2 = 0; e2 < 4; ++e2) {
    const float x0 = __uint_as_float(wds[e2] << 16) * sigma, x1 = __uint_as_float(wds[e2] & 0xffff0000u) * sigma;
    const uint32_t hb = f32x2_to_e4m3x2(x0, x1);
    const float2 hf = e4m3x2_to_f32x2(hb);
    const uint32_t lb = f32x2_to_e4m3x2((x0 - hf.x) * 16.f, (x1 - hf.y) * 16.f);
    hi[e2 >> 1] |= hb << (16 * (e2 & 1));
    lo[e2 >> 1] |= lb << (16 * (e2 & 1));
  }
}

// S^T (+)= K . Q2^T, one k-step of 32 e4m3: d[4j + f] = (token 16 warp + g + 8 (f >> 1), column 8j + 2c + (f & 1)).
__device__ __forceinline__ void wgmma_qk(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
      "%16, %17, p, 1, 1; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
}

// Out^T tile (+)= V^T (A from registers) . P^T (B, K-major in shared memory), m64n16k16 f16.
__device__ __forceinline__ void wgmma_pv(float (&d)[8], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, "
      "0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// A descriptor as (low word, high word): the 14-bit address field sits in the low word and never carries out of it
// (shared memory < 256 KB), so a k-step's offset is one 32-bit add of (bytes >> 4).
__device__ __forceinline__ uint64_t desc_at(uint2 d, uint32_t off_bytes) {
  return static_cast<uint64_t>(d.x + (off_bytes >> 4)) | (static_cast<uint64_t>(d.y) << 32);
}
template <int SWIZZLE>
__device__ __forceinline__ uint2 desc_words(uint32_t addr, uint32_t sbo) {
  const uint64_t d = make_desc<SWIZZLE>(addr, sbo);
  return make_uint2(static_cast<uint32_t>(d), static_cast<uint32_t>(d >> 32));
}

// The tile's scores: 18 k-steps (16 latent, 2 rope), one async group in one basic block.
__device__ __forceinline__ void score_tile(float (&sc)[16], uint2 dk, uint2 dkr, uint2 dq, uint2 dqr) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 16; ++ks)
    wgmma_qk(sc, desc_at(dk, (ks >> 2) * kLatChunk + (ks & 3) * 32), desc_at(dq, (ks >> 2) * kQChunk + (ks & 3) * 32),
             ks > 0);
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) wgmma_qk(sc, desc_at(dkr, 32 * ks), desc_at(dqr, 32 * ks), 1);
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(sc);
}

// Helpers of the two tile loops (NJ: this thread's column groups of heads, 2 for 16 heads, 4 for 32). A thread holds
// score sv[4j + f] = (token row 16 warp + g + 8 (f >> 1), head 8j + 2c + (f & 1)), j < NJ, and its heads' reference
// max m_ref[2j + e].

// The scores in log2 units from the hi columns j and the lo columns j + NJ of the accumulator (hi + lo / 16), -inf
// on rows past the slice's end; true where one outgrew its head's reference max by 8 (or is the first live score).
template <int NJ>
__device__ __forceinline__ bool tile_scores(const float (&sc)[8 * NJ], float (&sv)[4 * NJ],
                                            const float (&m_ref)[2 * NJ], float s_eff, bool live0, bool live1) {
  bool grow = false;
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int f = 0; f < 4; ++f) {
      const float x = fmaf(sc[4 * (j + NJ) + f], 0.0625f, sc[4 * j + f]) * s_eff;
      sv[4 * j + f] = (f >> 1 ? live1 : live0) ? x : -INFINITY;
      grow |= sv[4 * j + f] > m_ref[2 * j + (f & 1)] + 8.f;
    }
  return grow;
}

// p = exp2(sv - m_ref), and as fp16 into P^T [heads][64 tokens] (128-byte swizzle) at psm, made visible to wgmma.
template <int NJ>
__device__ __forceinline__ void store_p(float (&p)[4 * NJ], const float (&sv)[4 * NJ], const float (&m_ref)[2 * NJ],
                                        uint8_t* psm, int w, int g, int c) {
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int f = 0; f < 4; ++f) {
      const int hh = 2 * j + (f & 1);
      p[4 * j + f] = fast_exp2(sv[4 * j + f] - (m_ref[hh] == -INFINITY ? 0.f : m_ref[hh]));
      const int n = 8 * j + 2 * c + (f & 1), tt = 16 * w + g + 8 * (f >> 1);
      *reinterpret_cast<__half*>(psm + n * 128 + (((tt >> 3) ^ (n & 7)) << 4) + (tt & 7) * 2) =
          __float2half_rn(p[4 * j + f]);
    }
  if (kTokProbe != 6) fence_proxy_async();  // P's generic stores, read by wgmma
}

// This warp's max of each of the thread's heads over its 16 token rows (rows g and g + 8 of every lane g).
template <int NJ>
__device__ __forceinline__ void warp_head_max(const float (&sv)[4 * NJ], float (&mx)[2 * NJ]) {
#pragma unroll
  for (int hh = 0; hh < 2 * NJ; ++hh) {
    const int j = hh >> 1, e = hh & 1;
    mx[hh] = fmaxf(sv[4 * j + e], sv[4 * j + 2 + e]);
#pragma unroll
    for (int o2 = 4; o2 < 32; o2 <<= 1) mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], o2));
  }
}

// V^T's A fragments of one k-step from the W words (4 bytes of dims each) of token rows r, r + 1 (a0, a1) and r + 8,
// r + 9 (a2, a3): M-tile i holds dims byte 2i (rows g) and 2i + 1 (rows g + 8); PRMT pairs two tokens' bytes and one
// cvt widens each pair (e4m3 -> f16 is exact).
template <int W>
__device__ __forceinline__ void widen_vt(const uint32_t (&a0)[W], const uint32_t (&a1)[W], const uint32_t (&a2)[W],
                                         const uint32_t (&a3)[W], uint32_t (&va)[2 * W][4]) {
#pragma unroll
  for (int qq = 0; qq < W; ++qq) {
    e4m3x4_to_f16x2x2(__byte_perm(a0[qq], a1[qq], 0x5140), va[2 * qq][0], va[2 * qq][1]);
    e4m3x4_to_f16x2x2(__byte_perm(a0[qq], a1[qq], 0x7362), va[2 * qq + 1][0], va[2 * qq + 1][1]);
    e4m3x4_to_f16x2x2(__byte_perm(a2[qq], a3[qq], 0x5140), va[2 * qq][2], va[2 * qq][3]);
    e4m3x4_to_f16x2x2(__byte_perm(a2[qq], a3[qq], 0x7362), va[2 * qq + 1][2], va[2 * qq + 1][3]);
  }
}

template <int STAGES, bool TMA, bool CLUSTER>
__global__ void __launch_bounds__(kThreads, 2) mla_decode_tok_sm90(const __grid_constant__ Args a) {
  using L = Layout<STAGES>;
  static_assert(2 * L::kAlloc <= 232448, "two CTAs per SM");
  constexpr float kInf = INFINITY;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const uint32_t sbase = smem_u32(smem);

  pdl_launch_dependents();  // the merge (if any) may launch now: it waits for this grid's end
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int split = blockIdx.x;
  const long long b = blockIdx.y;
  const int H = a.num_heads, S = a.num_splits;
  const int seq_len = a.lens[b];
  const int split_len = ((seq_len + S - 1) / S + kBN - 1) / kBN * kBN;
  const int start = split * split_len;
  const int end = min(start + split_len, seq_len);
  const int ntiles = end > start ? (end - start + kBN - 1) / kBN : 0;
  // q's 1152 units of 8 dims (16 heads x 72), 9 per thread: loaded first, so that their latency overlaps the page
  // ids' and the first tiles' (they are converted below, after the copies are issued).
  uint4 qv[9];
#pragma unroll
  for (int k = 0; k < 9; ++k) {
    const int i = tid + kThreads * k, h = i / 72, u = i - 72 * h;
    qv[k] = h < H ? *reinterpret_cast<const uint4*>(a.q + b * a.stride_qb + (long long)h * a.stride_qh + 8 * u)
                  : make_uint4(0u, 0u, 0u, 0u);
  }

  // Copies: thread (row, sub) copies the 16-byte units u = sub + 2k (k = 0..17) of token row `row` of every tile.
  const int row = tid >> 1, sub = tid & 1;
  const int* trow = a.table + b * a.stride_tb;
  auto page_of = [&](int t) -> int {  // -1: past the slice's end (zero-filled, never read from HBM)
    const int n = start + t * kBN + row;
    if (t >= ntiles || n >= end) return -1;
    return trow[a.page_shift >= 0 ? n >> a.page_shift : n / a.page_size];
  };
  auto issue = [&](int t, int stage, int page) {
    const int n = start + t * kBN + row;
    const uint8_t* src = a.kv;
    if (page >= 0) {
      const int slot = a.page_shift >= 0 ? n & (a.page_size - 1) : n % a.page_size;
      src = a.kv + (long long)page * a.stride_page + (long long)slot * a.stride_slot;
    }
    const int bytes = page >= 0 ? 16 : 0;
    const uint32_t dst = sbase + L::kStage + stage * kStageBytes;
#pragma unroll
    for (int k = 0; k < 16; ++k) {  // latent: chunk k >> 2, unit (2k & 7) + sub, 128-byte swizzle
      const int unit = ((2 * k) & 7) + sub;
      cp_async16(dst + (k >> 2) * kLatChunk + row * 128 + ((unit ^ (row & 7)) << 4), src + 16 * (2 * k + sub), bytes);
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {  // rope: unit 2k + sub of the 64-byte row, 64-byte swizzle
      const int unit = 2 * k + sub;
      cp_async16(dst + kRope + row * 64 + ((unit ^ ((row >> 1) & 3)) << 4), src + 512 + 16 * unit, bytes);
    }
  };
  // TMA: warp 0 issues a tile's copies, lane r the page run r (box_rows rows: one page, or 64 rows of one); the
  // page ids of the next tile to issue are loaded one tile ahead.
  const uint32_t bar_full = sbase + L::kBar;
  auto run_page_in = [&](int t, int st0, int en, int nt) -> int {  // this lane's run of tile t: its page, or -1
    const int n = st0 + t * kBN + lane * a.box_rows;
    if (t >= nt || lane * a.box_rows >= kBN || n >= en) return -1;
    return trow[a.page_shift >= 0 ? n >> a.page_shift : n / a.page_size];
  };
  auto run_page = [&](int t) -> int { return run_page_in(t, start, end, ntiles); };
  auto issue_tma = [&](int t, int stage, int page) {  // warp 0
    const int tok0 = start + t * kBN;
    const int runs = (min(kBN, end - tok0) + a.box_rows - 1) / a.box_rows;
    const uint32_t bar = bar_full + 8 * stage;
    if (lane == 0) mbar_expect_tx(bar, runs * a.box_rows * 576);
    if (page >= 0) {
      const int n = tok0 + lane * a.box_rows;
      const int slot = a.page_shift >= 0 ? n & (a.page_size - 1) : n % a.page_size;
      const uint32_t dst = sbase + L::kStage + stage * kStageBytes;
#pragma unroll
      for (int cc = 0; cc < 4; ++cc)
        tma_load_3d(dst + cc * kLatChunk + lane * a.box_rows * 128, &a.tm_lat, 128 * cc, slot, page, bar);
      tma_load_3d(dst + kRope + lane * a.box_rows * 64, &a.tm_rope, 512, slot, page, bar);
    }
  };
  int page_next = -1;
  if constexpr (TMA) {
    if (w == 0) {
      if (lane == 0) {
#pragma unroll
        for (int st = 0; st < STAGES; ++st) mbar_init(bar_full + 8 * st, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
      }
      __syncwarp();
      // The first tiles' page ids for the slice this CTA would have were the sequence as long as the table's span,
      // loaded beside the length itself (not after it: one memory round trip less before the first copies); loaded
      // again for the real slice where that differs (a shorter sequence, or a padded table).
      const int len_g = a.span;
      const int split_len_g = ((len_g + S - 1) / S + kBN - 1) / kBN * kBN;
      const int start_g = split * split_len_g, end_g = min(start_g + split_len_g, len_g);
      const int ntiles_g = end_g > start_g ? (end_g - start_g + kBN - 1) / kBN : 0;
      int pages[STAGES];
#pragma unroll
      for (int st = 0; st < STAGES; ++st) pages[st] = run_page_in(st, start_g, end_g, ntiles_g);  // all in flight
      if (start_g != start || end_g != end) {
#pragma unroll
        for (int st = 0; st < STAGES; ++st) pages[st] = run_page(st);
      }
#pragma unroll
      for (int st = 0; st < STAGES; ++st)
        if (st < ntiles) issue_tma(st, st, pages[st]);
      page_next = run_page(STAGES);
    }
  } else {
    int pages[STAGES - 1];
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) pages[st] = page_of(st);
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
      if (st < ntiles) issue(st, st, pages[st]);
      cp_async_commit();
    }
    page_next = page_of(STAGES - 1);
  }

  // Q2 = [q hi; q lo] in e4m3, [32 rows][576] in the stage's layout; head rows past H are zeros. q (qv, loaded
  // above) is held in registers across the CTA-wide max.
  float* red = reinterpret_cast<float*>(smem + L::kRed);
  float sigma;
  {
    float mx = 0.f;
#pragma unroll
    for (int k = 0; k < 9; ++k) {
      const uint32_t wds[4] = {qv[k].x, qv[k].y, qv[k].z, qv[k].w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        mx = fmaxf(mx, fmaxf(fabsf(__uint_as_float(wds[e] << 16)), fabsf(__uint_as_float(wds[e] & 0xffff0000u))));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red[w] = mx;
    __syncthreads();
    mx = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
    // sigma = 2^(7 - floor(log2 mx)): |q| * sigma < 256 <= 448, the top of e4m3's range
    const int e = mx > 0.f ? ((__float_as_uint(mx) >> 23) & 0xff) - 127 : 0;
    sigma = __uint_as_float(static_cast<uint32_t>(127 + min(max(7 - e, -100), 100)) << 23);
#pragma unroll
    for (int k = 0; k < 9; ++k) {
      const int i = tid + kThreads * k, h = i / 72, u = i - 72 * h;
      uint32_t hi[2], lo[2];
      q_hi_lo(qv[k], sigma, hi, lo);
#pragma unroll
      for (int part = 0; part < 2; ++part) {
        const int r = h + 16 * part;
        uint32_t addr;
        if (u < 64) {
          const int unit = (u & 15) >> 1;
          addr = L::kQ + (u >> 4) * kQChunk + r * 128 + ((unit ^ (r & 7)) << 4) + (u & 1) * 8;
        } else {
          const int unit = (u - 64) >> 1;
          addr = L::kQ + kQRope + r * 64 + ((unit ^ ((r >> 1) & 3)) << 4) + (u & 1) * 8;
        }
        *reinterpret_cast<uint2*>(smem + addr) = part ? make_uint2(lo[0], lo[1]) : make_uint2(hi[0], hi[1]);
      }
    }
  }
  // scores in log2 units: (hi + lo / 16) * s_eff
  const float s_eff = a.qk_scale / sigma;
  fence_proxy_async();  // Q2's generic stores, read by wgmma
  __syncthreads();      // also: everyone read red before it is reused

  float o[8][8];  // Out^T M-tile i: o[i][4j + 2h + e] = (dim 128w + 16g + 2i + h, head 8j + 2c + e)
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int k = 0; k < 8; ++k) o[i][k] = 0.f;
  float m_ref[4] = {-kInf, -kInf, -kInf, -kInf}, l_run[4] = {0.f, 0.f, 0.f, 0.f};  // heads 8j + 2c + e: [2j + e]
  const uint32_t pbase = sbase + L::kP;
  const uint2 dq = desc_words<1>(sbase + L::kQ, 1024), dqr = desc_words<2>(sbase + L::kQ + kQRope, 512);
  const uint2 dp = desc_words<1>(pbase, 1024);
  uint8_t* psm = smem + L::kP;

  for (int t = 0; t < ntiles; ++t) {
    const int s = t % STAGES;
    const uint32_t stage = sbase + L::kStage + s * kStageBytes;
    if constexpr (TMA) {
      if (t > 0) {
        __syncthreads();  // everyone is done with tile t - 1: its stage is free
        const int next = t + STAGES - 1;
        if (w == 0) {
          if (next < ntiles) issue_tma(next, next % STAGES, page_next);
          page_next = run_page(next + 1);
        }
      }
      mbar_wait(bar_full + 8 * s, (t / STAGES) & 1);  // tile t has landed
      const int live = end - (start + t * kBN);
      if (live < kBN) {  // the slice's last tile: rows past its end hold other data (or nothing yet): zeros
        for (int i = tid; i < (kBN - live) * 36; i += kThreads) {
          const int r = live + i / 36, u = i % 36;
          const uint32_t addr = u < 32 ? stage + (u >> 3) * kLatChunk + r * 128 + (u & 7) * 16
                                       : stage + kRope + r * 64 + (u - 32) * 16;
          asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
        }
        fence_proxy_async();
        __syncthreads();
      }
    } else {
      cp_async_wait<STAGES - 2>();  // this thread's copies of tile t have landed
      fence_proxy_async();          // ... and are visible to wgmma
      __syncthreads();              // everyone's; everyone is done with tile t - 1 (its stage is free)
      const int next = t + STAGES - 1;
      if (next < ntiles) issue(next, next % STAGES, page_next);
      cp_async_commit();
      page_next = page_of(next + 1);
    }

    float sc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) sc[i] = 0.f;
    const uint2 dk = desc_words<1>(stage, 1024), dkr = desc_words<2>(stage + kRope, 512);
    score_tile(sc, dk, dkr, dq, dqr);

    // sv[4j + f]: token row 16w + g + 8 (f >> 1), head 8j + 2c + (f & 1)
    const int tok = start + t * kBN + 16 * w + g;
    const bool live0 = tok < end, live1 = tok + 8 < end;
    float sv[8], p[8];
    const bool grow = tile_scores<2>(sc, sv, m_ref, s_eff, live0, live1);
    store_p<2>(p, sv, m_ref, psm, w, g, c);  // with the reference max as it stands: kept unless a score outgrew it
    if (__syncthreads_or(grow)) {
      // Rare: the tile's exact max per head (the 4 warps' maxima through shared memory), rescale, P again.
      float mx[4];
      warp_head_max<2>(sv, mx);
      if (g == 0) {
#pragma unroll
        for (int hh = 0; hh < 4; ++hh) red[16 * w + 8 * (hh >> 1) + 2 * c + (hh & 1)] = mx[hh];
      }
      __syncthreads();
      float alpha[4];
#pragma unroll
      for (int hh = 0; hh < 4; ++hh) {
        const int n = 8 * (hh >> 1) + 2 * c + (hh & 1);
        const float tm = fmaxf(fmaxf(red[n], red[16 + n]), fmaxf(red[32 + n], red[48 + n]));
        const float m_new = fmaxf(m_ref[hh], tm);
        alpha[hh] = m_ref[hh] == -kInf ? 1.f : fast_exp2(m_ref[hh] - m_new);
        m_ref[hh] = m_new;
        l_run[hh] *= alpha[hh];
      }
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int k = 0; k < 8; ++k) o[i][k] *= alpha[2 * (k >> 2) + (k & 1)];
      store_p<2>(p, sv, m_ref, psm, w, g, c);
      __syncthreads();  // P rewritten; red read by everyone
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) l_run[2 * (k >> 2) + (k & 1)] += p[k];

    // Out^T += V^T . P^T. k-step kk = tokens 16kk .. 16kk + 15; this thread reads 16 bytes (unit g of chunk w: dims
    // 128w + 16g ..) of rows r = 16kk + 2c, +1 (A regs 0, 1) and + 8, + 9 (A regs 2, 3).
    const uint32_t vbase = stage + w * kLatChunk;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int r = 16 * kk + 2 * c;
      const uint4 x0 = lds128(vbase + r * 128 + ((g ^ (2 * c)) << 4));
      const uint4 x1 = lds128(vbase + (r + 1) * 128 + ((g ^ (2 * c + 1)) << 4));
      const uint4 x2 = lds128(vbase + (r + 8) * 128 + ((g ^ (2 * c)) << 4));
      const uint4 x3 = lds128(vbase + (r + 9) * 128 + ((g ^ (2 * c + 1)) << 4));
      const uint32_t a0[4] = {x0.x, x0.y, x0.z, x0.w}, a1[4] = {x1.x, x1.y, x1.z, x1.w};
      const uint32_t a2[4] = {x2.x, x2.y, x2.z, x2.w}, a3[4] = {x3.x, x3.y, x3.z, x3.w};
      uint32_t va[8][4];  // [M-tile i][A reg]
      widen_vt<4>(a0, a1, a2, a3, va);
      if (kk >= 2) wgmma_wait<1>();  // k-step kk - 2's products are done (bounds the A registers in flight)
      wgmma_fence();
#pragma unroll
      for (int i = 0; i < 8; ++i) wgmma_pv(o[i], va[i], desc_at(dp, 32 * kk));
      wgmma_commit();
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 8; ++i) fence_regs(o[i]);
  }
  if constexpr (!TMA) cp_async_wait<0>();

  // Epilogue: the sums over the tile's 64 rows (lanes g, then the 4 warps), identical in every thread.
  __syncthreads();  // red free
#pragma unroll
  for (int hh = 0; hh < 4; ++hh) {
#pragma unroll
    for (int o2 = 4; o2 < 32; o2 <<= 1) l_run[hh] += __shfl_xor_sync(0xffffffffu, l_run[hh], o2);
  }
  if (g == 0) {
#pragma unroll
    for (int hh = 0; hh < 4; ++hh) red[16 * w + 8 * (hh >> 1) + 2 * c + (hh & 1)] = l_run[hh];
  }
  __syncthreads();
  if constexpr (CLUSTER) {
    // The S CTAs of this sequence are one cluster (rank = split). Each puts its normalized partial (fp32) and its
    // log2-sum-exp in its own shared memory (the partial in stage 0: every copy has landed and every read of the
    // stages is done, __syncthreads above), then, after a cluster barrier, CTA r combines heads r, r + S, ...
    // from all S CTAs' shared memory (DSMEM loads): no partials in HBM, no second launch.
    float* cpart = reinterpret_cast<float*>(smem + L::kStage);  // [16 heads][kCPad]
    float* clse = reinterpret_cast<float*>(smem + L::kW);       // [16]
    float* cw = clse + 16;                                      // [16 heads][kMaxClusterSplits] weights
    float* cscale = cw + 16 * kMaxClusterSplits;                // [16] out_scale / sum of the weights
#pragma unroll
    for (int hh = 0; hh < 4; ++hh) {
      const int n = 8 * (hh >> 1) + 2 * c + (hh & 1);
      const float l = (red[n] + red[16 + n]) + (red[32 + n] + red[48 + n]);
      if (n >= H) continue;
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int j = hh >> 1, e = hh & 1;
      float4* dst = reinterpret_cast<float4*>(cpart + n * kCPad + 128 * w + 16 * g);  // dims 128w + 16g + 2i + h
#pragma unroll
      for (int q4 = 0; q4 < 4; ++q4)
        dst[q4] = make_float4(o[2 * q4][4 * j + e] * inv, o[2 * q4][4 * j + 2 + e] * inv,
                              o[2 * q4 + 1][4 * j + e] * inv, o[2 * q4 + 1][4 * j + 2 + e] * inv);
      if (w == 0 && g == 0) clse[n] = l > 0.f ? m_ref[hh] + log2f(l) : -kInf;
    }
    cluster_sync();  // every CTA's partial and lse written, visible to the cluster
    if (tid < H) {   // head tid's weights over the S splits: exp2(lse_s - max)
      const int n = tid;
      const uint32_t la = smem_u32(clse + n);
      float ls[kMaxClusterSplits];
      float m = -kInf;
#pragma unroll
      for (int s2 = 0; s2 < kMaxClusterSplits; ++s2) {
        ls[s2] = s2 < S ? ld_dsmem_f32(mapa_u32(la, s2)) : -kInf;
        m = fmaxf(m, ls[s2]);
      }
      const float mr = m == -kInf ? 0.f : m;
      float sum = 0.f;
#pragma unroll
      for (int s2 = 0; s2 < kMaxClusterSplits; ++s2) {
        const float wv = fast_exp2(ls[s2] - mr);  // exp2(-inf) = 0: empty splits weigh nothing
        cw[n * kMaxClusterSplits + s2] = wv;
        sum += wv;
      }
      cscale[n] = sum > 0.f ? a.out_scale / sum : 0.f;
      if (split == 0 && a.lse != nullptr) a.lse[b * H + n] = sum > 0.f ? (m + log2f(sum)) * 0.6931471805599453f : -kInf;
    }
    __syncthreads();
    for (int n = split; n < H; n += S) {  // thread tid: dims 4 tid .. 4 tid + 3 of head n
      const uint32_t pa = smem_u32(cpart + n * kCPad + 4 * tid);
      float4 v[kMaxClusterSplits];
#pragma unroll
      for (int s2 = 0; s2 < kMaxClusterSplits; ++s2)  // all S loads in flight together
        v[s2] = s2 < S ? ld_dsmem_f32x4(mapa_u32(pa, s2)) : make_float4(0.f, 0.f, 0.f, 0.f);
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int s2 = 0; s2 < kMaxClusterSplits; ++s2) {
        const float wv = s2 < S ? cw[n * kMaxClusterSplits + s2] : 0.f;
        acc.x = fmaf(wv, v[s2].x, acc.x);
        acc.y = fmaf(wv, v[s2].y, acc.y);
        acc.z = fmaf(wv, v[s2].z, acc.z);
        acc.w = fmaf(wv, v[s2].w, acc.w);
      }
      const float sc2 = cscale[n];
      *reinterpret_cast<uint2*>(a.out + b * a.stride_ob + (long long)n * a.stride_oh + 4 * tid) =
          make_uint2(pack_bf16x2(acc.x * sc2, acc.y * sc2), pack_bf16x2(acc.z * sc2, acc.w * sc2));
    }
    cluster_sync();  // no CTA leaves while another still reads its shared memory
  } else {
#pragma unroll
    for (int hh = 0; hh < 4; ++hh) {
      const int n = 8 * (hh >> 1) + 2 * c + (hh & 1);
      const float l = (red[n] + red[16 + n]) + (red[32 + n] + red[48 + n]);
      if (n >= H) continue;
      const long long slot = (b * H + n) * S + split;
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int j = hh >> 1, e = hh & 1;
      uint32_t u[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        u[i] = pack_f16x2(o[i][4 * j + e] * inv, o[i][4 * j + 2 + e] * inv);  // dims 2i, 2i + 1
      }
      uint4* dst = reinterpret_cast<uint4*>(a.part + slot * 512 + 128 * w + 16 * g);
      dst[0] = make_uint4(u[0], u[1], u[2], u[3]);
      dst[1] = make_uint4(u[4], u[5], u[6], u[7]);
      if (w == 0 && g == 0) a.part_lse[slot] = l > 0.f ? m_ref[hh] + log2f(l) : -kInf;
    }
    if (a.counters == nullptr) return;

    // In-kernel combine: the last of the sequence's S CTAs merges the partials (as the Triton merge does).
    int* flag = reinterpret_cast<int*>(smem + L::kFlag);
    __threadfence();  // this CTA's partials are visible device-wide before it counts itself in
    __syncthreads();
    if (tid == 0) *flag = atomicAdd(a.counters + b, 1) == S - 1;
    __syncthreads();
    if (!*flag) return;
    __threadfence();
    float* wts = reinterpret_cast<float*>(smem + L::kW);  // [16 heads][S]: exp2(lse_s - max)
    if (tid < 16) {
      const int n = tid;
      float m = -kInf, lsum = 0.f;
      if (n < H) {
        const float* pl = a.part_lse + (b * H + n) * S;
        for (int s2 = 0; s2 < S; ++s2) m = fmaxf(m, __ldcg(pl + s2));
        const float mr = m == -kInf ? 0.f : m;
        for (int s2 = 0; s2 < S; ++s2) {
          const float wv = fast_exp2(__ldcg(pl + s2) - mr);
          wts[n * kMaxInlineSplits + s2] = wv;
          lsum += wv;
        }
        red[n] = lsum > 0.f ? a.out_scale / lsum : 0.f;
        if (a.lse != nullptr) a.lse[b * H + n] = lsum > 0.f ? (m + log2f(lsum)) * 0.6931471805599453f : -kInf;
      }
    }
    __syncthreads();
    // Thread tid combines the 8-dim groups (head, dg) = item tid + 128k (k = 0..7 while < 64 H): all of its loads
    // of two splits in flight per round trip to L2.
    float acc[8][8];
#pragma unroll
    for (int k = 0; k < 8; ++k)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[k][e] = 0.f;
    for (int s0 = 0; s0 < S; s0 += 2) {
      uint4 v[8][2];
      float wv[8][2];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int item = tid + kThreads * k, n = item >> 6, dg = item & 63;
#pragma unroll
        for (int ds = 0; ds < 2; ++ds) {
          const bool ok = item < H * 64 && s0 + ds < S;
          v[k][ds] = ok ? __ldcg(reinterpret_cast<const uint4*>(a.part + ((b * H + n) * S + s0 + ds) * 512 + 8 * dg))
                        : make_uint4(0u, 0u, 0u, 0u);
          wv[k][ds] = ok ? wts[n * kMaxInlineSplits + s0 + ds] : 0.f;
        }
      }
#pragma unroll
      for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int ds = 0; ds < 2; ++ds) {
          const uint32_t vw[4] = {v[k][ds].x, v[k][ds].y, v[k][ds].z, v[k][ds].w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&vw[e]));
            acc[k][2 * e] = fmaf(wv[k][ds], f.x, acc[k][2 * e]);
            acc[k][2 * e + 1] = fmaf(wv[k][ds], f.y, acc[k][2 * e + 1]);
          }
        }
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int item = tid + kThreads * k, n = item >> 6, dg = item & 63;
      if (item >= H * 64) continue;
      const float sc2 = red[n];
      *reinterpret_cast<uint4*>(a.out + b * a.stride_ob + (long long)n * a.stride_oh + 8 * dg) =
          make_uint4(pack_bf16x2(acc[k][0] * sc2, acc[k][1] * sc2), pack_bf16x2(acc[k][2] * sc2, acc[k][3] * sc2),
                     pack_bf16x2(acc[k][4] * sc2, acc[k][5] * sc2), pack_bf16x2(acc[k][6] * sc2, acc[k][7] * sc2));
    }
  }
}

// ---- Many heads (17+, FP8): the tokens-major tile for 64 heads per CTA
// One CTA = (64-head block, KV split, sequence) = 3 warpgroups, the head blocks adjacent in the grid. Warp 0 of
// warpgroup 0 brings each 64-token tile into a ring of kWideStages stages by TMA (the stage layout above; page sizes
// 16, 32 or a multiple of 64 slots). Warpgroups 1 and 2, the consumers, take 32 heads each and run the tile above
// on every stage: scores^T [64 tokens, 64] = K . Q2^T (m64n64k32 e4m3, 18 k-steps; Q2's rows 0-31 its heads' hi
// parts, 32-63 their lo parts), the lazy softmax (its votes and exchanges within the warpgroup), and Out^T [512, 32
// heads] += V^T . P^T (8 M-tiles x 4 k-steps of m64n32k16 f16, V^T widened in registers; DIMSPLIT, below, splits
// it by dims instead); the two take turns to issue their score products. Nothing widens the cache into shared memory, so a stage is 36 KB of raw rows and both
// consumers read K from it: each tile's bytes serve 64 heads. A consumer warp hands the stage back (one arrival on
// its empty mbarrier, 8 per phase) as soon as its V rows are in registers.
// Rows past the slice's end (stale shared memory after a short page run) are masked in the scores and zeroed in
// the V^T registers. Writes fp16 partials and their log2-sum-exp for the Triton merge, also for one split.
constexpr int kWideThreads = 384;
constexpr int kWideStages = 3;
constexpr int kWideHeads = 32;                   // heads per consumer warpgroup
constexpr int kQ2Chunk = 2 * kWideHeads * 128;   // one 128-dim chunk of Q2 [64 rows][128 B]: 8,192
constexpr int kQ2Rope = 4 * kQ2Chunk;            // 32,768
constexpr int kQ2Bytes = kQ2Rope + 2 * kWideHeads * 64;  // 36,864
constexpr int kWidePBytes = kWideHeads * 128;    // P^T [32 heads][64 tokens] fp16: 4,096
constexpr int kWideProducerRegs = 40, kWideConsumerRegs = 232;  // 40 x 128 + 232 x 256 = 168 x 384
static_assert(kWideProducerRegs * 128 + kWideConsumerRegs * 256 <= 168 * kWideThreads, "setmaxnreg budget");

struct WideLayout {
  static constexpr int kStage = 0;
  static constexpr int kQ = kWideStages * kStageBytes;     // [consumer] Q2
  static constexpr int kP = kQ + 2 * kQ2Bytes;             // P^T [tile parity][consumer][32 heads][64 tokens]
  static constexpr int kRed = kP + 4 * kWidePBytes;        // [consumer][4 warps][32 heads] floats
  static constexpr int kX = kRed + 2 * 4 * kWideHeads * 4;  // DIMSPLIT's exchange: alpha [2][64], flags [2][2], l [64]
  static constexpr int kBar = kX + 1024;                   // full[stages], then empty[stages]
  static constexpr int kAlloc = kBar + 16 * kWideStages + 1024;
};
static_assert(WideLayout::kAlloc <= 232448, "one CTA per SM");

// S^T (+)= K . Q2^T, one k-step of 32 e4m3 over 64 columns: d[4j + f] = (token 16 warp + g + 8 (f >> 1), column
// 8j + 2c + (f & 1)).
__device__ __forceinline__ void wgmma_qk64(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
}

// Out^T tile += V^T (A from registers) . P^T (B, K-major in shared memory), m64n64k16 f16 (DIMSPLIT: all 64 heads).
__device__ __forceinline__ void wgmma_pv64(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}

// Out^T tile += V^T (A from registers) . P^T (B, K-major in shared memory), m64n32k16 f16.
__device__ __forceinline__ void wgmma_pv32(float (&d)[16], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
      "{%16,%17,%18,%19}, %20, p, 1, 1, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// The 18 k-steps as one async group; `hand_over` (a named barrier id, or 0): arrived at once they are issued.
__device__ __forceinline__ void score_tile64(float (&sc)[32], uint2 dk, uint2 dkr, uint2 dq, uint2 dqr,
                                             int hand_over) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 16; ++ks)
    wgmma_qk64(sc, desc_at(dk, (ks >> 2) * kLatChunk + (ks & 3) * 32),
               desc_at(dq, (ks >> 2) * kQ2Chunk + (ks & 3) * 32), ks > 0);
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) wgmma_qk64(sc, desc_at(dkr, 32 * ks), desc_at(dqr, 32 * ks), 1);
  wgmma_commit();
  if (hand_over) named_bar_arrive(hand_over, 256);
  wgmma_wait<0>();
  fence_regs(sc);
}

// DIMSPLIT (variant 42, the default; 41 without it): each consumer still computes the scores of its 32 heads, but
// P.V is split by output dims instead: consumer k accumulates dims 256k .. 256k + 255 of all 64 heads (4 M-tiles of
// m64n64k16), so it widens only its half of each tile's V rows. Both consumers' P^T (double-buffered by tile
// parity), the flags and factors of a moved reference max, and at the end the softmax sums go through shared
// memory, with one barrier of both consumers (named barrier 5) a tile.
template <bool DIMSPLIT>
__global__ void __launch_bounds__(kWideThreads, 1) mla_decode_tok_wide_sm90(const __grid_constant__ Args a) {
  using L = WideLayout;
  constexpr float kInf = INFINITY;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const uint32_t sbase = smem_u32(smem);

  pdl_launch_dependents();  // the merge may launch now: it waits for this grid's end
  const int tid = threadIdx.x, wg = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, c = lane & 3;
  // The head blocks of a (split, sequence) are neighbours in the grid, so they run together and the second one's
  // reads of the tile hit the L2.
  const int split = blockIdx.y;
  const long long b = blockIdx.z;
  const int H = a.num_heads, S = a.num_splits;
  const int seq_len = a.lens[b];
  const int split_len = ((seq_len + S - 1) / S + kBN - 1) / kBN * kBN;
  const int start = split * split_len;
  const int end = min(start + split_len, seq_len);
  const int ntiles = end > start ? (end - start + kBN - 1) / kBN : 0;
  const uint32_t bar_full = sbase + L::kBar, bar_empty = bar_full + 8 * kWideStages;
  if (tid == 0) {
#pragma unroll
    for (int st = 0; st < kWideStages; ++st) {
      mbar_init(bar_full + 8 * st, 1);
      mbar_init(bar_empty + 8 * st, 8);  // the consumers' 8 warps
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {  // the producer: warp 0 issues every tile's copies (lane r the page run r), the others leave
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kWideProducerRegs));
    if (w != 0) return;
    const int* trow = a.table + b * a.stride_tb;
    auto run_page = [&](int t) -> int {  // this lane's run of tile t: its page, or -1
      const int n = start + t * kBN + lane * a.box_rows;
      if (t >= ntiles || lane * a.box_rows >= kBN || n >= end) return -1;
      return trow[a.page_shift >= 0 ? n >> a.page_shift : n / a.page_size];
    };
    int page = run_page(0);
    for (int t = 0; t < ntiles; ++t) {
      const int s = t % kWideStages;
      const int page_next = run_page(t + 1);  // in flight while the stage is waited for
      mbar_wait(bar_empty + 8 * s, ((t / kWideStages) & 1) ^ 1);  // the first round's phase counts as done
      const int tok0 = start + t * kBN;
      const int runs = (min(kBN, end - tok0) + a.box_rows - 1) / a.box_rows;
      const uint32_t bar = bar_full + 8 * s;
      if constexpr (kTokProbe == 1) {
        if (lane == 0) mbar_arrive(bar);
        page = page_next;
        continue;
      }
      if (lane == 0) mbar_expect_tx(bar, runs * a.box_rows * 576);
      __syncwarp();
      if (page >= 0) {
        const int n = tok0 + lane * a.box_rows;
        const int slot = a.page_shift >= 0 ? n & (a.page_size - 1) : n % a.page_size;
        const uint32_t dst = sbase + L::kStage + s * kStageBytes;
#pragma unroll
        for (int cc = 0; cc < 4; ++cc)
          tma_load_3d(dst + cc * kLatChunk + lane * a.box_rows * 128, &a.tm_lat, 128 * cc, slot, page, bar);
        tma_load_3d(dst + kRope + lane * a.box_rows * 64, &a.tm_rope, 512, slot, page, bar);
      }
      page = page_next;
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kWideConsumerRegs));
  const int k = wg - 1, ctid = tid - 128 * wg, bar_id = 1 + k;  // named barrier 1 + k: this warpgroup's 128 threads
  const int h0 = 64 * blockIdx.x + kWideHeads * k;  // this warpgroup's first head
  float* red = reinterpret_cast<float*>(smem + L::kRed) + k * 4 * kWideHeads;  // [4 warps][32 heads]
  const uint32_t qbase = L::kQ + k * kQ2Bytes;
  // Q2 = [q hi; q lo] of the 32 heads in e4m3 (head rows past H zeros), as the kernel above builds it.
  float sigma;
  {
    uint4 qv[18];  // 32 heads x 72 units of 8 dims, 18 per thread
#pragma unroll
    for (int kq = 0; kq < 18; ++kq) {
      const int i = ctid + 128 * kq, h = i / 72, u = i - 72 * h;
      qv[kq] = h0 + h < H ? *reinterpret_cast<const uint4*>(a.q + b * a.stride_qb + (long long)(h0 + h) * a.stride_qh +
                                                             8 * u)
                          : make_uint4(0u, 0u, 0u, 0u);
    }
    float mx = 0.f;
#pragma unroll
    for (int kq = 0; kq < 18; ++kq) {
      const uint32_t wds[4] = {qv[kq].x, qv[kq].y, qv[kq].z, qv[kq].w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        mx = fmaxf(mx, fmaxf(fabsf(__uint_as_float(wds[e] << 16)), fabsf(__uint_as_float(wds[e] & 0xffff0000u))));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red[w] = mx;
    named_bar_sync(bar_id, 128);
    mx = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
    const int e = mx > 0.f ? ((__float_as_uint(mx) >> 23) & 0xff) - 127 : 0;
    sigma = __uint_as_float(static_cast<uint32_t>(127 + min(max(7 - e, -100), 100)) << 23);
#pragma unroll
    for (int kq = 0; kq < 18; ++kq) {
      const int i = ctid + 128 * kq, h = i / 72, u = i - 72 * h;
      uint32_t hi[2], lo[2];
      q_hi_lo(qv[kq], sigma, hi, lo);
#pragma unroll
      for (int part = 0; part < 2; ++part) {
        const int r = h + kWideHeads * part;
        uint32_t addr;
        if (u < 64) {
          const int unit = (u & 15) >> 1;
          addr = qbase + (u >> 4) * kQ2Chunk + r * 128 + ((unit ^ (r & 7)) << 4) + (u & 1) * 8;
        } else {
          const int unit = (u - 64) >> 1;
          addr = qbase + kQ2Rope + r * 64 + ((unit ^ ((r >> 1) & 3)) << 4) + (u & 1) * 8;
        }
        *reinterpret_cast<uint2*>(smem + addr) = part ? make_uint2(lo[0], lo[1]) : make_uint2(hi[0], hi[1]);
      }
    }
  }
  const float s_eff = a.qk_scale / sigma;
  fence_proxy_async();  // Q2's generic stores, read by wgmma
  named_bar_sync(bar_id, 128);  // also: everyone read red before it is reused

  constexpr int kMT = DIMSPLIT ? 4 : 8, kNC = DIMSPLIT ? 32 : 16;  // Out^T M-tiles, accumulators per M-tile
  // Out^T M-tile i: o[i][4j + 2h + e] = (dim 128w + 16g + 2i + h, head 8j + 2c + e of this warpgroup's 32);
  // DIMSPLIT: (dim 256k + 64w + 8g + 2i + h, head 8j + 2c + e of the block's 64)
  float o[kMT][kNC];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int q = 0; q < kNC; ++q) o[i][q] = 0.f;
  float* xalpha = reinterpret_cast<float*>(smem + L::kX);  // DIMSPLIT: [parity][64 heads]
  int* xflag = reinterpret_cast<int*>(xalpha + 2 * 64);     // [parity][consumer]
  float* xl = reinterpret_cast<float*>(xflag + 2 * 2);      // [64 heads]
  float m_ref[8], l_run[8];  // heads 8j + 2c + e: [2j + e]
#pragma unroll
  for (int hh = 0; hh < 8; ++hh) m_ref[hh] = -kInf, l_run[hh] = 0.f;
  const uint2 dq = desc_words<1>(sbase + qbase, 1024), dqr = desc_words<2>(sbase + qbase + kQ2Rope, 512);
  // The P.V of tile u (its P^T halves, flags and factors written by both consumers, its V still in its stage):
  // O rescaled where a reference max moved at u, then Out^T += V^T . P^T; hands the stage back.
  auto pv_tile = [&](int u) {
    const int su = u % kWideStages, paru = DIMSPLIT ? u & 1 : 0;
    const uint32_t stage_u = sbase + L::kStage + su * kStageBytes;
    const uint2 dp = desc_words<1>(sbase + L::kP + paru * 2 * kWidePBytes + (DIMSPLIT ? 0 : k * kWidePBytes), 1024);
    const int live = end - (start + u * kBN);  // rows at or past `live` lie past the slice's end
    if constexpr (DIMSPLIT) {
      const bool f0 = xflag[2 * paru], f1 = xflag[2 * paru + 1];
      if (f0 || f1) {  // rare: a reference max moved; this thread's heads 8j + 2c + e belong to consumer j >> 2
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float al = (j < 4 ? f0 : f1) ? xalpha[64 * paru + 8 * j + 2 * c + e] : 1.f;
#pragma unroll
            for (int i = 0; i < kMT; ++i) o[i][4 * j + e] *= al, o[i][4 * j + 2 + e] *= al;
          }
      }
    }

    if constexpr (kTokProbe == 4) {
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_empty + 8 * su);
      return;
    }
    // Out^T += V^T . P^T, as in the kernel above: k-step kk = tokens 16kk .. 16kk + 15; this thread reads 16 bytes
    // (unit g of chunk w: dims 128w + 16g ..; DIMSPLIT: 8 bytes, dims 256k + 64w + 8g ..) of rows r = 16kk + 2c,
    // +1 (A regs 0, 1) and + 8, + 9 (A regs 2, 3); rows past the slice's end read as zeros.
    const uint32_t vbase = stage_u + (DIMSPLIT ? 2 * k + (w >> 1) : w) * kLatChunk;
    const int vunit = DIMSPLIT ? 4 * (w & 1) + (g >> 1) : g, vbyte = DIMSPLIT ? 8 * (g & 1) : 0;
    constexpr int kWords = DIMSPLIT ? 2 : 4;  // 32-bit words of e4m3 a row this thread reads
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int r = 16 * kk + 2 * c;
      uint32_t a0[kWords], a1[kWords], a2[kWords], a3[kWords];
      auto row_words = [&](uint32_t (&dst)[kWords], int row, int sw) {
        const uint32_t addr = vbase + row * 128 + ((vunit ^ sw) << 4) + vbyte;
        if constexpr (DIMSPLIT) {
          const uint2 x = lds64(addr);
          dst[0] = row < live ? x.x : 0u;
          dst[1] = row < live ? x.y : 0u;
        } else {
          const uint4 x = lds128(addr);
          dst[0] = row < live ? x.x : 0u;
          dst[1] = row < live ? x.y : 0u;
          dst[2] = row < live ? x.z : 0u;
          dst[3] = row < live ? x.w : 0u;
        }
      };
      row_words(a0, r, 2 * c);
      row_words(a1, r + 1, 2 * c + 1);
      row_words(a2, r + 8, 2 * c);
      row_words(a3, r + 9, 2 * c + 1);
      uint32_t va[kMT][4];  // [M-tile i][A reg]
      widen_vt<kWords>(a0, a1, a2, a3, va);
      if (kk == 3) {  // every V row of the stage this warp reads is in registers: hand the stage back
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_empty + 8 * su);
      }
      if (kk >= 1) wgmma_wait<0>();  // k-step kk - 1's products are done (one k-step's A registers in flight)
      wgmma_fence();
#pragma unroll
      for (int i = 0; i < kMT; ++i) {
        if constexpr (DIMSPLIT)
          wgmma_pv64(o[i], va[i], desc_at(dp, 32 * kk));
        else
          wgmma_pv32(o[i], va[i], desc_at(dp, 32 * kk));
      }
      wgmma_commit();
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kMT; ++i) fence_regs(o[i]);
  };

  // The two consumers take turns to issue their score products (named barriers 3 and 4, both warpgroups' 256
  // threads: one waits, the other arrives), so that one's softmax runs while the other's products do (1-2% faster
  // on the H100 than letting them run free); the first turn is warpgroup 0's, and each turn handed over is taken
  // (warpgroup 1 hands none over after its last tile).
  if (kTokProbe != 2 && k == 1 && ntiles > 0) named_bar_arrive(3, 256);

  for (int t = 0; t < ntiles; ++t) {
    const int s = t % kWideStages, par = DIMSPLIT ? t & 1 : 0;
    const uint32_t stage = sbase + L::kStage + s * kStageBytes;
    uint8_t* psm = smem + L::kP + par * 2 * kWidePBytes + k * kWidePBytes;  // this warpgroup's P^T rows
    mbar_wait(bar_full + 8 * s, (t / kWideStages) & 1);  // tile t has landed
    if constexpr (kTokProbe == 2) {
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_empty + 8 * s);
      continue;
    }

    float sc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) sc[i] = 0.f;
    named_bar_sync(3 + k, 256);  // this warpgroup's turn
    if constexpr (kTokProbe == 5) {
      if (k == 0 || t + 1 < ntiles) named_bar_arrive(4 - k, 256);
    } else {
      score_tile64(sc, desc_words<1>(stage, 1024), desc_words<2>(stage + kRope, 512), dq, dqr,
                   k == 0 || t + 1 < ntiles ? 4 - k : 0);
    }

    // sv[4j + f]: token row 16w + g + 8 (f >> 1), head 8j + 2c + (f & 1)
    const int live = end - (start + t * kBN);  // rows at or past `live` lie past the slice's end
    const bool live0 = 16 * w + g < live, live1 = 16 * w + g + 8 < live;
    float sv[16], p[16];
    bool grow = false;
    if constexpr (kTokProbe == 3) {
#pragma unroll
      for (int q = 0; q < 16; ++q) sv[q] = p[q] = 0.f;
    } else {
      grow = tile_scores<4>(sc, sv, m_ref, s_eff, live0, live1);
      store_p<4>(p, sv, m_ref, psm, w, g, c);  // with the reference max as it stands: kept unless a score outgrew it
    }
    const bool moved = kTokProbe == 3 || kTokProbe == 7 ? false : warpgroup_any(bar_id, grow);
    if (DIMSPLIT && ctid == 0) xflag[2 * par + k] = moved;
    if (moved) {
      // Rare: the tile's exact max per head (the 4 warps' maxima through shared memory), rescale, P again.
      float mx[8];
      warp_head_max<4>(sv, mx);
      if (g == 0) {
#pragma unroll
        for (int hh = 0; hh < 8; ++hh) red[kWideHeads * w + 8 * (hh >> 1) + 2 * c + (hh & 1)] = mx[hh];
      }
      named_bar_sync(bar_id, 128);
      float alpha[8];
#pragma unroll
      for (int hh = 0; hh < 8; ++hh) {
        const int n = 8 * (hh >> 1) + 2 * c + (hh & 1);
        const float tm = fmaxf(fmaxf(red[n], red[kWideHeads + n]), fmaxf(red[2 * kWideHeads + n], red[3 * kWideHeads + n]));
        const float m_new = fmaxf(m_ref[hh], tm);
        alpha[hh] = m_ref[hh] == -kInf ? 1.f : fast_exp2(m_ref[hh] - m_new);
        m_ref[hh] = m_new;
        l_run[hh] *= alpha[hh];
        if (DIMSPLIT && w == 0 && g == 0) xalpha[64 * par + kWideHeads * k + n] = alpha[hh];  // for both consumers
      }
      if constexpr (!DIMSPLIT) {
#pragma unroll
        for (int i = 0; i < kMT; ++i)
#pragma unroll
          for (int q = 0; q < kNC; ++q) o[i][q] *= alpha[2 * (q >> 2) + (q & 1)];
      }
      store_p<4>(p, sv, m_ref, psm, w, g, c);
      named_bar_sync(bar_id, 128);  // P rewritten; red read by everyone
    }
#pragma unroll
    for (int q = 0; q < 16; ++q) l_run[2 * (q >> 2) + (q & 1)] += p[q];
    if constexpr (DIMSPLIT && kTokProbe != 8) named_bar_sync(5, 256);  // both consumers' P^T, flags, factors written
    pv_tile(t);
  }

  // Epilogue: the sums over the tile's 64 rows (lanes g, then the 4 warps), then this warpgroup's partials.
  named_bar_sync(bar_id, 128);  // red free
#pragma unroll
  for (int hh = 0; hh < 8; ++hh) {
#pragma unroll
    for (int o2 = 4; o2 < 32; o2 <<= 1) l_run[hh] += __shfl_xor_sync(0xffffffffu, l_run[hh], o2);
  }
  if (g == 0) {
#pragma unroll
    for (int hh = 0; hh < 8; ++hh) red[kWideHeads * w + 8 * (hh >> 1) + 2 * c + (hh & 1)] = l_run[hh];
  }
  named_bar_sync(bar_id, 128);
#pragma unroll
  for (int hh = 0; hh < 8; ++hh) {
    const int n = 8 * (hh >> 1) + 2 * c + (hh & 1), head = h0 + n;
    const float l = (red[n] + red[kWideHeads + n]) + (red[2 * kWideHeads + n] + red[3 * kWideHeads + n]);
    if (DIMSPLIT && w == 0 && g == 0) xl[kWideHeads * k + n] = l;  // for the other consumer's dims
    if (head >= H) continue;
    const long long slot = (b * H + head) * S + split;
    if (w == 0 && g == 0) a.part_lse[slot] = l > 0.f ? m_ref[hh] + log2f(l) : -kInf;
    if constexpr (!DIMSPLIT) {
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int j = hh >> 1, e = hh & 1;
      uint32_t u[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) u[i] = pack_f16x2(o[i][4 * j + e] * inv, o[i][4 * j + 2 + e] * inv);  // dims 2i, 2i+1
      uint4* dst = reinterpret_cast<uint4*>(a.part + slot * 512 + 128 * w + 16 * g);
      dst[0] = make_uint4(u[0], u[1], u[2], u[3]);
      dst[1] = make_uint4(u[4], u[5], u[6], u[7]);
    }
  }
  if constexpr (DIMSPLIT) {  // this consumer's 256 dims of the block's 64 heads (this thread's 16)
    named_bar_sync(5, 256);  // both consumers' sums are written
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = 8 * j + 2 * c + e, head = 64 * blockIdx.x + n;
        if (head >= H) continue;
        const float l = xl[n], inv = l > 0.f ? 1.f / l : 0.f;
        uint32_t u[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) u[i] = pack_f16x2(o[i][4 * j + e] * inv, o[i][4 * j + 2 + e] * inv);  // dims 2i, 2i+1
        *reinterpret_cast<uint4*>(a.part + ((b * H + head) * S + split) * 512 + 256 * k + 64 * w + 8 * g) =
            make_uint4(u[0], u[1], u[2], u[3]);
      }
  }
}

// Host side, both launchers: the arguments the two kernels share.
Args make_args(const void* q, const void* kv, const void* table, const void* lens, void* part, void* part_lse,
               long long stride_qb, long long stride_qh, long long stride_page, long long stride_slot,
               long long stride_tb, int num_heads, int num_splits, int page_size, float qk_scale) {
  Args a{};
  a.q = static_cast<const uint16_t*>(q);
  a.kv = static_cast<const uint8_t*>(kv);
  a.table = static_cast<const int*>(table);
  a.lens = static_cast<const int*>(lens);
  a.part = static_cast<__half*>(part);
  a.part_lse = static_cast<float*>(part_lse);
  a.stride_qb = stride_qb;
  a.stride_qh = stride_qh;
  a.stride_page = stride_page;
  a.stride_slot = stride_slot;
  a.stride_tb = stride_tb;
  a.num_heads = num_heads;
  a.num_splits = num_splits;
  a.page_size = page_size;
  a.page_shift = (page_size & (page_size - 1)) == 0 ? __builtin_ctz(page_size) : -1;
  a.box_rows = page_size < kBN ? page_size : kBN;
  a.qk_scale = qk_scale;
  return a;
}

// Whether TMA can copy the cache's 64-token tiles (pages of 16, 32 or a multiple of 64 slots, 16-byte aligned rows
// and strides); with `a`, also encodes its two tensor maps there (false where that fails).
bool tma_pages(Args* a, const void* kv, int page_size, long long stride_page, long long stride_slot,
               long long num_pages) {
  if (!((page_size % kBN == 0 || page_size == 16 || page_size == 32) && reinterpret_cast<uintptr_t>(kv) % 16 == 0 &&
        stride_slot % 16 == 0 && stride_page % 16 == 0 && encode_fn() != nullptr))
    return false;
  if (a == nullptr) return true;
  return encode_map(&a->tm_lat, kv, num_pages, page_size, stride_slot, stride_page, 576, 128,
                    CU_TENSOR_MAP_SWIZZLE_128B, a->box_rows) &&
         encode_map(&a->tm_rope, kv, num_pages, page_size, stride_slot, stride_page, 576, 64,
                    CU_TENSOR_MAP_SWIZZLE_64B, a->box_rows);
}

template <int STAGES, bool TMA, bool CLUSTER>
int prepare(int* regs, int* per_sm, int* smem_bytes) {
  auto kernel = mla_decode_tok_sm90<STAGES, TMA, CLUSTER>;
  constexpr int smem = Layout<STAGES>::kAlloc;
  *smem_bytes = smem;
  return prepare_kernel(kernel, kThreads, smem, regs, per_sm);
}

template <int STAGES, bool TMA>
int launch(const Args& a, int batch, cudaStream_t stream) {
  constexpr int smem = Layout<STAGES>::kAlloc;
  mla_decode_tok_sm90<STAGES, TMA, false><<<dim3(a.num_splits, batch), kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

// The cluster combine: grid (S, B) in clusters of (S, 1, 1), one per sequence.
template <int STAGES, bool TMA>
cudaLaunchConfig_t cluster_config(int splits, int batch, cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(splits, batch, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = Layout<STAGES>::kAlloc;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = splits;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

template <int STAGES, bool TMA>
int launch_cluster(const Args& a, int batch, cudaStream_t stream) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = cluster_config<STAGES, TMA>(a.num_splits, batch, stream, attr);
  const cudaError_t err = cudaLaunchKernelEx(&cfg, mla_decode_tok_sm90<STAGES, TMA, true>, a);
  return err != cudaSuccess ? err : cudaGetLastError();
}

template <int STAGES, bool TMA>
int max_clusters(int splits, int* out) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = cluster_config<STAGES, TMA>(splits, 1, nullptr, attr);
  return cudaOccupancyMaxActiveClusters(out, mla_decode_tok_sm90<STAGES, TMA, true>, &cfg);
}

}  // namespace

// Variants: 0 = loads by TMA where the page size allows it (16, 32 or a multiple of 64 slots, 16-byte strides),
// else cp.async; 1 = cp.async always. Returns a cudaError_t (cudaErrorInvalidValue for an unknown variant).
// max_inline_splits: the most splits the in-kernel combine takes.
extern "C" int dg_mla_tok_prepare(int variant, int* regs, int* per_sm, int* block_n, int* smem_bytes,
                                  int* max_inline_splits) {
  *block_n = kBN;
  *max_inline_splits = kMaxInlineSplits;
  if (variant != 0 && variant != 1) return cudaErrorInvalidValue;
  int err = cudaSuccess;
  if (variant == 0) {
    err = prepare<2, true, true>(regs, per_sm, smem_bytes);
    if (err == cudaSuccess) err = prepare<2, true, false>(regs, per_sm, smem_bytes);
    if (err != cudaSuccess) return err;
  }
  err = prepare<2, false, true>(regs, per_sm, smem_bytes);
  return err != cudaSuccess ? err : prepare<2, false, false>(regs, per_sm, smem_bytes);
}

// How many clusters of `splits` CTAs (the cluster combine) fit on the device at once; 0 where none.
extern "C" int dg_mla_tok_max_clusters(int variant, int splits, int* out) {
  *out = 0;
  if (splits < 1 || splits > kMaxClusterSplits) return cudaErrorInvalidValue;
  if (variant == 0) return max_clusters<2, true>(splits, out);
  if (variant == 1) return max_clusters<2, false>(splits, out);
  return cudaErrorInvalidValue;
}

// Returns a cudaError_t; *used_tma says which loads ran.
extern "C" int dg_mla_tok_launch(int variant, const void* q, const void* kv, const void* table, const void* lens,
                                 void* part, void* part_lse, void* out, void* lse, void* counters,
                                 long long stride_qb, long long stride_qh, long long stride_page,
                                 long long stride_slot, long long stride_tb, long long stride_ob,
                                 long long stride_oh, int num_heads, int num_splits, int batch, int page_size,
                                 long long num_pages, float qk_scale, float out_scale, void* stream, int* used_tma,
                                 int cluster, int table_span) {
  *used_tma = 0;
  if (num_heads < 1 || num_heads > 16 || (counters != nullptr && num_splits > kMaxInlineSplits))
    return cudaErrorInvalidValue;
  if (cluster && (counters != nullptr || num_splits < 1 || num_splits > kMaxClusterSplits))
    return cudaErrorInvalidValue;
  if (variant != 0 && variant != 1) return cudaErrorInvalidValue;
  Args a = make_args(q, kv, table, lens, part, part_lse, stride_qb, stride_qh, stride_page, stride_slot, stride_tb,
                     num_heads, num_splits, page_size, qk_scale);
  a.out = static_cast<uint16_t*>(out);
  a.lse = static_cast<float*>(lse);
  a.counters = static_cast<int*>(counters);
  a.stride_ob = stride_ob;
  a.stride_oh = stride_oh;
  a.span = table_span;
  a.out_scale = out_scale;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (variant == 0 && tma_pages(&a, kv, page_size, stride_page, stride_slot, num_pages)) {
    *used_tma = 1;
    return cluster ? launch_cluster<2, true>(a, batch, st) : launch<2, true>(a, batch, st);
  }
  return cluster ? launch_cluster<2, false>(a, batch, st) : launch<2, false>(a, batch, st);
}

// The many-head kernel (17+ heads, 64 per CTA): registers, CTAs per SM, tile tokens and shared memory.
extern "C" int dg_mla_tokw_prepare(int* regs, int* per_sm, int* block_n, int* smem_bytes) {
  *block_n = kBN;
  *smem_bytes = WideLayout::kAlloc;
  for (auto kernel : {mla_decode_tok_wide_sm90<false>, mla_decode_tok_wide_sm90<true>}) {
    const int err = prepare_kernel(kernel, kWideThreads, WideLayout::kAlloc, regs, per_sm);
    if (err != cudaSuccess) return err;
    // setmaxnreg.inc waits until the CTA's registers allow it: a build with fewer per thread would hang
    if (*regs * kWideThreads < kWideProducerRegs * 128 + kWideConsumerRegs * 256) return cudaErrorInvalidConfiguration;
  }
  return cudaSuccess;
}

// Whether the many-head kernel takes this cache: its loads are TMA only (pages of 16, 32 or a multiple of 64 slots,
// 16-byte aligned rows and strides).
extern "C" int dg_mla_tokw_applies(const void* kv, int page_size, long long stride_page, long long stride_slot) {
  return tma_pages(nullptr, kv, page_size, stride_page, stride_slot, 0);
}

// fp16 partials [B, H, S, 512] (sum(p v) / sum(p) in cache units) and their log2-sum-exp [B, H, S] for the Triton
// merge, also for one split. Returns a cudaError_t (cudaErrorInvalidValue where the cache cannot be read by TMA).
extern "C" int dg_mla_tokw_launch(const void* q, const void* kv, const void* table, const void* lens, void* part,
                                  void* part_lse, long long stride_qb, long long stride_qh, long long stride_page,
                                  long long stride_slot, long long stride_tb, int num_heads, int num_splits,
                                  int batch, int page_size, long long num_pages, float qk_scale, int dimsplit,
                                  void* stream) {
  if (num_heads < 1 || num_splits < 1) return cudaErrorInvalidValue;
  Args a = make_args(q, kv, table, lens, part, part_lse, stride_qb, stride_qh, stride_page, stride_slot, stride_tb,
                     num_heads, num_splits, page_size, qk_scale);
  if (!tma_pages(&a, kv, page_size, stride_page, stride_slot, num_pages)) return cudaErrorInvalidValue;
  const dim3 grid((num_heads + 63) / 64, num_splits, batch);
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (dimsplit)
    mla_decode_tok_wide_sm90<true><<<grid, kWideThreads, WideLayout::kAlloc, st>>>(a);
  else
    mla_decode_tok_wide_sm90<false><<<grid, kWideThreads, WideLayout::kAlloc, st>>>(a);
  return cudaGetLastError();
}
